// tests/test_powersgd.cc: PowerSGD and batched PowerSGD through the
// reducer, over real processes (run under collie-run). Checked against
// references computed here in float64: an exactly low-rank average comes
// back exactly; error feedback keeps the sum of what was applied within a
// bounded distance of the sum of the true averages (and without it the
// distance grows); a 1024 x 1024 gradient at rank 1 travels in 1/512 of its
// bytes; the parameters are validated with messages that name them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "collie/comm.h"
#include "hooks/powersgd.h"
#include "mp_common.h"
#include "mp_test.h"
#include "reducer/reducer.h"

namespace collie {
namespace {

Communicator& comm() {
  return testing::world();
}

using testing::error_of;

// A model of a few tensors with their own gradient buffers; step() sets the
// gradients, runs one reducer iteration and leaves the result in grads.
struct Model {
  std::vector<size_t> sizes, rows;
  std::vector<std::vector<float>> values, grads;
  std::unique_ptr<Reducer> red;

  Model(std::vector<size_t> sz, std::vector<size_t> rw, const std::string& hook,
        size_t bucket_bytes = 25u << 20)
      : sizes(std::move(sz)), rows(std::move(rw)) {
    std::vector<Parameter> ps;
    for (size_t i = 0; i < sizes.size(); ++i) {
      values.emplace_back(sizes[i], 0.0f);
      grads.emplace_back(sizes[i], 0.0f);
    }
    for (size_t i = 0; i < sizes.size(); ++i)
      ps.push_back(
          {view_of(values[i].data(), sizes[i]), view_of(grads[i].data(), sizes[i]), rows[i]});
    ReducerOptions opt;
    opt.comm_hook = hook;
    opt.bucket_bytes = bucket_bytes;
    opt.first_bucket_bytes = bucket_bytes;
    red = std::make_unique<Reducer>(comm(), ps, opt);
  }

