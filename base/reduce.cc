#include "base/reduce.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <type_traits>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "collie/error.h"

namespace collie::kernels {

float half_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ff;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);  // inf / nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {
    // Subnormal half: the value is man * 2^-24; exact in float.
    float f = static_cast<float>(man) * 0x1p-24f;
    return sign ? -f : f;
  }
  return std::bit_cast<float>(bits);
}

uint16_t float_to_half(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) {  // inf or nan (keep nan a quiet nan)
    return sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0);
  }
  if (ax >= 0x477ff000u) return sign | 0x7c00;  // rounds to >= 65520: inf
  if (ax < 0x38800000u) {
    // Result is subnormal (or zero): scale so that the integer part is the
    // half mantissa, and let the float unit round to nearest even.
    float a = std::bit_cast<float>(ax);
    float scaled = a * 0x1p24f;
    uint32_t m = static_cast<uint32_t>(scaled);
    float rem = scaled - static_cast<float>(m);
    if (rem > 0.5f || (rem == 0.5f && (m & 1))) ++m;
    return sign | static_cast<uint16_t>(m);
  }
  // Normal: rebias the exponent and round the 13 dropped bits to nearest even.
  uint32_t r = ax + 0xfffu + ((ax >> 13) & 1);
  r -= 112u << 23;
  return sign | static_cast<uint16_t>(r >> 13);
}

float bf16_to_float(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

uint16_t float_to_bf16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40);  // nan
  x += 0x7fffu + ((x >> 16) & 1);
  return static_cast<uint16_t>(x >> 16);
}

namespace {

// Integers are combined in the unsigned type of their width (widened to at
// least unsigned int, so that u8 x u8 is not promoted to a signed int), so
// that sums and products wrap around as two's complement does instead of
// overflowing, which C++ leaves undefined for signed types.
template <typename T>
using Wide = std::common_type_t<std::make_unsigned_t<T>, unsigned>;

struct Sum {
  template <typename T>
  static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>)
      return static_cast<T>(static_cast<Wide<T>>(a) + static_cast<Wide<T>>(b));
    else
      return a + b;
  }
};
struct Prod {
  template <typename T>
  static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>)
      return static_cast<T>(static_cast<Wide<T>>(a) * static_cast<Wide<T>>(b));
    else
      return a * b;
  }
};
// NaN wins from either side (as in torch.minimum), which also keeps min and
// max commutative: both ranks of a pair then compute the same bits.
struct Min {
  template <typename T>
  static T apply(T a, T b) {
    if (a != a) return a;
    if (b != b) return b;
    return b < a ? b : a;
  }
};
struct Max {
  template <typename T>
  static T apply(T a, T b) {
    if (a != a) return a;
    if (b != b) return b;
    return a < b ? b : a;
  }
};

template <typename Op, typename T>
void combine(T* dst, const T* a, const T* b, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = Op::apply(a[i], b[i]);
}

template <typename T>
void sum_div(T* dst, const T* a, const T* b, size_t n, T d) {
  for (size_t i = 0; i < n; ++i) dst[i] = (a[i] + b[i]) / d;
}

// Block conversions between 16-bit floats and f32. On x86 with F16C (every
// x86 server since 2012) the f16 ones use the hardware instructions, chosen
// at run time, 20-30x faster than the portable bit manipulation.
void widen_half(const uint16_t* s, float* d, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = half_to_float(s[i]);
}
void narrow_half(const float* s, uint16_t* d, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = float_to_half(s[i]);
}
// Inlined into each instruction-set variant below, which the compiler then
// vectorises for that set.
[[gnu::always_inline]] inline void widen_bf16_loop(const uint16_t* s, float* d, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    uint32_t x = static_cast<uint32_t>(s[i]) << 16;
    std::memcpy(&d[i], &x, sizeof x);
  }
}
// The same rounding as float_to_bf16, written without branches so that the
// compiler vectorises it (the branchy scalar form ran at ~0.3 GB/s).
[[gnu::always_inline]] inline void narrow_bf16_loop(const float* s, uint16_t* d, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    uint32_t x;
    std::memcpy(&x, &s[i], sizeof x);
    uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    uint32_t quiet_nan = (x >> 16) | 0x40u;
    d[i] = static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
  }
}
void widen_bf16(const uint16_t* s, float* d, size_t n) {
  widen_bf16_loop(s, d, n);
}
void narrow_bf16(const float* s, uint16_t* d, size_t n) {
  narrow_bf16_loop(s, d, n);
}

