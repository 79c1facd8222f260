// tests/test_reduce.cc: base/reduce.h and the half-precision types: the
// f16 and bf16 encodings and rounding, every reduction kernel for every
// dtype and op, and the dtype conversions, against float64 references.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <vector>

#include "base/reduce.h"
#include "mp_common.h"

namespace collie {
namespace {

TEST(Half, KnownEncodings) {
  EXPECT_EQ(kernels::float_to_half(1.0f), 0x3c00);
  EXPECT_EQ(kernels::float_to_half(-2.0f), 0xc000);
  EXPECT_EQ(kernels::float_to_half(65504.0f), 0x7bff);
  EXPECT_EQ(kernels::float_to_half(65520.0f), 0x7c00);         // rounds up to inf
  EXPECT_EQ(kernels::float_to_half(0x1p-24f), 0x0001);         // smallest subnormal
  EXPECT_EQ(kernels::float_to_half(0x1p-25f), 0x0000);         // ties to even: 0
  EXPECT_EQ(kernels::float_to_half(1.0f + 0x1p-11f), 0x3c00);  // tie, to even
  EXPECT_EQ(kernels::float_to_half(1.0f + 0x1p-10f + 0x1p-11f), 0x3c02);
  EXPECT_TRUE(std::isnan(kernels::half_to_float(kernels::float_to_half(NAN))));
  EXPECT_EQ(kernels::half_to_float(0x0001), 0x1p-24f);
  EXPECT_EQ(kernels::half_to_float(0x7bff), 65504.0f);
}

TEST(Half, EveryHalfRoundTripsExactly) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = kernels::half_to_float(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(kernels::float_to_half(f), h) << std::hex << h;
  }
}

TEST(Half, RoundingIsToNearestAgainstDoubleReference) {
  std::mt19937 g(1);
  std::uniform_real_distribution<float> d(-70000.f, 70000.f);
  for (int k = 0; k < 200000; ++k) {
    float f = d(g) * (k % 3 == 0 ? 1e-6f : 1.0f);
    float r = kernels::half_to_float(kernels::float_to_half(f));
    if (std::isinf(r)) {
      EXPECT_GE(std::abs(f), 65520.0f);
      continue;
    }
    // No representable half is nearer: check the neighbours.
    uint16_t h = kernels::float_to_half(f);
    for (int delta : {-1, 1}) {
      float nb = kernels::half_to_float(static_cast<uint16_t>(h + delta));
      if (std::isnan(nb) || std::isinf(nb) || ((h + delta) & 0x7fff) == 0x7fff) continue;
      EXPECT_LE(std::abs(double(r) - f), std::abs(double(nb) - f) + 1e-30) << f;
    }
  }
}

TEST(BFloat16, KnownEncodingsAndRounding) {
  EXPECT_EQ(kernels::float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(kernels::float_to_bf16(-1.0f), 0xbf80);
  EXPECT_EQ(kernels::float_to_bf16(1.0f + 0x1p-8f), 0x3f80);            // tie, to even
  EXPECT_EQ(kernels::float_to_bf16(1.0f + 0x1p-7f + 0x1p-8f), 0x3f82);  // tie, to even
  EXPECT_EQ(kernels::bf16_to_float(0x4049), 3.140625f);
  EXPECT_TRUE(std::isnan(kernels::bf16_to_float(kernels::float_to_bf16(NAN))));
}

TEST(Kernels, EveryDtypeAndOpAgainstDoubleReference) {
  const size_t n = 3001;  // not a multiple of the f16 block
  for (int ti = 0; ti < kNumDTypes; ++ti)
    for (int oi = 0; oi < kNumReduceOps; ++oi) {
      DType t = static_cast<DType>(ti);
      ReduceOp op = static_cast<ReduceOp>(oi);
      if (!supports(op, t)) continue;
      size_t es = dtype_size(t);
      std::vector<uint8_t> a(n * es), b(n * es), out(n * es);
      for (size_t i = 0; i < n; ++i) {
        testing::put(t, a.data(), i, testing::exact_value(op, 0, i, 3));
        testing::put(t, b.data(), i, testing::exact_value(op, 1, i, 3));
      }
      int divisor = op == ReduceOp::avg ? 2 : 0;
      kernels::reduce(t, op, out.data(), a.data(), b.data(), n, divisor);
      for (size_t i = 0; i < n; ++i) {
        double want =
            testing::combine(op, testing::get(t, a.data(), i), testing::get(t, b.data(), i));
        if (divisor) want = testing::rounded(t, want / divisor);
        ASSERT_EQ(testing::get(t, out.data(), i), want)
            << to_string(t) << " " << to_string(op) << " at " << i;
      }
    }
}

// Integer sum and prod wrap around as the unsigned type of the same width
// does (two's complement), as NCCL's and MPI's integer reductions do in
// practice; signed overflow in C++ is undefined behaviour (UBSan's "signed
// integer overflow: 1 + 2147483647" before the fix).
TEST(Kernels, IntegerSumAndProdWrapAroundWithoutUndefinedBehaviour) {
  const int32_t a32[] = {INT32_MAX, INT32_MIN, INT32_MAX, -7};
  const int32_t b32[] = {1, -1, 2, 3};
  int32_t d32[4];
  kernels::reduce(DType::i32, ReduceOp::sum, d32, a32, b32, 4);
  EXPECT_EQ(d32[0], INT32_MIN);
  EXPECT_EQ(d32[1], INT32_MAX);
  EXPECT_EQ(d32[2], INT32_MIN + 1);
  EXPECT_EQ(d32[3], -4);
  kernels::reduce(DType::i32, ReduceOp::prod, d32, a32, b32, 4);
  EXPECT_EQ(d32[0], INT32_MAX);
  EXPECT_EQ(d32[1], INT32_MIN);  // -2^31 x -1 wraps to itself
  EXPECT_EQ(d32[2], -2);
  EXPECT_EQ(d32[3], -21);
  const int64_t a64[] = {INT64_MAX, INT64_MIN, INT64_MAX};
  const int64_t b64[] = {1, -1, 2};
  int64_t d64[3];
  kernels::reduce(DType::i64, ReduceOp::sum, d64, a64, b64, 3);
  EXPECT_EQ(d64[0], INT64_MIN);
  EXPECT_EQ(d64[1], INT64_MAX);
  EXPECT_EQ(d64[2], INT64_MIN + 1);
  kernels::reduce(DType::i64, ReduceOp::prod, d64, a64, b64, 3);
  EXPECT_EQ(d64[0], INT64_MAX);
  EXPECT_EQ(d64[1], INT64_MIN);
  EXPECT_EQ(d64[2], -2);
  const uint8_t a8[] = {255, 16}, b8[] = {1, 16};
  uint8_t d8[2];
  kernels::reduce(DType::u8, ReduceOp::sum, d8, a8, b8, 2);
  EXPECT_EQ(d8[0], 0);
  EXPECT_EQ(d8[1], 32);
  kernels::reduce(DType::u8, ReduceOp::prod, d8, a8, b8, 2);
  EXPECT_EQ(d8[0], 255);
  EXPECT_EQ(d8[1], 0);  // 256 wraps
  const int8_t ai8[] = {127, -128, 100, -3}, bi8[] = {1, -1, 100, 5};
  int8_t di8[4];
  kernels::reduce(DType::i8, ReduceOp::sum, di8, ai8, bi8, 4);
  EXPECT_EQ(di8[0], -128);
  EXPECT_EQ(di8[1], 127);
  EXPECT_EQ(di8[2], -56);  // 200 wraps, as torch's int8 and Gloo's do
  EXPECT_EQ(di8[3], 2);
  kernels::reduce(DType::i8, ReduceOp::prod, di8, ai8, bi8, 4);
  EXPECT_EQ(di8[0], 127);
  EXPECT_EQ(di8[1], -128);  // -2^7 x -1 wraps to itself
  EXPECT_EQ(di8[2], 16);    // 10000 = 39 x 256 + 16
  EXPECT_EQ(di8[3], -15);
}

// int8 is ordered as signed (a reduction in u8's order would take -1 for
// 255): min and max of negative and positive values.
TEST(Kernels, Int8MinAndMaxCompareSigned) {
  const int8_t a[] = {-1, 5, -128, 127}, b[] = {1, -5, 0, -128};
  int8_t lo[4], hi[4];
  kernels::reduce(DType::i8, ReduceOp::min, lo, a, b, 4);
  kernels::reduce(DType::i8, ReduceOp::max, hi, a, b, 4);
  EXPECT_EQ(std::vector<int>(lo, lo + 4), (std::vector<int>{-1, -5, -128, -128}));
  EXPECT_EQ(std::vector<int>(hi, hi + 4), (std::vector<int>{1, 5, 0, 127}));
  EXPECT_EQ(to_string(DType::i8), "i8");
  EXPECT_EQ(parse_dtype("int8"), DType::i8);
  EXPECT_EQ(dtype_size(DType::i8), 1u);
}

TEST(Kernels, MinMaxPropagateNanWhicheverSideItIsOn) {
  float a[2] = {NAN, 1.0f}, b[2] = {1.0f, NAN}, o[2];
  for (ReduceOp op : {ReduceOp::min, ReduceOp::max}) {
    kernels::reduce(DType::f32, op, o, a, b, 2);
    EXPECT_TRUE(std::isnan(o[0]) && std::isnan(o[1])) << to_string(op);
  }
}

// The kernel may use the F16C instructions; they must agree bit for bit with
// the portable conversion (round to nearest even) on every finite input.
TEST(Kernels, HalfKernelAgreesWithPortableConversion) {
  std::vector<uint16_t> a, b;
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00) continue;  // inf and nan
    a.push_back(static_cast<uint16_t>(h));
    b.push_back(static_cast<uint16_t>((h * 40503u) & 0xfbff));
  }
  std::vector<uint16_t> out(a.size());
  kernels::reduce(DType::f16, ReduceOp::sum, out.data(), a.data(), b.data(), a.size());
  size_t wrong = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    float sum = kernels::half_to_float(a[i]) + kernels::half_to_float(b[i]);
    wrong += out[i] != kernels::float_to_half(sum);
  }
  EXPECT_EQ(wrong, 0u);
}

