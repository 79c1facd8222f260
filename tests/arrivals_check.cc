// tests/arrivals_check.cc: which rank arrived last (base/arrivals.h) over
// real processes started by collie-run, on any backend: the last rank
// sleeps a known delay before each all-reduce, and every rank must name it,
// about that long after the first; then the reducer, whose log names it
// every COLLIE_REDUCER_LOG_EVERY iterations. Its process then ends, and
// with it the job: collie-run's own account at the end
// (tests/launch/arrivals_report.sh checks the logs and it) covers these
// collectives too.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "collie/comm.h"
#include "mp_test.h"
#include "reducer/reducer.h"

namespace collie {
namespace {

TEST(Arrivals, TheRankHeldBackByAKnownDelayIsNamedOnEveryRank) {
  Communicator& c = testing::world();
  const int n = c.size(), late = n - 1;
  if (n < 2) GTEST_SKIP() << "one rank: nobody to arrive after";
  constexpr int kOps = 10;
  const auto delay = std::chrono::milliseconds(20);
  c.arrivals();  // what came before (the connect) is not this test's
  std::vector<float> v(4096, 1.0f);
  for (int i = 0; i < kOps; ++i) {
    if (c.rank() == late) std::this_thread::sleep_for(delay);
    c.allreduce(view_of(v.data(), v.size()), view_of(v.data(), v.size()), ReduceOp::sum).wait();
  }
  const Arrivals a = c.arrivals();
  // The all-reduces and the first comparison's own all-gather.
  EXPECT_EQ(a.collectives, static_cast<uint64_t>(kOps + 1)) << a.summary();
  EXPECT_GE(a.last.at(late), static_cast<uint64_t>(kOps - 1)) << a.summary();
  EXPECT_GE(a.median_late_ms.at(late), 0.8 * delay.count()) << a.summary();
  EXPECT_LE(a.median_late_ms.at(late), 5.0 * delay.count()) << a.summary();
  std::printf("rank %d: %s\n", c.rank(), a.summary().c_str());
}

TEST(Arrivals, TheReducerTellsThemEveryLogInterval) {
  // The same rank starts each backward 20 ms late. Under COLLIE_DEBUG=INFO
  // and COLLIE_REDUCER_LOG_EVERY=5 rank 0's log then says, for iterations
  // 0 to 4 and 5 to 9, that it arrived last (the script reads the log).
  Communicator& c = testing::world();
  const int late = c.size() - 1;
  if (c.size() < 2) GTEST_SKIP() << "one rank: nobody to arrive after";
  std::vector<float> w0(4096, 0.5f), w1(64, 0.25f), g0(4096), g1(64);  // buckets over 16 KiB
  std::vector<Parameter> ps{{view_of(w0.data(), w0.size()), view_of(g0.data(), g0.size())},
                            {view_of(w1.data(), w1.size()), view_of(g1.data(), g1.size())}};
  Reducer red(c, ps, ReducerOptions{});
  for (int it = 0; it < 10; ++it) {
    if (c.rank() == late) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    red.prepare_for_backward();
    for (size_t i = 0; i < g0.size(); ++i) g0[i] = static_cast<float>(c.rank() + it);
    for (size_t i = 0; i < g1.size(); ++i) g1[i] = static_cast<float>(c.rank() - it);
    red.mark_grad_ready(1);
    red.mark_grad_ready(0);
    red.finalize_backward();
    const float n = static_cast<float>(c.size());
    ASSERT_EQ(g0[7], (n - 1) / 2 + static_cast<float>(it)) << "iteration " << it;
  }
}

}  // namespace
}  // namespace collie