#if defined(__x86_64__)
__attribute__((target("avx,f16c"))) void widen_half_f16c(const uint16_t* s, float* d, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(d + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
  widen_half(s + i, d + i, n - i);
}
__attribute__((target("avx,f16c"))) void narrow_half_f16c(const float* s, uint16_t* d, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
  narrow_half(s + i, d + i, n - i);
}
// F16C is CPUID leaf 1, ECX bit 29, asked directly: clang (14) does not know
// "f16c" as a __builtin_cpu_supports feature, and the fuzz build is clang's.
bool cpu_has_f16c() {
  unsigned a, b, c, d;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}
const bool kHasF16C = cpu_has_f16c() && __builtin_cpu_supports("avx");
// bf16 has no conversion instruction before AVX-512: the same branchless
// loops, compiled for AVX2 (the baseline build targets SSE2), are chosen at
// run time.
__attribute__((target("avx2"))) void widen_bf16_avx2(const uint16_t* s, float* d, size_t n) {
  widen_bf16_loop(s, d, n);
}
__attribute__((target("avx2"))) void narrow_bf16_avx2(const float* s, uint16_t* d, size_t n) {
  narrow_bf16_loop(s, d, n);
}
const bool kHasAvx2 = __builtin_cpu_supports("avx2");
#endif

#if defined(__x86_64__)
// f16 and bf16 sums (and an average's last step) in one pass: eight
// elements of each side widened in registers, added (then divided),
// rounded once and stored; the same f32 operations and roundings as the
// blocks of combine16, which widened both sides into arrays, combined them
// in SSE2 and narrowed: 5-6 GB/s of output in L1, against 33 for f32
// (bench_kernels), the cost of every f16 all-reduce's reduction
// (bench/RESULTS.md, "f16 and bf16 sums in one pass"). The tails go
// through the scalar conversions, as combine16's do.
#define COLLIE_F16C __attribute__((target("avx2,f16c"), always_inline)) inline
#define COLLIE_AVX2 __attribute__((target("avx2"), always_inline)) inline
COLLIE_F16C __m256 load_half8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
COLLIE_F16C void store_half8(uint16_t* p, __m256 v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}
// With `test`, each f32 result's exponent field plus one exponent unit is
// ORed into *test: its sign bit ends set only for NaN or Inf, the test of
// sum_test_loop, so that the watched reduction (reduce16_watching) runs in
// the same pass.
COLLIE_AVX2 __m256i exponent_carry(__m256 v) {
  return _mm256_add_epi32(_mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x7f800000)),
                          _mm256_set1_epi32(0x00800000));
}
COLLIE_AVX2 uint32_t or_lanes(__m256i v) {
  alignas(32) uint32_t x[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(x), v);
  return x[0] | x[1] | x[2] | x[3] | x[4] | x[5] | x[6] | x[7];
}
inline uint32_t exponent_carry(float v) {
  uint32_t x;
  std::memcpy(&x, &v, sizeof x);
  return (x & 0x7f800000u) + 0x00800000u;
}
__attribute__((target("avx2,f16c"))) void sum_half_fused(uint16_t* dst, const uint16_t* a,
                                                         const uint16_t* b, size_t n, int divisor,
                                                         uint32_t* test = nullptr) {
  size_t i = 0;
  __m256i acc = _mm256_setzero_si256();
  uint32_t tail = 0;
  if (divisor > 0) {
    const __m256 d = _mm256_set1_ps(static_cast<float>(divisor));
    for (; i + 8 <= n; i += 8) {
      const __m256 x = _mm256_div_ps(_mm256_add_ps(load_half8(a + i), load_half8(b + i)), d);
      if (test) acc = _mm256_or_si256(acc, exponent_carry(x));
      store_half8(dst + i, x);
    }
    for (; i < n; ++i) {
      const float v = (half_to_float(a[i]) + half_to_float(b[i])) / static_cast<float>(divisor);
      tail |= exponent_carry(v);
      dst[i] = float_to_half(v);
    }
  } else {
    for (; i + 16 <= n; i += 16) {
      const __m256 x = _mm256_add_ps(load_half8(a + i), load_half8(b + i));
      const __m256 y = _mm256_add_ps(load_half8(a + i + 8), load_half8(b + i + 8));
      if (test) acc = _mm256_or_si256(acc, _mm256_or_si256(exponent_carry(x), exponent_carry(y)));
      store_half8(dst + i, x);
      store_half8(dst + i + 8, y);
    }
    for (; i + 8 <= n; i += 8) {
      const __m256 x = _mm256_add_ps(load_half8(a + i), load_half8(b + i));
      if (test) acc = _mm256_or_si256(acc, exponent_carry(x));
      store_half8(dst + i, x);
    }
    for (; i < n; ++i) {
      const float v = half_to_float(a[i]) + half_to_float(b[i]);
      tail |= exponent_carry(v);
      dst[i] = float_to_half(v);
    }
  }
  if (test) *test |= or_lanes(acc) | tail;
}

