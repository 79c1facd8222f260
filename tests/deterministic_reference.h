// tests/deterministic_reference.h: the reference of COLLIE_DETERMINISTIC's
// all-reduce (comm/deterministic.h), computed serially here in plain C++:
// element i is ((x0 + x1) + x2) + ... in rank order, in the dtype's own
// arithmetic (f16 and bf16 in float, rounded once at the end; avg divides
// at the last step), and the inputs, with magnitudes spread over many
// binades so that any other order gives other bits.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "base/element.h"
#include "base/reduce.h"
#include "collie/comm.h"
#include "mp_common.h"

namespace collie::testing {

// Rank r's input of `count` elements of `t` (any rank can make any rank's).
inline std::vector<uint8_t> det_input(DType t, ReduceOp op, int r, size_t count, uint32_t seed) {
  std::vector<uint8_t> v(count * dtype_size(t));
  std::mt19937 rng(seed * 7919u + static_cast<uint32_t>(r) * 104729u + static_cast<uint32_t>(t));
  std::uniform_real_distribution<double> u(-1, 1);
  std::uniform_int_distribution<int> e(-8, 8), small(-100, 100), tiny(-2, 2);
  for (size_t i = 0; i < count; ++i) {
    double x;
    if (!is_floating(t))
      x = op == ReduceOp::prod ? tiny(rng) : small(rng);  // a product of 8 fits an i32
    else if (op == ReduceOp::prod)
      x = std::ldexp(1.0 + 0.5 * u(rng), e(rng) / 4);  // no overflow over 8 ranks
    else
      x = std::ldexp(u(rng), e(rng));
    put_element(t, v.data(), i, x);
  }
  return v;
}

// The serial reference over every rank's input (inputs[q]: rank q's).
template <typename A>
void fold(DType t, ReduceOp op, const std::vector<std::vector<uint8_t>>& inputs, size_t count,
          uint8_t* out) {
  const int n = static_cast<int>(inputs.size());
  for (size_t i = 0; i < count; ++i) {
    auto x = [&](int q) { return static_cast<A>(get_element(t, inputs[q].data(), i)); };
    A acc = x(0);
    for (int q = 1; q < n; ++q)
      acc = op == ReduceOp::avg && q == n - 1 ? (acc + x(q)) / static_cast<A>(n)
                                              : combine(op, acc, x(q));
    switch (t) {
      case DType::f16:
        reinterpret_cast<uint16_t*>(out)[i] = kernels::float_to_half(static_cast<float>(acc));
        break;
      case DType::bf16:
        reinterpret_cast<uint16_t*>(out)[i] = kernels::float_to_bf16(static_cast<float>(acc));
        break;
      default:
        std::memcpy(out + i * dtype_size(t), &acc, dtype_size(t));
    }
  }
}

inline std::vector<uint8_t> det_reference(DType t, ReduceOp op,
                                          const std::vector<std::vector<uint8_t>>& inputs,
                                          size_t count) {
  std::vector<uint8_t> out(count * dtype_size(t));
  switch (t) {
    case DType::f64:
      fold<double>(t, op, inputs, count, out.data());
      break;
    case DType::i32:
      fold<int32_t>(t, op, inputs, count, out.data());
      break;
    case DType::i64:
      fold<int64_t>(t, op, inputs, count, out.data());
      break;
    case DType::u8:
      fold<uint8_t>(t, op, inputs, count, out.data());
      break;
    case DType::i8:
      fold<int8_t>(t, op, inputs, count, out.data());
      break;
    default:  // f32, and f16 and bf16 accumulated in float
      fold<float>(t, op, inputs, count, out.data());
  }
  return out;
}

constexpr DType kDetDTypes[] = {DType::f32,  DType::f64, DType::f16,
                                DType::bf16, DType::i32, DType::i8};
constexpr ReduceOp kDetOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::prod, ReduceOp::min,
                                ReduceOp::max};

inline std::string det_where(const char* what, DType t, ReduceOp op, size_t count, bool in_place) {
  return std::string(what) + " " + std::string(to_string(t)) + " " + std::string(to_string(op)) +
         " x " + std::to_string(count) + (in_place ? " in place" : "");
}

// Every rank checks its results against the reference; returns the first
// difference it found.
inline std::string check_deterministic(Communicator& c, const std::vector<size_t>& counts) {
  const int n = c.size(), r = c.rank();
  for (DType t : kDetDTypes)
    for (ReduceOp op : kDetOps) {
      if (op == ReduceOp::avg && !is_floating(t)) continue;
      for (size_t count : counts) {
        const size_t es = dtype_size(t);
        std::vector<std::vector<uint8_t>> in;
        for (int q = 0; q < n; ++q) in.push_back(det_input(t, op, q, count * n, 11));
        // All-reduce of the first `count` elements, out of place and in place.
        std::vector<std::vector<uint8_t>> firsts;
        for (auto& v : in) firsts.emplace_back(v.begin(), v.begin() + count * es);
        const auto want = det_reference(t, op, firsts, count);
        for (bool in_place : {false, true}) {
          std::vector<uint8_t> buf = firsts[r], out(count * es);
          TensorView i{buf.data(), t, count, Device::cpu()};
          TensorView o{in_place ? buf.data() : out.data(), t, count, Device::cpu()};
          c.allreduce(i, o, op).wait();
          if (std::memcmp(o.data, want.data(), want.size()) != 0)
            return det_where("allreduce", t, op, count, in_place) + ": not the rank-order sum";
        }
        // Reduce-scatter of count x n: block r of the whole reference.
        const auto whole = det_reference(t, op, in, count * n);
        std::vector<uint8_t> out(count * es);
        c.reduce_scatter(TensorView{in[r].data(), t, count * n, Device::cpu()},
                         TensorView{out.data(), t, count, Device::cpu()}, op)
            .wait();
        if (std::memcmp(out.data(), whole.data() + r * count * es, out.size()) != 0)
          return det_where("reduce_scatter", t, op, count, false) + ": not the rank-order sum";
      }
    }
  return "";
}

}  // namespace collie::testing
