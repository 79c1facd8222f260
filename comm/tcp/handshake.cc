// comm/tcp/handshake.cc: the TCP mesh's handshake (comm/tcp/handshake.h).
#include "comm/tcp/handshake.h"

#include <cstring>

namespace collie::tcp {

namespace {

template <typename T>
std::string_view bytes_of(const T& v) {
  return {reinterpret_cast<const char*>(&v), sizeof v};
}

auth::Mac mesh_mac(const HandshakeKeys& k, std::string_view side, const Hello& h,
                   std::string_view acceptor_nonce) {
  return auth::mac(k.secret, {"collie-mesh-3", side, k.job, bytes_of(h), acceptor_nonce});
}

}  // namespace

Hello make_hello(int from, int to, int lane, int lanes, const std::string& key,
                 const auth::Nonce& nonce) {
  Hello h{};
  h.magic = kHelloMagic;
  h.version = kHelloVersion;
  h.from = from;
  h.to = to;
  h.lane = static_cast<int16_t>(lane);
  h.lanes = static_cast<int16_t>(lanes);
  std::strncpy(h.key, key.c_str(), sizeof h.key - 1);
  std::memcpy(h.nonce, nonce.data(), nonce.size());
  return h;
}

auth::Mac acceptor_mac(const HandshakeKeys& k, const Hello& h, std::string_view acceptor_nonce) {
  return mesh_mac(k, "acceptor", h, acceptor_nonce);
}

auth::Mac connector_mac(const HandshakeKeys& k, const Hello& h, std::string_view acceptor_nonce) {
  return mesh_mac(k, "connector", h, acceptor_nonce);
}

char* AcceptorHandshake::into() {
  return (challenged_ ? reinterpret_cast<char*>(proof_) : reinterpret_cast<char*>(&hello_)) + got_;
}

size_t AcceptorHandshake::want() const {
  return (challenged_ ? sizeof proof_ : sizeof hello_) - got_;
}

AcceptorHandshake::Step AcceptorHandshake::advance(size_t got) {
  got_ += got;
  if (want() > 0) return Step::reading;
  if (!challenged_) {
    const Hello& h = hello_;
    bool ok = h.magic == kHelloMagic && h.version == kHelloVersion && h.to == rank_ &&
              h.from > rank_ && h.from < n_ && h.lane >= 0 && h.lanes > 0 &&
              std::string_view(h.key, strnlen(h.key, sizeof h.key)) == key_;
    if (!ok) return Step::stranger;
    std::memcpy(challenge_.nonce, nonce_.data(), nonce_.size());
    const auth::Mac m = acceptor_mac(*keys_, h, auth::view(nonce_));
    std::memcpy(challenge_.mac, m.data(), m.size());
    challenged_ = true;
    got_ = 0;
    return Step::challenge;
  }
  if (!auth::same(connector_mac(*keys_, hello_, auth::view(nonce_)), bytes_of(proof_)))
    return Step::unproved;
  return Step::proved;
}

bool acceptor_proved(const HandshakeKeys& k, const Hello& h, const Challenge& ch) {
  return auth::same(acceptor_mac(k, h, bytes_of(ch.nonce)), bytes_of(ch.mac));
}

}  // namespace collie::tcp