// bf16: widened by a shift, narrowed as narrow_bf16_loop does (round to
// nearest even; a NaN kept quiet), sixteen elements a step so that one
// pack fills a register.
COLLIE_AVX2 __m256 load_bf16x8(const uint16_t* p) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
COLLIE_AVX2 __m256i round_bf16x8(__m256 v) {
  const __m256i x = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), odd), 16);
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff)),
                                         _mm256_set1_epi32(0x7f800000));
  return _mm256_blendv_epi8(rounded, quiet, nan);
}
__attribute__((target("avx2"))) void sum_bf16_fused(uint16_t* dst, const uint16_t* a,
                                                    const uint16_t* b, size_t n, int divisor,
                                                    uint32_t* test = nullptr) {
  const bool div = divisor > 0;
  const __m256 d = _mm256_set1_ps(div ? static_cast<float>(divisor) : 1.0f);
  __m256i acc = _mm256_setzero_si256();
  uint32_t tail = 0;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256 x = _mm256_add_ps(load_bf16x8(a + i), load_bf16x8(b + i));
    __m256 y = _mm256_add_ps(load_bf16x8(a + i + 8), load_bf16x8(b + i + 8));
    if (div) {
      x = _mm256_div_ps(x, d);
      y = _mm256_div_ps(y, d);
    }
    if (test) acc = _mm256_or_si256(acc, _mm256_or_si256(exponent_carry(x), exponent_carry(y)));
    // packus works within 128-bit lanes (x0-3 y0-3 x4-7 y4-7): put in order.
    const __m256i packed = _mm256_packus_epi32(round_bf16x8(x), round_bf16x8(y));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm256_permute4x64_epi64(packed, _MM_SHUFFLE(3, 1, 2, 0)));
  }
  for (; i < n; ++i) {
    float v = bf16_to_float(a[i]) + bf16_to_float(b[i]);
    if (div) v /= static_cast<float>(divisor);
    tail |= exponent_carry(v);
    dst[i] = float_to_bf16(v);
  }
  if (test) *test |= or_lanes(acc) | tail;
}
#undef COLLIE_F16C
#undef COLLIE_AVX2
const bool kFusedHalf = kHasF16C && kHasAvx2;
#endif

using Widen = void (*)(const uint16_t*, float*, size_t);
using Narrow = void (*)(const float*, uint16_t*, size_t);

// The fastest conversions this CPU has, chosen once.
#if defined(__x86_64__)
const Widen kWidenHalf = kHasF16C ? widen_half_f16c : widen_half;
const Narrow kNarrowHalf = kHasF16C ? narrow_half_f16c : narrow_half;
const Widen kWidenBf16 = kHasAvx2 ? widen_bf16_avx2 : widen_bf16;
const Narrow kNarrowBf16 = kHasAvx2 ? narrow_bf16_avx2 : narrow_bf16;
#else
const Widen kWidenHalf = widen_half;
const Narrow kNarrowHalf = narrow_half;
const Widen kWidenBf16 = widen_bf16;
const Narrow kNarrowBf16 = narrow_bf16;
#endif

