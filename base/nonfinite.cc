// base/nonfinite.cc: NaN and Inf are the values whose exponent bits are all
// ones, in each float type: a mask and a compare per element, counted a
// block at a time (the block is copied first when copying, so that it is in
// L1 when counted). The counting loop is compiled twice, for the baseline
// and for AVX2, and chosen once.
#include "base/nonfinite.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "base/element.h"
#include "base/reduce.h"

namespace collie::kernels {

namespace {

constexpr size_t kBlock = 4096;  // elements: 8 to 32 KiB, within L1

template <typename U>
inline __attribute__((always_inline)) size_t count_block(const U* u, size_t n, U mask) {
  uint32_t c = 0;
  for (size_t i = 0; i < n; ++i) c += (u[i] & mask) == mask;
  return c;
}

size_t count16(const uint16_t* u, size_t n, uint16_t m) {
  return count_block(u, n, m);
}
size_t count32(const uint32_t* u, size_t n, uint32_t m) {
  return count_block(u, n, m);
}
size_t count64(const uint64_t* u, size_t n, uint64_t m) {
  return count_block(u, n, m);
}
__attribute__((target("avx2"))) size_t count16_avx2(const uint16_t* u, size_t n, uint16_t m) {
  return count_block(u, n, m);
}
__attribute__((target("avx2"))) size_t count32_avx2(const uint32_t* u, size_t n, uint32_t m) {
  return count_block(u, n, m);
}
__attribute__((target("avx2"))) size_t count64_avx2(const uint64_t* u, size_t n, uint64_t m) {
  return count_block(u, n, m);
}

const bool kAvx2 = __builtin_cpu_supports("avx2");

size_t count(const uint16_t* u, size_t n, uint16_t m) {
  return kAvx2 ? count16_avx2(u, n, m) : count16(u, n, m);
}
size_t count(const uint32_t* u, size_t n, uint32_t m) {
  return kAvx2 ? count32_avx2(u, n, m) : count32(u, n, m);
}
size_t count(const uint64_t* u, size_t n, uint64_t m) {
  return kAvx2 ? count64_avx2(u, n, m) : count64(u, n, m);
}

// AVX2, copying: each 32 bytes loaded once, tested (and, compare, or into
// a flag) and stored; whether the block holds any non-finite element, and
// only then is it counted. Ordinary stores, not non-temporal ones: the
// bucket is read by its all-reduce next, and measured (bench/checks_bench)
// streaming it to memory made the reduction 2 ms slower at 32 MiB.
template <typename U>
__attribute__((target("avx2"))) bool copy_any_avx2(U* d, const U* s, size_t n, U mask) {
  __m256i m, bad = _mm256_setzero_si256();
  if constexpr (sizeof(U) == 2) m = _mm256_set1_epi16(static_cast<short>(mask));
  if constexpr (sizeof(U) == 4) m = _mm256_set1_epi32(static_cast<int>(mask));
  if constexpr (sizeof(U) == 8) m = _mm256_set1_epi64x(static_cast<long long>(mask));
  constexpr size_t kLanes = 32 / sizeof(U);
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    __m256i e = _mm256_and_si256(v, m), c;
    if constexpr (sizeof(U) == 2) c = _mm256_cmpeq_epi16(e, m);
    if constexpr (sizeof(U) == 4) c = _mm256_cmpeq_epi32(e, m);
    if constexpr (sizeof(U) == 8) c = _mm256_cmpeq_epi64(e, m);
    bad = _mm256_or_si256(bad, c);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), v);
  }
  bool any = !_mm256_testz_si256(bad, bad);
  for (; i < n; ++i) {
    d[i] = s[i];
    any |= (s[i] & mask) == mask;
  }
  return any;
}

