// comm/net/auth.h: proving that both ends of a connection know the job's
// secret without sending it (HMAC-SHA256 over a nonce from each side,
// through OpenSSL's libcrypto), and the job identity that tells a rank of
// another job apart before any secret is involved.
//
// The exchange, on the store's connections and on the TCP mesh's:
//   client -> server: hello (who, job identity, client nonce)
//   server -> client: server nonce, MAC("server", hello, server nonce)
//   client -> server: MAC("client", hello, server nonce)
//   server -> client: ok | refused
// Each side's MAC covers the other side's fresh nonce, so a recorded
// exchange replayed later fails (the server draws a new nonce), and neither
// side can be impersonated by one that lacks the secret. The comparison is
// constant-time. What this does not give: privacy (the traffic after the
// handshake is in clear) or protection from a man in the middle who takes
// over an authenticated connection (the connection is not bound to a
// session key). docs/architecture.md ("Authentication") says more.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

namespace collie::auth {

constexpr size_t kNonceBytes = 32;
constexpr size_t kMacBytes = 32;
using Nonce = std::array<uint8_t, kNonceBytes>;
using Mac = std::array<uint8_t, kMacBytes>;

// Fresh random bytes from the system's CSPRNG (OpenSSL's RAND_bytes).
Nonce fresh_nonce();

// HMAC-SHA256 under `key` over the parts, each prefixed by its length so
// that no two lists of parts give the same input.
Mac mac(std::string_view key, std::initializer_list<std::string_view> parts);

// Whether `got` is exactly `want`, in time that does not depend on where
// they differ.
bool same(const Mac& want, std::string_view got);

// SHA-256 of `s`, as 64 hex digits: a fixed-size name for a job identity.
std::string digest_hex(std::string_view s);

inline std::string_view view(const Nonce& n) {
  return {reinterpret_cast<const char*>(n.data()), n.size()};
}

}  // namespace collie::auth