// fa = fa + fb (then / divisor, where > 0), and whether a result is NaN or
// Inf: exponent bits all ones, found by adding one to the exponent field
// (it carries into the sign bit only then), branch-free so that it
// vectorises; compiled for AVX2 too (eight lanes, not SSE2's four: the
// search cost the bf16 reduction 20 % with four).
[[gnu::always_inline]] inline bool sum_test_loop(float* fa, const float* fb, size_t m,
                                                 int divisor) {
  uint32_t acc = 0;
  auto test = [&acc](float r) {
    uint32_t x;
    std::memcpy(&x, &r, sizeof x);
    acc |= (x & 0x7f800000u) + 0x00800000u;
  };
  if (divisor > 0) {
    const float d = static_cast<float>(divisor);
    for (size_t i = 0; i < m; ++i) test(fa[i] = (fa[i] + fb[i]) / d);
  } else {
    for (size_t i = 0; i < m; ++i) test(fa[i] = fa[i] + fb[i]);
  }
  return (acc & 0x80000000u) != 0;
}
bool sum_test(float* fa, const float* fb, size_t m, int divisor) {
  return sum_test_loop(fa, fb, m, divisor);
}
#if defined(__x86_64__)
__attribute__((target("avx2"))) bool sum_test_avx2(float* fa, const float* fb, size_t m,
                                                   int divisor) {
  return sum_test_loop(fa, fb, m, divisor);
}
const auto kSumTest = kHasAvx2 ? sum_test_avx2 : sum_test;
#else
const auto kSumTest = sum_test;
#endif

// f16/bf16: widen, combine in f32, round once. Done in blocks so that the
// widened values stay in L1 and the loops vectorise. With `watch`, a
// block whose f32 results are not all finite is reported before it is
// stored (reduce16_watching; its fused path stores first where dst is not
// an operand).
template <typename Op>
void combine16(Widen widen, Narrow narrow, uint16_t* dst, const uint16_t* a, const uint16_t* b,
               size_t n, int divisor, NonFiniteBlock watch = nullptr, void* ctx = nullptr) {
  constexpr size_t kBlock = 1024;
  float fa[kBlock], fb[kBlock];
  for (size_t base = 0; base < n; base += kBlock) {
    size_t m = std::min(kBlock, n - base);
    widen(a + base, fa, m);
    widen(b + base, fb, m);
    if (watch) {
      if (kSumTest(fa, fb, m, divisor)) watch(ctx, base, m);
    } else if (divisor > 0) {
      float d = static_cast<float>(divisor);
      for (size_t i = 0; i < m; ++i) fa[i] = (fa[i] + fb[i]) / d;
    } else {
      for (size_t i = 0; i < m; ++i) fa[i] = Op::apply(fa[i], fb[i]);
    }
    narrow(fa, dst + base, m);
  }
}

template <typename Op>
void dispatch(DType t, void* dst, const void* a, const void* b, size_t n, int divisor) {
  switch (t) {
    case DType::f32:
      if (divisor > 0)
        return sum_div(static_cast<float*>(dst), static_cast<const float*>(a),
                       static_cast<const float*>(b), n, static_cast<float>(divisor));
      return combine<Op>(static_cast<float*>(dst), static_cast<const float*>(a),
                         static_cast<const float*>(b), n);
    case DType::f64:
      if (divisor > 0)
        return sum_div(static_cast<double*>(dst), static_cast<const double*>(a),
                       static_cast<const double*>(b), n, static_cast<double>(divisor));
      return combine<Op>(static_cast<double*>(dst), static_cast<const double*>(a),
                         static_cast<const double*>(b), n);
    case DType::f16:
#if defined(__x86_64__)
      if (std::is_same_v<Op, Sum> && kFusedHalf)
        return sum_half_fused(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(a),
                              static_cast<const uint16_t*>(b), n, divisor);
#endif
      return combine16<Op>(kWidenHalf, kNarrowHalf, static_cast<uint16_t*>(dst),
                           static_cast<const uint16_t*>(a), static_cast<const uint16_t*>(b), n,
                           divisor);
    case DType::bf16:
#if defined(__x86_64__)
      if (std::is_same_v<Op, Sum> && kHasAvx2)
        return sum_bf16_fused(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(a),
                              static_cast<const uint16_t*>(b), n, divisor);
#endif
      return combine16<Op>(kWidenBf16, kNarrowBf16, static_cast<uint16_t*>(dst),
                           static_cast<const uint16_t*>(a), static_cast<const uint16_t*>(b), n,
                           divisor);
    case DType::i32:
      return combine<Op>(static_cast<int32_t*>(dst), static_cast<const int32_t*>(a),
                         static_cast<const int32_t*>(b), n);
    case DType::i64:
      return combine<Op>(static_cast<int64_t*>(dst), static_cast<const int64_t*>(a),
                         static_cast<const int64_t*>(b), n);
    case DType::u8:
      return combine<Op>(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(a),
                         static_cast<const uint8_t*>(b), n);
    case DType::i8:
      return combine<Op>(static_cast<int8_t*>(dst), static_cast<const int8_t*>(a),
                         static_cast<const int8_t*>(b), n);
  }
}

}  // namespace