// AVX2, reading only: whether s[0, n) holds a non-finite element.
template <typename U>
__attribute__((target("avx2"))) bool any_avx2(const U* s, size_t n, U mask) {
  __m256i m, bad = _mm256_setzero_si256();
  if constexpr (sizeof(U) == 2) m = _mm256_set1_epi16(static_cast<short>(mask));
  if constexpr (sizeof(U) == 4) m = _mm256_set1_epi32(static_cast<int>(mask));
  if constexpr (sizeof(U) == 8) m = _mm256_set1_epi64x(static_cast<long long>(mask));
  constexpr size_t kLanes = 32 / sizeof(U);
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    __m256i e = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i)), m), c;
    if constexpr (sizeof(U) == 2) c = _mm256_cmpeq_epi16(e, m);
    if constexpr (sizeof(U) == 4) c = _mm256_cmpeq_epi32(e, m);
    if constexpr (sizeof(U) == 8) c = _mm256_cmpeq_epi64(e, m);
    bad = _mm256_or_si256(bad, c);
  }
  bool any = !_mm256_testz_si256(bad, bad);
  for (; i < n; ++i) any |= (s[i] & mask) == mask;
  return any;
}

template <typename U>
bool any(const U* s, size_t n, U mask) {
  return kAvx2 ? any_avx2(s, n, mask) : count(s, n, mask) != 0;
}

// The exponent mask of a float dtype (0: an integer dtype, never
// non-finite), and whether the buffer at `p` of n elements holds one.
uint64_t mask_of(DType t) {
  switch (t) {
    case DType::f32:
      return 0x7f800000u;
    case DType::f64:
      return 0x7ff0000000000000ull;
    case DType::f16:
      return 0x7c00;
    case DType::bf16:
      return 0x7f80;
    default:
      return 0;
  }
}

bool any_nonfinite(DType t, const void* p, size_t n) {
  switch (t) {
    case DType::f32:
      return any(static_cast<const uint32_t*>(p), n, uint32_t{0x7f800000u});
    case DType::f64:
      return any(static_cast<const uint64_t*>(p), n, uint64_t{0x7ff0000000000000ull});
    case DType::f16:
      return any(static_cast<const uint16_t*>(p), n, uint16_t{0x7c00});
    case DType::bf16:
      return any(static_cast<const uint16_t*>(p), n, uint16_t{0x7f80});
    default:
      return false;
  }
}

bool is_nonfinite(DType t, const void* p, size_t i, uint64_t mask) {
  uint64_t bits = 0;
  const size_t es = dtype_size(t);
  std::memcpy(&bits, static_cast<const uint8_t*>(p) + i * es, es);
  return (bits & mask) == mask;
}

// Elements at a time that reduce_searching tests and then reduces: each
// operand's block (4 KiB of f32) stays in L1 between the two.
constexpr size_t kReduceBlock = 1024;

template <typename U>
NonFinite scan(DType t, void* dst, const void* src, size_t n, U mask) {
  NonFinite out;
  const U* s = static_cast<const U*>(src);
  U* d = static_cast<U*>(dst);
  for (size_t at = 0; at < n; at += kBlock) {
    const size_t len = std::min(kBlock, n - at);
    const U* block = d ? d + at : s + at;
    size_t c;
    if (d && kAvx2) {
      if (!copy_any_avx2(d + at, s + at, len, mask)) continue;
      c = count(block, len, mask);
    } else {
      if (d) std::memcpy(d + at, s + at, len * sizeof(U));
      c = count(block, len, mask);
    }
    if (c == 0) continue;
    if (out.count == 0) {
      size_t i = 0;
      while ((block[i] & mask) != mask) ++i;
      out.first = at + i;
      out.value = get_element(t, block, i);
    }
    out.count += c;
  }
  return out;
}

NonFinite dispatch(DType t, void* dst, const void* src, size_t n) {
  switch (t) {
    case DType::f32:
      return scan<uint32_t>(t, dst, src, n, 0x7f800000u);
    case DType::f64:
      return scan<uint64_t>(t, dst, src, n, 0x7ff0000000000000ull);
    case DType::f16:
      return scan<uint16_t>(t, dst, src, n, 0x7c00);
    case DType::bf16:
      return scan<uint16_t>(t, dst, src, n, 0x7f80);
    case DType::i32:
    case DType::i64:
    case DType::u8:
    case DType::i8:
      break;
  }
  if (dst) std::memcpy(dst, src, n * dtype_size(t));
  return {};
}

}  // namespace

