// tests/test_nonfinite.cc: base/nonfinite.h, the search for NaN and Inf,
// against a serial reference (std::isfinite on each element as a double),
// for every float dtype, at lengths around its 4096-element blocks, alone
// and while copying.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "base/element.h"
#include "base/nonfinite.h"

namespace collie {
namespace {

struct Reference {
  size_t count = 0, first = 0;
  double value = 0;
};

Reference reference(DType t, const void* data, size_t n) {
  Reference r;
  for (size_t i = 0; i < n; ++i) {
    const double v = get_element(t, data, i);
    if (std::isfinite(v)) continue;
    if (r.count++ == 0) {
      r.first = i;
      r.value = v;
    }
  }
  return r;
}

TEST(Nonfinite, FindsWhatAnElementByElementSearchFindsInEveryFloatType) {
  const double kBad[] = {std::numeric_limits<double>::quiet_NaN(), INFINITY, -INFINITY};
  for (DType t : {DType::f32, DType::f64, DType::f16, DType::bf16})
    for (size_t n : {0ul, 1ul, 4095ul, 4096ul, 4097ul, 12289ul})
      for (int pattern = 0; pattern < 4; ++pattern) {
        std::vector<uint8_t> src(n * dtype_size(t)), dst(src.size());
        // Large finite values too (65504 is f16's largest): only the
        // exponent's all-ones pattern is non-finite.
        for (size_t i = 0; i < n; ++i)
          put_element(t, src.data(), i, (i % 7 == 3) ? 65504.0 : 0.5 * static_cast<double>(i % 13));
        if (pattern > 0 && n > 0) {
          put_element(t, src.data(), (n * pattern) / 4, kBad[pattern - 1]);
          put_element(t, src.data(), n - 1, kBad[(pattern + 1) % 3]);
        }
        const Reference want = reference(t, src.data(), n);
        const std::string at = std::string(to_string(t)) + " n=" + std::to_string(n) + " pattern " +
                               std::to_string(pattern);
        for (bool copying : {false, true}) {
          auto got = copying ? kernels::copy_find_nonfinite(t, dst.data(), src.data(), n)
                             : kernels::find_nonfinite(t, src.data(), n);
          EXPECT_EQ(got.count, want.count) << at << (copying ? " copying" : "");
          if (want.count == 0) continue;
          EXPECT_EQ(got.first, want.first) << at;
          if (std::isnan(want.value)) {
            EXPECT_TRUE(std::isnan(got.value)) << at;
          } else {
            EXPECT_EQ(got.value, want.value) << at;
          }
          if (copying) {
            EXPECT_EQ(std::memcmp(dst.data(), src.data(), src.size()), 0) << at;
          }
        }
      }
}

TEST(Nonfinite, IntegersHaveNoneAndAreStillCopied) {
  std::vector<int32_t> src(5000), dst(5000);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<int32_t>(0x7f800000 + i);
  EXPECT_EQ(kernels::find_nonfinite(DType::i32, src.data(), src.size()).count, 0u);
  EXPECT_EQ(kernels::copy_find_nonfinite(DType::i32, dst.data(), src.data(), src.size()).count, 0u);
  EXPECT_EQ(dst, src);
}

}  // namespace
}  // namespace collie
