// tests/test_nonfinite.cc: base/nonfinite.h, the search for NaN and Inf,
// against a serial reference (std::isfinite on each element as a double),
// for every float dtype, at lengths around its blocks, alone, while copying
// and while reducing (against kernels::reduce for the result).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "base/element.h"
#include "base/nonfinite.h"
#include "base/reduce.h"

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

// reduce_searching: the same result as kernels::reduce, bit for bit (in
// place too), and in `seen` each searched operand's non-finite elements by
// tensor, as an element-by-element reference finds them; an operand given
// no rank (-1) is not searched. Sums and averages. The lengths put a
// non-finite element alone in its block of 1024 at every kind of place the
// f16/bf16 kernels have: a vector's first or second eight of sixteen
// (n=3000: element 1500), the eight after them, the scalar tail (n=1, 17).
TEST(Nonfinite, TheSearchInsideAReductionFindsWhatTheReferenceFinds) {
  const double kBad[] = {std::numeric_limits<double>::quiet_NaN(), INFINITY, -INFINITY};
  for (DType t : {DType::f32, DType::f64, DType::f16, DType::bf16})
    for (size_t n : {1ul, 17ul, 1023ul, 1024ul, 1025ul, 3000ul, 5000ul})
      for (int who = 0; who < 4; ++who)            // searched: both, a only, b only, neither
        for (int alias = 0; alias < 4; ++alias) {  // dst is a (odd); a sum (from 2) or an average
          const ReduceOp op = alias < 2 ? ReduceOp::avg : ReduceOp::sum;
          const int divisor = alias < 2 ? 3 : 0;
          const size_t es = dtype_size(t), at = 1000;  // the operands' place in the buffer
          std::vector<uint8_t> a(n * es), b(n * es), want(n * es), got(n * es);
          for (size_t i = 0; i < n; ++i) {
            put_element(t, a.data(), i, 0.25 * static_cast<double>(i % 9));
            put_element(t, b.data(), i, -0.5 * static_cast<double>(i % 5));
          }
          put_element(t, a.data(), n / 2, kBad[0]);
          put_element(t, a.data(), n - 1, kBad[1]);
          put_element(t, b.data(), n / 3, kBad[2]);
          kernels::reduce(t, op, want.data(), a.data(), b.data(), n, divisor);
          const int a_rank = (who == 0 || who == 1) ? 4 : -1;
          const int b_rank = (who == 0 || who == 2) ? 7 : -1;
          kernels::NonFiniteSeen seen;
          seen.starts = {0, at + n / 2};  // two tensors: the buffer's first `at` elements and more
          std::vector<uint8_t> a_copy = a;
          void* dst = alias % 2 ? a.data() : got.data();
          kernels::reduce_searching(t, op, dst, a.data(), b.data(), n, divisor, seen, at, a_rank,
                                    b_rank);
          const std::string where = std::string(to_string(t)) + " n=" + std::to_string(n) +
                                    " who=" + std::to_string(who) + " " +
                                    std::string(to_string(op)) + (alias % 2 ? " in place" : "");
          EXPECT_TRUE(seen.searched) << where;
          // The result: NaN where kernels::reduce gives NaN, else the same bits.
          for (size_t i = 0; i < n; ++i) {
            const double w = get_element(t, want.data(), i), g = get_element(t, dst, i);
            if (std::isnan(w))
              EXPECT_TRUE(std::isnan(g)) << where << " element " << i;
            else
              EXPECT_EQ(std::memcmp(want.data() + i * es, static_cast<uint8_t*>(dst) + i * es, es),
                        0)
                  << where << " element " << i;
          }
          // The hits: each searched operand's non-finite elements, by tensor.
          struct Want {
            int rank;
            size_t tensor, count, first;
          };
          std::vector<Want> wants;
          auto add = [&](int rank, const std::vector<uint8_t>& v) {
            if (rank < 0) return;
            for (size_t i = 0; i < n; ++i) {
              if (std::isfinite(get_element(t, v.data(), i))) continue;
              const size_t e = at + i, tensor = e >= seen.starts[1] ? 1 : 0;
              auto w = std::find_if(wants.begin(), wants.end(), [&](const Want& x) {
                return x.rank == rank && x.tensor == tensor;
              });
              if (w == wants.end())
                wants.push_back({rank, tensor, 1, e});
              else
                ++w->count;
            }
          };
          add(a_rank, a_copy);
          add(b_rank, b);
          ASSERT_EQ(seen.hits.size(), wants.size()) << where;
          for (const Want& w : wants) {
            auto h = std::find_if(seen.hits.begin(), seen.hits.end(), [&](const auto& x) {
              return x.rank == w.rank && x.tensor == w.tensor;
            });
            ASSERT_NE(h, seen.hits.end()) << where << ": rank " << w.rank << " tensor " << w.tensor;
            EXPECT_EQ(h->count, w.count) << where;
            EXPECT_EQ(h->first, w.first) << where;
            EXPECT_FALSE(std::isfinite(h->value)) << where;
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