void reduce(DType t, ReduceOp op, void* dst, const void* a, const void* b, size_t n, int divisor) {
  switch (op) {
    case ReduceOp::sum:
      return dispatch<Sum>(t, dst, a, b, n, 0);
    case ReduceOp::avg:
      if (!is_floating(t))
        throw Error(ErrorCode::invalid_argument, "avg is not defined on integer tensors");
      return dispatch<Sum>(t, dst, a, b, n, divisor);
    case ReduceOp::prod:
      return dispatch<Prod>(t, dst, a, b, n, 0);
    case ReduceOp::min:
      return dispatch<Min>(t, dst, a, b, n, 0);
    case ReduceOp::max:
      return dispatch<Max>(t, dst, a, b, n, 0);
  }
}

void reduce16_watching(DType t, ReduceOp op, void* dst, const void* a, const void* b, size_t n,
                       int divisor, NonFiniteBlock watch, void* ctx) {
  if ((t != DType::f16 && t != DType::bf16) || (op != ReduceOp::sum && op != ReduceOp::avg))
    throw Error(ErrorCode::internal, "reduce16_watching takes f16 or bf16 sums and averages");
  const bool half = t == DType::f16;
#if defined(__x86_64__)
  if (half ? kFusedHalf : kHasAvx2) {
    // One pass a block (reduce's); in place, into a block of L1 first: the
    // watcher searches the operands, which the result would overwrite.
    constexpr size_t kBlock = 1024;
    uint16_t out[kBlock];
    const int d = op == ReduceOp::avg ? divisor : 0;
    auto* pd = static_cast<uint16_t*>(dst);
    auto *pa = static_cast<const uint16_t*>(a), *pb = static_cast<const uint16_t*>(b);
    const bool in_place = pd == pa || pd == pb;
    auto* sum = half ? sum_half_fused : sum_bf16_fused;
    for (size_t base = 0; base < n; base += kBlock) {
      const size_t m = std::min(kBlock, n - base);
      uint32_t test = 0;
      sum(in_place ? out : pd + base, pa + base, pb + base, m, d, &test);
      if (test & 0x80000000u) watch(ctx, base, m);
      if (in_place) std::memcpy(pd + base, out, m * sizeof(uint16_t));
    }
    return;
  }
#endif
  combine16<Sum>(half ? kWidenHalf : kWidenBf16, half ? kNarrowHalf : kNarrowBf16,
                 static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(a),
                 static_cast<const uint16_t*>(b), n, op == ReduceOp::avg ? divisor : 0, watch, ctx);
}