void NonFiniteSeen::record(int rank, DType t, const void* data, size_t at, size_t n) {
  const uint64_t mask = mask_of(t);
  if (!mask) return;
  for (size_t i = 0; i < n; ++i) {
    if (!is_nonfinite(t, data, i, mask)) continue;
    const size_t e = at + i;
    size_t tensor = 0;
    if (!starts.empty()) {
      const auto it = std::upper_bound(starts.begin(), starts.end(), e);
      tensor = it == starts.begin() ? 0 : static_cast<size_t>(it - starts.begin()) - 1;
    }
    auto h = std::find_if(hits.begin(), hits.end(),
                          [&](const Hit& x) { return x.rank == rank && x.tensor == tensor; });
    if (h == hits.end()) {
      hits.push_back({rank, tensor, 0, e, get_element(t, data, i)});
      h = hits.end() - 1;
    } else if (e < h->first) {
      h->first = e;
      h->value = get_element(t, data, i);
    }
    ++h->count;
  }
}

void NonFiniteSeen::search(int rank, DType t, const void* data, size_t at, size_t n) {
  searched = true;
  if (!mask_of(t)) return;
  const size_t es = dtype_size(t);
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t m = std::min(kBlock, n - b);
    const void* p = static_cast<const uint8_t*>(data) + b * es;
    if (any_nonfinite(t, p, m)) record(rank, t, p, at + b, m);
  }
}

namespace {

// The general form, any float dtype and op: a block at a time, each
// searched operand's block tested before the block is reduced (it is then
// in L1 for the reduction). Measured (16 MiB of f32 a side) 16 % slower than
// the reduction alone out of place, 44 % in place, hence the form below for
// the common case.
void reduce_searching_blocks(DType t, ReduceOp op, uint8_t* d, const uint8_t* pa, const uint8_t* pb,
                             size_t n, int divisor, NonFiniteSeen& seen, size_t at, int a_rank,
                             int b_rank) {
  const size_t es = dtype_size(t);
  for (size_t i = 0; i < n; i += kReduceBlock) {
    const size_t m = std::min(kReduceBlock, n - i), off = i * es;
    if (a_rank >= 0 && any_nonfinite(t, pa + off, m)) seen.record(a_rank, t, pa + off, at + i, m);
    if (b_rank >= 0 && any_nonfinite(t, pb + off, m)) seen.record(b_rank, t, pb + off, at + i, m);
    reduce(t, op, d + off, pa + off, pb + off, m, divisor);
  }
}

// AVX2, f32 and f64 sums and averages (every DDP bucket of those types):
// one pass that loads a and b, adds (and divides), and tests the result
// before it stores it. A non-finite operand makes a non-finite sum, so a
// finite result clears both operands; the loop stops before storing the
// first vector whose result is not finite (a non-finite operand, or a sum
// that overflowed) and returns where, so that the operands are still whole
// there. The same additions and divisions as kernels::reduce, so the same
// bits.
template <typename F, bool kDivide>
__attribute__((target("avx2"))) size_t sum_until_nonfinite(F* d, const F* a, const F* b, size_t n,
                                                           F divisor) {
  size_t i = 0;
  // Two vectors a turn, tested together: one test and branch per two (in
  // L2, one per vector ran 30 % behind the plain loop).
  if constexpr (sizeof(F) == 4) {
    const __m256i m = _mm256_set1_epi32(0x7f800000);
    const __m256 v = _mm256_set1_ps(divisor);
    for (; i + 16 <= n; i += 16) {
      __m256 r0 = _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i));
      __m256 r1 = _mm256_add_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8));
      if constexpr (kDivide) {
        r0 = _mm256_div_ps(r0, v);
        r1 = _mm256_div_ps(r1, v);
      }
      const __m256i c =
          _mm256_or_si256(_mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(r0), m), m),
                          _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(r1), m), m));
      if (!_mm256_testz_si256(c, c)) return i;
      _mm256_storeu_ps(d + i, r0);
      _mm256_storeu_ps(d + i + 8, r1);
    }
  } else {
    const __m256i m = _mm256_set1_epi64x(0x7ff0000000000000ll);
    const __m256d v = _mm256_set1_pd(divisor);
    for (; i + 8 <= n; i += 8) {
      __m256d r0 = _mm256_add_pd(_mm256_loadu_pd(a + i), _mm256_loadu_pd(b + i));
      __m256d r1 = _mm256_add_pd(_mm256_loadu_pd(a + i + 4), _mm256_loadu_pd(b + i + 4));
      if constexpr (kDivide) {
        r0 = _mm256_div_pd(r0, v);
        r1 = _mm256_div_pd(r1, v);
      }
      const __m256i c =
          _mm256_or_si256(_mm256_cmpeq_epi64(_mm256_and_si256(_mm256_castpd_si256(r0), m), m),
                          _mm256_cmpeq_epi64(_mm256_and_si256(_mm256_castpd_si256(r1), m), m));
      if (!_mm256_testz_si256(c, c)) return i;
      _mm256_storeu_pd(d + i, r0);
      _mm256_storeu_pd(d + i + 4, r1);
    }
  }
  return i;
}

