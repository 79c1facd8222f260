// tests/test_arrivals.cc: which rank arrived last (base/arrivals.h,
// Communicator::arrivals). The comparison against hand-made logs whose
// answer is known, and over the fake backend (every rank a thread) with one
// rank held back by a delay the test injects before each collective: that
// rank must be named, about that long after the first, on every rank.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "base/arrivals.h"
#include "fake_world.h"
#include "reducer/reducer.h"

namespace collie {
namespace {

using arrivals::Log;

// A log with runs[i] units for collective first + i, and `ns` per unit.
std::vector<uint64_t> log_of(uint32_t first, const std::vector<uint32_t>& runs, double ns) {
  std::vector<uint64_t> v(Log::kEntries + 1, 0);
  for (size_t i = 0; i < runs.size(); ++i) {
    const uint32_t seq = first + static_cast<uint32_t>(i);
    v[seq % Log::kEntries] = (static_cast<uint64_t>(seq) << 32) | runs[i];
  }
  std::memcpy(&v[Log::kEntries], &ns, sizeof ns);
  return v;
}

TEST(Arrivals, TheShortestRunArrivedLastAndTheSpreadIsHowLongAfterTheFirst) {
  // Collectives 1-5 on 3 ranks, 1 ns a unit on ranks 0 and 2, 2 on rank 1
  // (its counter ticks at half the rate: its runs count double).
  const auto logs = std::vector<std::vector<uint64_t>>{
      log_of(1, {5000, 9000, 7000, 100, 8000}, 1),
      log_of(1, {2000, 4000, 3000, 2000, 3500}, 2),
      log_of(1, {1000, 1000, 1000, 3000, 1000}, 1),
  };
  uint32_t through = 0;
  const Arrivals a = arrivals::compare(logs, 0, &through);
  EXPECT_EQ(through, 5u);
  EXPECT_EQ(a.collectives, 5u);
  // Rank 2 ran shortest in 1, 2, 3, 5 (by 4000, 8000, 6000, 7000 ns), rank
  // 0 in 4 (by 3900 ns).
  EXPECT_EQ(a.last, (std::vector<uint64_t>{1, 0, 4}));
  EXPECT_DOUBLE_EQ(a.median_late_ms[2], 0.007);  // of 4000, 6000, 7000, 8000: the upper
  EXPECT_DOUBLE_EQ(a.median_late_ms[0], 0.0039);
  EXPECT_EQ(a.summary(),
            "rank 2 arrived last in 80 % of 5 collectives, median 0.007 ms after the first; "
            "rank 0 in 20 %, median 0.004 ms after the first");
  // Already compared: nothing new.
  EXPECT_EQ(arrivals::compare(logs, through).collectives, 0u);
  EXPECT_EQ(arrivals::compare(logs, 3).collectives, 2u);
}

TEST(Arrivals, OnlyCollectivesThatEveryRankHasEndedAreCompared) {
  // Rank 1 has not ended 4 yet, and 2 is missing on rank 0 (not a host
  // collective there, or a step's number): 1 and 3 are compared.
  std::vector<std::vector<uint64_t>> logs{log_of(1, {10, 10, 10, 10}, 1),
                                          log_of(1, {20, 20, 20}, 1)};
  logs[0][2] = 0;
  uint32_t through = 0;
  const Arrivals b = arrivals::compare(logs, 0, &through);
  EXPECT_EQ(through, 3u);
  EXPECT_EQ(b.collectives, 2u);
  EXPECT_EQ(b.last, (std::vector<uint64_t>{2, 0}));
  // A log that is off (all zero) compares nothing.
  std::vector<uint64_t> off(Log::kEntries + 1, 0);
  EXPECT_EQ(arrivals::compare({logs[0], off}, 0).collectives, 0u);
  EXPECT_EQ(Arrivals{}.summary(), "");
}

TEST(Arrivals, LargeCollectivesAreAllTimedAndOneSmallOneInEight) {
  OpDesc d{OpKind::allreduce, DType::f32, ReduceOp::sum, 0, 0, 4096};
  int timed = 0;
  for (uint32_t seq = 1; seq <= 64; ++seq) {
    d.seq = seq;
    d.count = 4096;  // 16 KiB
    EXPECT_TRUE(arrivals::timed(d));
    d.count = 4095;
    timed += arrivals::timed(d);
  }
  EXPECT_EQ(timed, 64 / 8);
}

TEST(Arrivals, ARankHeldBackByAKnownDelayIsNamedOnEveryRank) {
  // Rank 1 of 3 sleeps 20 ms before each of 12 all-reduces; the others
  // issue theirs at once. It arrives last at every one, about 20 ms after
  // the first (its run is short, theirs is the wait for it).
  constexpr int kOps = 12;
  const auto delay = milliseconds(20);
  std::vector<Arrivals> told(3);
  auto ended = run_world(3, [&](Communicator& c) -> std::string {
    std::vector<float> v(4096, 1.0f);  // 16 KiB: every one timed (arrivals::timed)
    for (int i = 0; i < kOps; ++i) {
      if (c.rank() == 1) std::this_thread::sleep_for(delay);
      c.allreduce(view_of(v.data(), v.size()), view_of(v.data(), v.size()), ReduceOp::sum).wait();
    }
    told[c.rank()] = c.arrivals();
    // The next comparison covers only what came after this one.
    c.allreduce(view_of(v.data(), v.size()), view_of(v.data(), v.size()), ReduceOp::sum).wait();
    const Arrivals again = c.arrivals();
    if (again.collectives != 2)  // the first comparison's all-gather and the all-reduce
      return "the second comparison covered " + std::to_string(again.collectives);
    return "";
  });
  expect_all_ok(ended, "one rank held back");
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(told[r].collectives, static_cast<uint64_t>(kOps)) << "rank " << r;
    EXPECT_GE(told[r].last.at(1), static_cast<uint64_t>(kOps - 1)) << told[r].summary();
    EXPECT_GE(told[r].median_late_ms.at(1), 0.8 * delay.count()) << told[r].summary();
    EXPECT_LE(told[r].median_late_ms.at(1), 5.0 * delay.count()) << told[r].summary();
    EXPECT_EQ(told[r].summary(), told[0].summary());
  }
  EXPECT_EQ(told[0].summary().rfind("rank 1 arrived last in ", 0), 0u) << told[0].summary();
}

TEST(Arrivals, TheCAbiGivesTheCountsTheMediansAndTheSentence) {
  // Rank 1 of 2 held back 20 ms before each of 5 all-reduces.
  const auto bad = run_c_world(2, "arrivals_c_abi", [](collie_comm* comm, int r) -> std::string {
    std::vector<float> v(4096);  // 16 KiB: every one timed
    collie_tensor t{};
    t.data = v.data();
    t.numel = v.size();
    t.dtype = COLLIE_F32;
    for (int i = 0; i < 5; ++i) {
      if (r == 1) std::this_thread::sleep_for(milliseconds(20));
      if (collie_comm_allreduce(comm, t, t, COLLIE_SUM, nullptr) != COLLIE_OK)
        return std::string("allreduce: ") + collie_last_error();
    }
    uint64_t count = 0, last[2] = {9, 9};
    double late[2] = {-1, -1};
    char text[256], cut[10];
    if (collie_comm_arrivals(comm, &count, last, late, text, sizeof text) != COLLIE_OK)
      return std::string("arrivals: ") + collie_last_error();
    if (count != 5 || last[1] < 4 || last[0] + last[1] != 5 || late[1] < 16 || late[1] > 100)
      return "told " + std::to_string(count) + " compared, last " + std::to_string(last[0]) +
             " and " + std::to_string(last[1]) + ", rank 1 " + std::to_string(late[1]) + " ms";
    if (std::string(text).rfind("rank 1 arrived last in ", 0) != 0)
      return "said: " + std::string(text);
    // Cut to fit; nothing new to compare; no summary asked for.
    if (collie_comm_arrivals(comm, &count, nullptr, nullptr, cut, sizeof cut) != COLLIE_OK ||
        std::strlen(cut) != sizeof cut - 1 || count != 1)  // the first call's all-gather
      return "the second call: " + std::to_string(count) + " '" + cut + "'";
    if (collie_comm_arrivals(comm, nullptr, nullptr, nullptr, nullptr, 0) !=
        COLLIE_ERR_INVALID_ARGUMENT)
      return "no place for the count was taken";
    return "";
  });
  for (size_t r = 0; r < bad.size(); ++r) EXPECT_EQ(bad[r], "") << "rank " << r;
}

TEST(Arrivals, RanksWithTheAccountOffStillMeetAndCompareNothing) {
  // COLLIE_ARRIVALS=0 on every rank (it is read as each rank connects):
  // the comparison is one all-gather that finds nothing.
  ScopedEnv off("COLLIE_ARRIVALS", "0");
  auto ended = run_world(2, [&](Communicator& c) -> std::string {
    c.barrier().wait();
    const Arrivals a = c.arrivals();
    return a.collectives == 0 && a.summary().empty() ? "" : "compared " + a.summary();
  });
  expect_all_ok(ended, "off");
}

}  // namespace
}  // namespace collie
