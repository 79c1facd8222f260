// base/state_bytes.h: the checkpoint encoding that the reducer, the comm
// hooks and the model averagers share: unsigned 64-bit integers, little-endian,
// and length-prefixed byte strings, read back with bounds checks.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "collie/error.h"
#include "collie/store.h"

namespace collie {

inline void put_u64(Bytes& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

inline void put_bytes(Bytes& out, const Bytes& b) {
  put_u64(out, b.size());
  out.insert(out.end(), b.begin(), b.end());
}

// Reads what put_u64 / put_bytes wrote; reading past the end is an
// invalid_argument error with `truncated` as its message.
class StateReader {
 public:
  StateReader(const Bytes& in, std::string truncated) : in_(in), truncated_(std::move(truncated)) {}

  uint64_t u64() {
    need(8);
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(in_[at_ + i]) << (8 * i);
    at_ += 8;
    return v;
  }
  Bytes bytes() {
    uint64_t n = u64();
    need(n);
    Bytes b(in_.begin() + static_cast<long>(at_), in_.begin() + static_cast<long>(at_ + n));
    at_ += n;
    return b;
  }
  // What has not been read yet.
  size_t remaining() const { return in_.size() - at_; }
  Bytes rest() const { return Bytes(in_.begin() + static_cast<long>(at_), in_.end()); }

 private:
  void need(uint64_t n) {
    if (n > in_.size() - at_) throw Error(ErrorCode::invalid_argument, truncated_);
  }
  const Bytes& in_;
  std::string truncated_;
  size_t at_ = 0;
};

}  // namespace collie
