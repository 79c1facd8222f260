// comm/tcp/handshake.h: the first bytes on every TCP mesh connection, and
// what each side makes of the other's, apart from the sockets
// (comm/tcp/tcp_backend.cc moves the bytes; tests/fuzz/fuzz_handshake.cc
// runs these on any bytes).
//
// The connector sends a Hello: who is calling, for which communicator,
// which of its connections to this rank it is (`lane` of `lanes`), and a
// fresh nonce. Fixed size, so that a stray client's garbage is read in one
// bounded piece and refused. The acceptor answers with a Challenge (its
// nonce and its proof that it knows the job secret), the connector with its
// own proof, and the acceptor with kAck: the exchange of comm/net/auth.h,
// with the hello's bytes and the job identity under both MACs.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "comm/net/auth.h"

namespace collie::tcp {

struct Hello {
  uint32_t magic;
  uint32_t version;
  int32_t from;
  int32_t to;
  int16_t lane;
  int16_t lanes;
  char key[108];
  uint8_t nonce[auth::kNonceBytes];
};
static_assert(sizeof(Hello) == 160);
struct Challenge {
  uint8_t nonce[auth::kNonceBytes];
  uint8_t mac[auth::kMacBytes];
};
constexpr uint32_t kHelloMagic = 0x434c4c48;  // "CLLH"
constexpr uint32_t kHelloVersion = 3;
constexpr char kAck[4] = {'c', 'o', 'k', '1'};

// What both sides share: the job's secret and identity.
struct HandshakeKeys {
  std::string secret;
  std::string job;
};

Hello make_hello(int from, int to, int lane, int lanes, const std::string& key,
                 const auth::Nonce& nonce);

// The acceptor's and the connector's proofs: distinct labels, so that
// neither can be reflected back as the other's.
auth::Mac acceptor_mac(const HandshakeKeys& k, const Hello& h, std::string_view acceptor_nonce);
auth::Mac connector_mac(const HandshakeKeys& k, const Hello& h, std::string_view acceptor_nonce);

// The acceptor's side of one connection, fed the bytes as they arrive: the
// hello, then (once the challenge is out) the connector's proof.
class AcceptorHandshake {
 public:
  enum class Step {
    reading,    // wants more bytes (into(), up to want())
    challenge,  // the hello is one of this communicator's: send challenge()
    proved,     // the connector proved that it knows the secret: hello() is its
    stranger,   // refused: the hello is not from a rank of this communicator
    unproved,   // refused: a hello of this communicator, but not the proof
  };
  // For rank `rank` of `n` on communicator `key`, answering with `nonce`;
  // `keys` must outlive it.
  AcceptorHandshake(const HandshakeKeys& keys, int rank, int n, std::string key,
                    const auth::Nonce& nonce)
      : keys_(&keys), rank_(rank), n_(n), key_(std::move(key)), nonce_(nonce) {}

  char* into();
  size_t want() const;  // bytes still wanted for the current piece
  // `got` more bytes were read into into(): what is to be done.
  Step advance(size_t got);

  const Hello& hello() const { return hello_; }
  std::string_view challenge() const {
    return {reinterpret_cast<const char*>(&challenge_), sizeof challenge_};
  }
  bool challenged() const { return challenged_; }

 private:
  const HandshakeKeys* keys_;  // outlives this
  int rank_, n_;
  std::string key_;
  auth::Nonce nonce_;
  Hello hello_{};
  Challenge challenge_{};
  uint8_t proof_[auth::kMacBytes]{};
  size_t got_ = 0;
  bool challenged_ = false;
};

// The connector's check of the acceptor's challenge: true when it proves
// that the acceptor knows the secret, for this very hello.
bool acceptor_proved(const HandshakeKeys& k, const Hello& h, const Challenge& ch);

}  // namespace collie::tcp