// f16 and bf16 sums and averages (one pass in AVX2 registers where the CPU
// has them) agree bit for bit with the scalar conversions around an f32
// sum, at every length up to 40 (the vector bodies' tails) and at 3001, in
// place too; a NaN or Inf operand gives NaN or Inf.
TEST(Kernels, HalfSumsAndAveragesAgreeWithScalarConversionsAtEveryLength) {
  std::mt19937 g(11);
  std::uniform_int_distribution<int> bits(0, 0xffff);
  for (DType t : {DType::f16, DType::bf16}) {
    const bool half = t == DType::f16;
    auto widen = [&](uint16_t v) {
      return half ? kernels::half_to_float(v) : kernels::bf16_to_float(v);
    };
    auto narrow = [&](float f) {
      return half ? kernels::float_to_half(f) : kernels::float_to_bf16(f);
    };
    for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{15}, size_t{16},
                     size_t{17}, size_t{23}, size_t{31}, size_t{33}, size_t{40}, size_t{3001}})
      for (int divisor : {0, 3})
        for (bool in_place : {false, true}) {
          std::vector<uint16_t> a(n), b(n), out(n);
          for (size_t i = 0; i < n; ++i) {
            a[i] = static_cast<uint16_t>(bits(g));
            b[i] = static_cast<uint16_t>(bits(g));
          }
          std::vector<uint16_t> a0 = a;
          uint16_t* dst = in_place ? a.data() : out.data();
          kernels::reduce(t, divisor ? ReduceOp::avg : ReduceOp::sum, dst, a.data(), b.data(), n,
                          divisor);
          size_t wrong = 0;
          for (size_t i = 0; i < n; ++i) {
            float v = widen(a0[i]) + widen(b[i]);
            if (divisor) v /= static_cast<float>(divisor);
            const float got = widen(dst[i]);
            if (std::isnan(v))
              wrong += !std::isnan(got);
            else
              wrong += dst[i] != narrow(v);
          }
          EXPECT_EQ(wrong, 0u) << to_string(t) << " n=" << n << " divisor=" << divisor
                               << (in_place ? " in place" : "");
        }
  }
}

