// tests/test_hier_choose.cc: comm/hier/hier_choose.h, which all-reduces
// hier runs in two stages: the small ones, and only on crowded hosts.
#include <gtest/gtest.h>

#include <string>

#include "comm/hier/hier_choose.h"

namespace collie::hier {
namespace {

TEST(HierChoose, CrowdedHostsRunSmallAllReducesInTwoStages) {
  EXPECT_TRUE(two_stage_allreduce(0, true));
  EXPECT_TRUE(two_stage_allreduce(8, true));
  EXPECT_TRUE(two_stage_allreduce(kTwoStageCrowdedBytes, true));
  EXPECT_FALSE(two_stage_allreduce(kTwoStageCrowdedBytes + 1, true));
  EXPECT_FALSE(two_stage_allreduce(256 << 20, true));
}

// Each rank of a host runs a stage with another beside it: 2 ranks on 2
// CPUs are crowded under hier, 1 rank is not (the launcher's verdict, where
// it gives one, decides).
TEST(HierChoose, AHostIsCrowdedWhereItsRanksAndTheThreadsBesideThemOutnumberItsCpus) {
  const config::Env none = [](const char*) -> const char* { return nullptr; };
  EXPECT_FALSE(host_crowded(1, 2, none));
  EXPECT_TRUE(host_crowded(2, 2, none));
  EXPECT_FALSE(host_crowded(2, 4, none));
  EXPECT_TRUE(host_crowded(3, 4, none));
  const config::Env told_fit = [](const char* n) -> const char* {
    return std::string(n) == "OMPI_MCA_mpi_oversubscribe" ? "0" : nullptr;
  };
  EXPECT_FALSE(host_crowded(2, 2, told_fit));
}

// A staged runner counts the thread beside each rank where tcp and mpi
// choose to spin; a runner alone counts the ranks.
TEST(HierChoose, AStagedPartCountsTheThreadBesideEachOfItsHostsRanks) {
  BackendContext ctx;
  ctx.launch.local_world_size = 2;
  EXPECT_EQ(ctx.busy_threads_on_host(), 2);
  ctx.beside_per_rank = kBesideEachStage;
  EXPECT_EQ(ctx.busy_threads_on_host(), 4);
}

TEST(HierChoose, HostsWithCoresToSpareGoTheHierarchicalWayAtEverySize) {
  for (size_t bytes : {size_t{0}, size_t{8}, kTwoStageCrowdedBytes, size_t{256} << 20})
    EXPECT_FALSE(two_stage_allreduce(bytes, false)) << bytes;
}

}  // namespace
}  // namespace collie::hier
