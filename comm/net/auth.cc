// comm/net/auth.cc: HMAC-SHA256, nonces and digests over OpenSSL's libcrypto.
#include "comm/net/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "collie/error.h"

namespace collie::auth {

Nonce fresh_nonce() {
  Nonce n;
  if (RAND_bytes(n.data(), static_cast<int>(n.size())) != 1)
    throw Error(ErrorCode::internal, "the system's random number generator failed (RAND_bytes)");
  return n;
}

Mac mac(std::string_view key, std::initializer_list<std::string_view> parts) {
  std::string in;
  for (auto p : parts) {
    uint64_t len = p.size();
    for (int i = 0; i < 8; ++i) in.push_back(static_cast<char>((len >> (8 * i)) & 0xff));
    in.append(p);
  }
  Mac out;
  unsigned int n = 0;
  // HMAC accepts an empty key (a job without a secret still binds the
  // exchange to its nonces and identity).
  static const unsigned char kEmpty = 0;
  const void* k = key.empty() ? static_cast<const void*>(&kEmpty) : key.data();
  if (!HMAC(EVP_sha256(), k, static_cast<int>(key.size()),
            reinterpret_cast<const unsigned char*>(in.data()), in.size(), out.data(), &n) ||
      n != out.size())
    throw Error(ErrorCode::internal, "HMAC-SHA256 failed in OpenSSL");
  return out;
}

bool same(const Mac& want, std::string_view got) {
  if (got.size() != want.size()) return false;
  return CRYPTO_memcmp(want.data(), got.data(), want.size()) == 0;
}

std::string digest_hex(std::string_view s) {
  unsigned char d[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (EVP_Digest(s.data(), s.size(), d, &n, EVP_sha256(), nullptr) != 1)
    throw Error(ErrorCode::internal, "SHA-256 failed in OpenSSL");
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < n; ++i) {
    out.push_back(hex[d[i] >> 4]);
    out.push_back(hex[d[i] & 15]);
  }
  return out;
}

}  // namespace collie::auth