  void step() {
    red->prepare_for_backward();
    for (size_t i = sizes.size(); i-- > 0;) red->mark_grad_ready(i);
    red->finalize_backward();
  }
};

TEST(PowerSgdRule, CompressesOnlyWhenItSavesTheRate) {
  EXPECT_TRUE(powersgd_compresses(1024, 1024, 1, 2));
  EXPECT_FALSE(powersgd_compresses(3, 5, 1, 2));     // (3+5)*2 = 16 >= 15
  EXPECT_TRUE(powersgd_compresses(5, 6, 1, 2));      // 22 < 30
  EXPECT_FALSE(powersgd_compresses(64, 64, 16, 2));  // (64+64)*16*2 = 4096, not < 4096
  EXPECT_FALSE(powersgd_compresses(0, 10, 1, 2));
}

TEST(PowerSgdParams, BadValuesNameTheParameterAndWhatIsAccepted) {
  std::string m = error_of([] { make_comm_hook("powersgd:rank=0"); });
  EXPECT_NE(m.find("rank='0'"), std::string::npos) << m;
  m = error_of([] { make_comm_hook("powersgd:start_iter=1"); });
  EXPECT_NE(m.find("start_iter=1"), std::string::npos) << m;
  EXPECT_NE(m.find("must be > 1"), std::string::npos) << m;
  m = error_of([] { make_comm_hook("powersgd:warm_start=maybe"); });
  EXPECT_NE(m.find("not a boolean"), std::string::npos) << m;
  m = error_of([] { make_comm_hook("powersgd:ranks=2"); });
  EXPECT_NE(m.find("no parameter 'ranks'"), std::string::npos) << m;
  EXPECT_NE(m.find("it takes rank, start_iter, min_compression_rate"), std::string::npos) << m;
  // Without error feedback and warm start, compressing from the start is allowed.
  EXPECT_EQ(make_comm_hook("powersgd:start_iter=0,error_feedback=0,warm_start=0")->name(),
            "powersgd");
  EXPECT_EQ(make_comm_hook("batched_powersgd:rank=2,start_iter=2")->name(), "batched_powersgd");
}

// Every rank's gradient is A (c_q B)^T, so the average over ranks is exactly
// rank r: PowerSGD at rank r must give it back to float precision, while the
// bias and the matrix too small to compress travel exactly.
void check_exact_low_rank(const std::string& spec, int r, double tol = 2e-5,
                          size_t wire_bytes = 4) {
  const int n = comm().size(), me = comm().rank();
  const size_t rows = 40, cols = 30, small_r = 3, small_c = 4, bias = 7;
  Model m({rows * cols, bias, small_r * small_c}, {rows, 0, small_r}, spec);
  std::mt19937_64 g(5);
  std::normal_distribution<double> nd;
  std::vector<double> A(rows * r), B(cols * r), b0(bias), s0(small_r * small_c);
  for (auto& x : A) x = nd(g);
  for (auto& x : B) x = nd(g);
  for (auto& x : b0) x = nd(g);
  for (auto& x : s0) x = nd(g);
  auto scale = [](int q, int step) { return 1.0 + 0.25 * q + 0.1 * step; };
  for (int step = 0; step < 6; ++step) {
    std::vector<double> want(rows * cols, 0.0);
    for (size_t i = 0; i < rows; ++i)
      for (size_t j = 0; j < cols; ++j) {
        double a = 0;
        for (int k = 0; k < r; ++k) a += A[i * r + k] * B[j * r + k];
        m.grads[0][i * cols + j] = static_cast<float>(a * scale(me, step));
        for (int q = 0; q < n; ++q)
          want[i * cols + j] += static_cast<float>(a * scale(q, step)) / n;
      }
    for (size_t i = 0; i < bias; ++i) m.grads[1][i] = static_cast<float>(b0[i] * scale(me, step));
    for (size_t i = 0; i < s0.size(); ++i)
      m.grads[2][i] = static_cast<float>(s0[i] * scale(me, step));
    m.step();
    double worst = 0, norm = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      worst = std::max(worst, std::abs(m.grads[0][i] - want[i]));
      norm = std::max(norm, std::abs(want[i]));
    }
    EXPECT_LE(worst, tol * norm) << spec << " step " << step;
    auto avg_of = [&](double base, int q_step) {
      double s = 0;
      for (int q = 0; q < n; ++q) s += static_cast<float>(base * scale(q, q_step));
      return s / n;
    };
    const double plain_tol = tol > 1e-4 ? tol : 1e-6;
    for (size_t i = 0; i < bias; ++i)
      EXPECT_NEAR(m.grads[1][i], avg_of(b0[i], step), plain_tol * (1 + std::abs(b0[i]) * 3))
          << spec;
    for (size_t i = 0; i < s0.size(); ++i)
      EXPECT_NEAR(m.grads[2][i], avg_of(s0[i], step), plain_tol * (1 + std::abs(s0[i]) * 3))
          << spec;
  }
  // The compressed steps sent far fewer bytes than the gradients.
  if (spec.find("batched") == std::string::npos) {
    const auto& st = m.red->last_stats();
    EXPECT_EQ(st.hook_bytes, ((rows + cols) * r + bias + small_r * small_c) * wire_bytes) << spec;
  }
}

TEST(PowerSgdExact, RankOneAverageComesBackExactly) {
  check_exact_low_rank("powersgd:start_iter=2", 1);
}
TEST(PowerSgdExact, RankTwoAverageComesBackExactly) {
  check_exact_low_rank("powersgd:rank=2,start_iter=2", 2);
}
// Inside fp16_wrap / bf16_wrap the bucket is 16-bit: PowerSGD widens it,
// and P and Q travel in the 16-bit type (half the bytes), so the result is
// exact to that type's rounding u (2^-11, 2^-8), relative to the largest
// value: the bucket, the result, and P and Q on each of the n ring steps are
// rounded (2n + 2 roundings), error feedback carries the previous step's
// rounding into this one (x2), and the factors' scale is a row norm times a
// column norm, within 2x of the largest element here: 32 u at 3 ranks.
// (Measured: 11 u for fp16, 18 u for bf16.)
TEST(PowerSgdExact, InsideSixteenBitWrappersExactToTheirRounding) {
  check_exact_low_rank("fp16_wrap:powersgd:start_iter=2", 1, 32 * std::ldexp(1.0, -11), 2);
  check_exact_low_rank("bf16_wrap:powersgd:rank=2,start_iter=2", 2, 32 * std::ldexp(1.0, -8), 2);
}

TEST(PowerSgdExact, WithoutWarmStartOrErrorFeedbackToo) {
  check_exact_low_rank("powersgd:rank=3,start_iter=0,warm_start=0,error_feedback=0", 3);
}

// Warm start with singular values far apart (1, 1e-4, 1e-6): the reused Q
// must be orthogonalised every step, or the power iteration squares the
// condition number and the second direction drowns in rounding. At rank 2
// the result must stay within rounding of the best rank-2 approximation,
// whose own error is 1e-6, for many steps after the first compressed one.
TEST(PowerSgdWarmStart, IllConditionedGradientsStayNearTheBestApproximation) {
  const size_t rows = 200, cols = 150;
  std::mt19937_64 g(11);
  std::normal_distribution<double> nd;
  // Orthonormal u_k, v_k (Gram-Schmidt in double), M = sum sigma_k u_k v_k^T.
  auto basis = [&](size_t len) {
    std::vector<std::vector<double>> b(3, std::vector<double>(len));
    for (auto& v : b)
      for (auto& x : v) x = nd(g);
    for (size_t k = 0; k < 3; ++k) {
      for (size_t j = 0; j < k; ++j) {
        double d = 0;
        for (size_t i = 0; i < len; ++i) d += b[k][i] * b[j][i];
        for (size_t i = 0; i < len; ++i) b[k][i] -= d * b[j][i];
      }
      double n = 0;
      for (double x : b[k]) n += x * x;
      for (double& x : b[k]) x /= std::sqrt(n);
    }
    return b;
  };
  auto u = basis(rows), v = basis(cols);
  const double sigma[3] = {1.0, 1e-4, 1e-6};
  Model m({rows * cols}, {rows}, "powersgd:rank=2,start_iter=2,error_feedback=0");
  for (int step = 0; step < 14; ++step) {
    std::vector<double> best(rows * cols, 0.0);
    for (size_t i = 0; i < rows; ++i)
      for (size_t j = 0; j < cols; ++j) {
        double full = 0;
        for (int k = 0; k < 3; ++k) full += sigma[k] * u[k][i] * v[k][j];
        best[i * cols + j] = sigma[0] * u[0][i] * v[0][j] + sigma[1] * u[1][i] * v[1][j];
        m.grads[0][i * cols + j] = static_cast<float>(full);  // the same on every rank
      }
    m.step();
    double err2 = 0;
    for (size_t i = 0; i < best.size(); ++i)
      err2 += (m.grads[0][i] - best[i]) * (m.grads[0][i] - best[i]);
    // Steps 0-1 are plain all-reduce (the error is sigma_3 itself); step 2
    // starts from a random Q, one power iteration (8e-5 here); from then on
    // the warm-started Q has converged.
    if (step != 2) {
      EXPECT_LE(std::sqrt(err2), 1e-5) << "step " << step
                                       << ": Frobenius distance from the best rank-2 "
                                          "approximation (whose own error is 1e-6)";
    }
  }
}

// Applied updates against true averages over many steps: gradients with a
// persistent full-rank part plus noise. The residual (sum of true averages
// minus sum of what the hook returned) equals the mean error-feedback
// memory: it must stay bounded with error feedback, and grows without it.
double residual_after(const std::string& spec, int steps, std::vector<double>* trace) {
  const int n = comm().size(), me = comm().rank();
  const size_t rows = 24, cols = 16;
  Model m({rows * cols}, {rows}, spec);
  std::mt19937_64 g0(21);
  std::normal_distribution<double> nd;
  std::vector<double> G0(rows * cols);
  for (auto& x : G0) x = nd(g0);
  std::vector<double> sum_true(rows * cols, 0.0), sum_got(rows * cols, 0.0);
  double resid = 0;
  for (int step = 0; step < steps; ++step) {
    std::vector<double> avg(rows * cols, 0.0);
    for (int q = 0; q < n; ++q) {
      std::mt19937_64 gq(1000 * step + q);
      for (size_t i = 0; i < avg.size(); ++i) {
        float v = static_cast<float>(G0[i] + 0.5 * nd(gq));
        avg[i] += static_cast<double>(v) / n;
        if (q == me) m.grads[0][i] = v;
      }
    }
    m.step();
    double r2 = 0, t2 = 0;
    for (size_t i = 0; i < avg.size(); ++i) {
      sum_true[i] += avg[i];
      sum_got[i] += m.grads[0][i];
      r2 += (sum_true[i] - sum_got[i]) * (sum_true[i] - sum_got[i]);
      t2 += G0[i] * G0[i];
    }
    resid = std::sqrt(r2 / t2);  // in units of one step's true gradient
    if (trace) trace->push_back(resid);
  }
  return resid;
}

TEST(PowerSgdErrorFeedback, TheSumOfAppliedUpdatesTracksTheSumOfTrueAverages) {
  std::vector<double> with, without;
  residual_after("powersgd:start_iter=2", 200, &with);
  residual_after("powersgd:start_iter=2,error_feedback=0", 200, &without);
  double first = 0, second = 0;
  for (size_t i = 0; i < with.size(); ++i)
    (i < 100 ? first : second) = std::max(i < 100 ? first : second, with[i]);
  // Bounded: after a rank-1 compressor has had time to fill its memory,
  // the residual stops growing (it levels off near 10 steps' worth here;
  // min(rows, cols) = 16 is a ceiling with room), however long it runs.
  EXPECT_LE(first, 16.0);
  EXPECT_LE(second, 1.3 * first) << "the residual kept growing with error feedback";
  // Without it the lost part piles up step after step.
  EXPECT_GT(without.back(), 1.8 * without[99]);
  EXPECT_GT(without.back(), 10 * with.back());
}

TEST(PowerSgdCompression, A1024SquareGradientAtRankOneTravelsInA512thOfItsBytes) {
  Model m({1024 * 1024}, {1024}, "powersgd:start_iter=2");
  for (int step = 0; step < 3; ++step) {
    for (size_t i = 0; i < m.grads[0].size(); ++i)
      m.grads[0][i] = static_cast<float>((i * 7 + step) % 13) - 6;
    m.step();
    const auto& st = m.red->last_stats();
    double ratio = static_cast<double>(st.gradient_bytes) / static_cast<double>(st.hook_bytes);
    if (step < 2)
      EXPECT_DOUBLE_EQ(ratio, 1.0) << "plain all-reduce before start_iter";
    else
      EXPECT_GE(ratio, 500.0);
  }
}

// Batched: the whole bucket as one square matrix. Exactness is checked on a
// bucket that is itself a rank-1 square (the padded view of 36 = 6 x 6).
TEST(BatchedPowerSgd, ExactOnARankOneSquareBucketAndBoundedOnNoise) {
  const int n = comm().size(), me = comm().rank();
  Model m({36}, {0}, "batched_powersgd:start_iter=2");
  for (int step = 0; step < 4; ++step) {
    std::vector<double> want(36, 0.0);
    for (size_t i = 0; i < 6; ++i)
      for (size_t j = 0; j < 6; ++j) {
        double a = (1.0 + i) * (2.0 - 0.5 * j);
        m.grads[0][i * 6 + j] = static_cast<float>(a * (1 + me));
        for (int q = 0; q < n; ++q) want[i * 6 + j] += static_cast<float>(a * (1 + q)) / n;
      }
    m.step();
    for (size_t i = 0; i < 36; ++i)
      EXPECT_NEAR(m.grads[0][i], want[i], 2e-5 * 30) << "step " << step;
  }
  EXPECT_EQ(m.red->last_stats().hook_bytes, 2 * 6 * sizeof(float));
}

// Every rank holds bit-identical results (all reduce the same factors).
TEST(PowerSgdConsistency, EveryRankHoldsTheSameBits) {
  Model m({50 * 20, 20}, {50, 0}, "powersgd:rank=2,start_iter=2");
  const int me = comm().rank();
  for (int step = 0; step < 5; ++step) {
    std::mt19937_64 g(77 + 31 * me + step);
    std::normal_distribution<double> nd;
    for (auto& v : m.grads)
      for (auto& x : v) x = static_cast<float>(nd(g));
    m.step();
  }
  const int n = comm().size();
  std::vector<float> all(n * m.grads[0].size());
  comm()
      .allgather(view_of(m.grads[0].data(), m.grads[0].size()), view_of(all.data(), all.size()))
      .wait();
  for (int q = 1; q < n; ++q)
    EXPECT_EQ(std::memcmp(all.data(), all.data() + q * m.grads[0].size(), m.grads[0].size() * 4), 0)
        << q;
}

}  // namespace
}  // namespace collie
