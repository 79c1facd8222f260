// tests/test_hier_choose.cc: comm/hier/hier_choose.h, which all-reduces
// hier sends over its flat mesh: the small ones, and only on crowded hosts.
#include <gtest/gtest.h>

#include "comm/hier/hier_choose.h"

namespace collie::hier {
namespace {

TEST(HierChoose, CrowdedHostsSendSmallAllReducesFlat) {
  EXPECT_TRUE(flat_allreduce(0, true));
  EXPECT_TRUE(flat_allreduce(8, true));
  EXPECT_TRUE(flat_allreduce(kFlatCrowdedBytes, true));
  EXPECT_FALSE(flat_allreduce(kFlatCrowdedBytes + 1, true));
  EXPECT_FALSE(flat_allreduce(256 << 20, true));
}

TEST(HierChoose, HostsWithCoresToSpareGoTheHierarchicalWayAtEverySize) {
  for (size_t bytes : {size_t{0}, size_t{8}, kFlatCrowdedBytes, size_t{256} << 20})
    EXPECT_FALSE(flat_allreduce(bytes, false)) << bytes;
}

}  // namespace
}  // namespace collie::hier