// The f16 or bf16 nearest to v, ties to the even pattern: found among
// every pattern's value, not by a conversion (independent of the kernels'
// rounding). Positive finite patterns grow with their value; the one
// after the largest finite is inf, standing at the next step of the top
// binade (65536 for f16, 2^128 for bf16).
uint16_t nearest_16(DType t, double v) {
  const bool half = t == DType::f16;
  const uint16_t inf = half ? 0x7c00 : 0x7f80, sign = std::signbit(v) ? 0x8000 : 0;
  if (std::isnan(v)) return half ? 0x7e00 : 0x7fc0;
  const double a = std::fabs(v);
  auto value = [&](uint16_t p) -> double {
    if (p == inf) return half ? 65536.0 : std::ldexp(1.0, 128);
    return half ? kernels::half_to_float(p) : kernels::bf16_to_float(p);
  };
  if (a >= value(inf)) return sign | inf;
  uint16_t lo = 0, hi = inf;  // value(lo) <= a < value(hi)
  while (hi - lo > 1) {
    const auto mid = static_cast<uint16_t>((lo + hi) / 2);
    (value(mid) <= a ? lo : hi) = mid;
  }
  const double below = a - value(lo), above = value(hi) - a;
  const uint16_t p = below < above ? lo : above < below ? hi : (lo % 2 == 0 ? lo : hi);
  return sign | p;
}