namespace {

// v rounded to f32 by round-to-odd (toward zero, the last bit set where
// inexact): narrowed from there to f16 or bf16 (at least 2 bits fewer) with
// round-to-nearest-even, v is rounded once. A plain cast first would round
// twice: 1 + 2^-11 + 2^-40 would become the f16 tie 1 + 2^-11, then 1.
float to_f32_odd(double v) {
  float f = static_cast<float>(v);
  if (!std::isfinite(v) || static_cast<double>(f) == v) return f;
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if (std::fabs(static_cast<double>(f)) > std::fabs(v)) --bits;  // toward zero (inf: FLT_MAX)
  bits |= 1;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

}  // namespace

void convert(DType st, const void* src, DType dt, void* dst, size_t n, int divisor) {
  auto is16or32 = [](DType t) { return t == DType::f32 || t == DType::f16 || t == DType::bf16; };
  if (!is16or32(st) || !is16or32(dt)) {
    // f64 on either side: a plain loop (no hook uses it on a hot path).
    if (!is_floating(st) || !is_floating(dt))
      throw Error(ErrorCode::invalid_argument, "convert is defined on floating tensors only");
    for (size_t i = 0; i < n; ++i) {
      double v;
      switch (st) {
        case DType::f64:
          v = static_cast<const double*>(src)[i];
          break;
        case DType::f32:
          v = static_cast<const float*>(src)[i];
          break;
        case DType::f16:
          v = half_to_float(static_cast<const uint16_t*>(src)[i]);
          break;
        default:
          v = bf16_to_float(static_cast<const uint16_t*>(src)[i]);
          break;
      }
      v /= divisor;
      switch (dt) {
        case DType::f64:
          static_cast<double*>(dst)[i] = v;
          break;
        case DType::f32:
          static_cast<float*>(dst)[i] = static_cast<float>(v);
          break;
        case DType::f16:
          static_cast<uint16_t*>(dst)[i] = float_to_half(to_f32_odd(v));
          break;
        default:
          static_cast<uint16_t*>(dst)[i] = float_to_bf16(to_f32_odd(v));
          break;
      }
    }
    return;
  }
  Widen widen = st == DType::f16 ? kWidenHalf : kWidenBf16;
  Narrow narrow = dt == DType::f16 ? kNarrowHalf : kNarrowBf16;
  if (st != DType::f32 && dt == DType::f32 && divisor == 1) {
    // A decompression: widened straight into place, not through a block.
    widen(static_cast<const uint16_t*>(src), static_cast<float*>(dst), n);
    return;
  }
  constexpr size_t kBlock = 1024;
  float f[kBlock];
  for (size_t base = 0; base < n; base += kBlock) {
    size_t m = std::min(kBlock, n - base);
    const float* in = f;
    if (st == DType::f32)
      in = static_cast<const float*>(src) + base;
    else
      widen(static_cast<const uint16_t*>(src) + base, f, m);
    float* out = dt == DType::f32 ? static_cast<float*>(dst) + base : f;
    if (divisor != 1) {
      float k = static_cast<float>(divisor);
      for (size_t i = 0; i < m; ++i) out[i] = in[i] / k;
    } else if (out != in) {
      std::memcpy(out, in, m * sizeof(float));
    }
    if (dt != DType::f32) narrow(out, static_cast<uint16_t*>(dst) + base, m);
  }
}

void divide(DType t, void* dst, const void* src, size_t n, int divisor) {
  switch (t) {
    case DType::f32: {
      auto* d = static_cast<float*>(dst);
      auto* s = static_cast<const float*>(src);
      float k = static_cast<float>(divisor);
      for (size_t i = 0; i < n; ++i) d[i] = s[i] / k;
      return;
    }
    case DType::f64: {
      auto* d = static_cast<double*>(dst);
      auto* s = static_cast<const double*>(src);
      double k = static_cast<double>(divisor);
      for (size_t i = 0; i < n; ++i) d[i] = s[i] / k;
      return;
    }
    case DType::f16:
    case DType::bf16: {
      auto* d = static_cast<uint16_t*>(dst);
      auto* s = static_cast<const uint16_t*>(src);
      float k = static_cast<float>(divisor);
      bool half = t == DType::f16;
      for (size_t i = 0; i < n; ++i)
        d[i] =
            half ? float_to_half(half_to_float(s[i]) / k) : float_to_bf16(bf16_to_float(s[i]) / k);
      return;
    }
    default:
      throw Error(ErrorCode::invalid_argument, "divide is defined on floating tensors only");
  }
}

}  // namespace collie::kernels
