// tests/mp_common.h: what the multi-process tests share: deterministic
// per-rank inputs that every rank can recompute for every other rank, so each
// rank checks its result against a serial float64 reference, and typed
// element access for any dtype.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "base/element.h"
#include "base/reduce.h"
#include "collie/types.h"

namespace collie::testing {

using collie::get_element;
using collie::put_element;
inline void put(DType t, void* buf, size_t i, double v) {
  put_element(t, buf, i, v);
}
inline double get(DType t, const void* buf, size_t i) {
  return get_element(t, buf, i);
}

// Small integers and quarter steps: exact in every dtype, and sums,
// products, minima and maxima of up to 4 ranks stay exact too (products are
// kept to {1, 2} so that 4 ranks cannot overflow u8).
inline double exact_value(ReduceOp op, int rank, size_t i, uint64_t salt) {
  uint64_t h = (static_cast<uint64_t>(rank) * 1000003u + i * 7919u + salt * 104729u) % 9973u;
  if (op == ReduceOp::prod) return 1.0 + static_cast<double>(h % 2);
  return static_cast<double>(h % 11);
}

// Random values in [-1, 1): not representable exactly in narrow types, for
// the rounding tests. Seeded by rank so every rank can regenerate any rank's.
inline std::vector<double> random_values(int rank, size_t n, uint64_t seed) {
  std::mt19937_64 g(seed * 1315423911u + static_cast<uint64_t>(rank));
  std::uniform_real_distribution<double> d(-1.0, 1.0);
  std::vector<double> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// One step of op's serial reference, in the accumulator type A (double for
// the exact references, the dtype's own for the bitwise ones); avg sums.
template <typename A>
A combine(ReduceOp op, A a, A b) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      return a + b;
    case ReduceOp::prod:
      return a * b;
    case ReduceOp::min:
      return std::min(a, b);
    case ReduceOp::max:
      return std::max(a, b);
  }
  return A{};
}

// The value dtype t stores for v (what a rank actually contributes).
inline double rounded(DType t, double v) {
  uint8_t buf[8];
  put(t, buf, 0, v);
  return get(t, buf, 0);
}

}  // namespace collie::testing