// A float64 goes to f16 and bf16 rounded once, not through a float32 that
// may fall on their tie: the known answers, and 40000 values near and on
// the midpoints between neighbours and at random, with and without a
// divisor, against nearest_16.
TEST(Kernels, ConvertRoundsAFloat64OnceIntoHalfAndBf16) {
  auto one = [](DType t, double v, int div = 1) {
    uint16_t out = 0;
    kernels::convert(DType::f64, &v, t, &out, 1, div);
    return out;
  };
  EXPECT_EQ(one(DType::f16, 1.0 + 0x1p-11 + 0x1p-40), 0x3c01);  // a cast first: 0x3c00
  EXPECT_EQ(one(DType::f16, 1.0 + 0x1p-11), 0x3c00);            // the tie itself: to even
  EXPECT_EQ(one(DType::f16, -(1.0 + 0x1p-11 + 0x1p-40)), 0xbc01);
  EXPECT_EQ(one(DType::bf16, 1.0 + 0x1p-8 + 0x1p-40), 0x3f81);  // a cast first: 0x3f80
  EXPECT_EQ(one(DType::f16, 65520.0 - 0x1p-30), 0x7bff);        // just below overflow's tie
  EXPECT_EQ(one(DType::f16, 1e300), 0x7c00);                    // beyond f32: inf
  EXPECT_EQ(one(DType::bf16, 1e300), 0x7f80);
  EXPECT_EQ(one(DType::f16, 0x1p-25 + 0x1p-60), 0x0001);  // above the smallest subnormal's tie
  EXPECT_EQ(one(DType::f16, 3.0 * (1.0 + 0x1p-11 + 0x1p-40), 3), 0x3c01);
  std::mt19937_64 g(11);
  for (DType t : {DType::f16, DType::bf16}) {
    const bool half = t == DType::f16;
    const uint16_t top = half ? 0x7bff : 0x7f7f;
    size_t wrong = 0, n = 0;
    for (int i = 0; i < 20000; ++i) {
      const auto p = static_cast<uint16_t>(g() % top);  // p and p + 1 finite
      const double lo = half ? kernels::half_to_float(p) : kernels::bf16_to_float(p);
      const double hi = half ? kernels::half_to_float(static_cast<uint16_t>(p + 1))
                             : kernels::bf16_to_float(static_cast<uint16_t>(p + 1));
      const double mid = (lo + hi) / 2,
                   nudge = std::ldexp(hi - lo, -30 - static_cast<int>(g() % 20));
      double v = i % 4 == 0   ? mid
                 : i % 4 == 1 ? mid + nudge
                 : i % 4 == 2 ? mid - nudge
                              : std::ldexp(static_cast<double>(g() >> 11) * 0x1p-53,
                                           static_cast<int>(g() % 60) - 30);
      if (g() % 2) v = -v;
      for (int div : {1, 3}) {
        const double x = v * div;
        ++n;
        wrong += one(t, x, div) != nearest_16(t, x / div);
      }
    }
    EXPECT_EQ(wrong, 0u) << to_string(t) << ": " << wrong << " of " << n;
  }
}

// convert (the compression hooks' kernel) agrees with the scalar reference
// for every pair of float types, with and without a divisor.
TEST(Kernels, ConvertMatchesScalarReference) {
  const size_t n = 2500;
  std::mt19937 g(5);
  std::uniform_real_distribution<float> d(-300.f, 300.f);
  std::vector<float> src32(n);
  for (auto& x : src32) x = d(g);
  for (DType st : {DType::f32, DType::f16, DType::bf16, DType::f64})
    for (DType dt : {DType::f32, DType::f16, DType::bf16, DType::f64})
      for (int div : {1, 3}) {
        std::vector<uint8_t> src(n * 8), dst(n * 8);
        for (size_t i = 0; i < n; ++i) testing::put(st, src.data(), i, src32[i]);
        kernels::convert(st, src.data(), dt, dst.data(), n, div);
        size_t wrong = 0;
        for (size_t i = 0; i < n; ++i) {
          double v = testing::get(st, src.data(), i);
          // In f32 (or f64 when either side is f64), then rounded once.
          double want = (st == DType::f64 || dt == DType::f64)
                            ? testing::rounded(dt, v / div)
                            : testing::rounded(dt, static_cast<float>(v) / static_cast<float>(div));
          // From f64 to f16 or bf16, once from the double (the reference's
          // float cast would round twice).
          if (st == DType::f64 && (dt == DType::f16 || dt == DType::bf16)) {
            const uint16_t p = nearest_16(dt, v / div);
            want = dt == DType::f16 ? kernels::half_to_float(p) : kernels::bf16_to_float(p);
          }
          wrong += testing::get(dt, dst.data(), i) != want;
        }
        EXPECT_EQ(wrong, 0u) << to_string(st) << " -> " << to_string(dt) << " / " << div;
      }
}

}  // namespace
}  // namespace collie