template <typename F>
void sum_searching(DType t, ReduceOp op, F* d, const F* a, const F* b, size_t n, int divisor,
                   NonFiniteSeen& seen, size_t at, int a_rank, int b_rank) {
  const auto* ua = reinterpret_cast<const uint8_t*>(a);
  const auto* ub = reinterpret_cast<const uint8_t*>(b);
  auto* ud = reinterpret_cast<uint8_t*>(d);
  for (size_t i = 0; i < n;) {
    i += divisor > 0
             ? sum_until_nonfinite<F, true>(d + i, a + i, b + i, n - i, static_cast<F>(divisor))
             : sum_until_nonfinite<F, false>(d + i, a + i, b + i, n - i, F{0});
    if (i == n) return;
    // A vector whose sum is not finite, or the tail: a block the general way.
    const size_t m = std::min(kReduceBlock, n - i), off = i * sizeof(F);
    reduce_searching_blocks(t, op, ud + off, ua + off, ub + off, m, divisor, seen, at + i, a_rank,
                            b_rank);
    i += m;
  }
}

}  // namespace

void reduce_searching(DType t, ReduceOp op, void* dst, const void* a, const void* b, size_t n,
                      int divisor, NonFiniteSeen& seen, size_t at, int a_rank, int b_rank) {
  seen.searched = true;
  if (!mask_of(t) || (a_rank < 0 && b_rank < 0)) return reduce(t, op, dst, a, b, n, divisor);
  const bool sum = op == ReduceOp::sum || op == ReduceOp::avg;
  if (kAvx2 && sum && t == DType::f32)
    return sum_searching(t, op, static_cast<float*>(dst), static_cast<const float*>(a),
                         static_cast<const float*>(b), n, divisor, seen, at, a_rank, b_rank);
  if (kAvx2 && sum && t == DType::f64)
    return sum_searching(t, op, static_cast<double*>(dst), static_cast<const double*>(a),
                         static_cast<const double*>(b), n, divisor, seen, at, a_rank, b_rank);
  if (sum && (t == DType::f16 || t == DType::bf16)) {
    // The reduction widens each block to f32 anyway: its results are
    // tested there, in L1, and only a block that is not all finite has its
    // operands searched, before it is stored.
    struct Ctx {
      DType t;
      const uint8_t *a, *b;
      NonFiniteSeen& seen;
      size_t at;
      int a_rank, b_rank;
    } ctx{t,     static_cast<const uint8_t*>(a), static_cast<const uint8_t*>(b), seen, at, a_rank,
          b_rank};
    return reduce16_watching(
        t, op, dst, a, b, n, divisor,
        [](void* p, size_t i, size_t m) {
          auto& c = *static_cast<Ctx*>(p);
          if (c.a_rank >= 0) c.seen.record(c.a_rank, c.t, c.a + 2 * i, c.at + i, m);
          if (c.b_rank >= 0) c.seen.record(c.b_rank, c.t, c.b + 2 * i, c.at + i, m);
        },
        &ctx);
  }
  reduce_searching_blocks(t, op, static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(a),
                          static_cast<const uint8_t*>(b), n, divisor, seen, at, a_rank, b_rank);
}

NonFinite find_nonfinite(DType t, const void* data, size_t n) {
  return dispatch(t, nullptr, data, n);
}

NonFinite copy_find_nonfinite(DType t, void* dst, const void* src, size_t n) {
  return dispatch(t, dst, src, n);
}

}  // namespace collie::kernels
