// tests/test_shm_segment.cc: comm/shm/segment.h's own decisions, on a
// segment of one rank (no store, no peer): whether a waiter may spin.
#include <gtest/gtest.h>
#include <sched.h>

#include <memory>

#include "comm/shm/segment.h"

namespace collie::shm {
namespace {

// A one-rank segment whose launch counts `local_ranks` ranks on this host,
// with `beside` threads busy beside each (hier's part inside a host: its
// stage across hosts, 1).
std::unique_ptr<Segment> one_rank(int local_ranks, int beside, bool crowded = false) {
  BackendContext ctx;
  ctx.launch.rank = 0;
  ctx.launch.world_size = 1;
  ctx.launch.local_rank = 0;
  ctx.launch.local_world_size = local_ranks;
  ctx.launch.timeout = std::chrono::seconds(10);
  ctx.key = "test-shm-segment";
  ctx.failure = std::make_shared<FailureLatch>();
  ctx.beside_per_rank = beside;
  ctx.crowded = crowded;
  return std::make_unique<Segment>(ctx, config::ShmTuning{}, SpinBudget(50, false));
}

int usable_cpus() {
  cpu_set_t s;
  CPU_ZERO(&s);
  return sched_getaffinity(0, sizeof s, &s) == 0 ? CPU_COUNT(&s) : 1;
}

// 2 hosts x 2 ranks sharing 2 cores spun in hier's shm stage while the
// threads beside it needed the cores: 0.4-1.7 ms per 8 B all-reduce,
// against 0.11-0.15 once the stage counted them (bench/RESULTS.md).
TEST(ShmSegment, AWaiterSpinsOnlyWhereTheThreadsBesideItFitToo) {
  const int cpus = usable_cpus();
  EXPECT_TRUE(one_rank(1, 0)->core_free()) << "alone on " << cpus << " CPUs";
  EXPECT_EQ(one_rank(1, cpus - 1)->core_free(), true)
      << "1 rank and " << cpus - 1 << " threads beside it on " << cpus << " CPUs";
  EXPECT_FALSE(one_rank(1, cpus)->core_free())
      << "1 rank and " << cpus << " threads beside it on " << cpus << " CPUs";
  EXPECT_FALSE(one_rank(1, 0)->crowded());
}

// A split's segment keeps the launch's count of local ranks; the others may
// run on other CPUs (bound), so they do not stop this one's waiters spinning.
TEST(ShmSegment, TheLaunchsOtherLocalRanksDoNotStopTheSpin) {
  EXPECT_TRUE(one_rank(usable_cpus() + 4, 0)->core_free());
}

// hier's small all-reduces on crowded hosts: a host's 2 ranks fit its 2
// CPUs, but the other host's 2 ranks share them unseen. Its shm segment
// spun (430 us per 8 B all-reduce, one scheduler tick a sample) until it
// took the job's verdict (bench/RESULTS.md, "hier's small all-reduces in
// two stages"): crowded, and so a waiter hands its CPU over.
TEST(ShmSegment, TheCallersCrowdedVerdictCrowdsASegmentThatFitsItsCpus) {
  EXPECT_FALSE(one_rank(1, 0, false)->crowded());
  EXPECT_TRUE(one_rank(1, 0, true)->crowded());
}

}  // namespace
}  // namespace collie::shm
