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
      break;
  }
  if (dst) std::memcpy(dst, src, n * dtype_size(t));
  return {};
}

}  // namespace

NonFinite find_nonfinite(DType t, const void* data, size_t n) {
  return dispatch(t, nullptr, data, n);
}

NonFinite copy_find_nonfinite(DType t, void* dst, const void* src, size_t n) {
  return dispatch(t, dst, src, n);
}

}  // namespace collie::kernels
