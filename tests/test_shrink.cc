// tests/test_shrink.cc: comm/front/shrink.h, shrink's check that the
// survivors completed the same collectives.
#include <gtest/gtest.h>

#include "comm/front/shrink.h"

// shrink's check that the survivors completed the same collectives: silent
// when they did, else every group named with its last collective, the most
// advanced first.
TEST(Shrink, SurvivorsThatCompletedDifferentCollectivesAreNamed) {
  using collie::survivors_disagree;
  EXPECT_EQ(survivors_disagree({}), "");
  EXPECT_EQ(survivors_disagree({{0, 12}}), "");
  EXPECT_EQ(survivors_disagree({{0, 12}, {1, 12}, {2, 12}}), "");
  EXPECT_EQ(survivors_disagree({{0, 11}, {1, 11}, {2, 12}}),
            "rank 2 completed up to #12; ranks 0, 1 up to #11");
  EXPECT_EQ(survivors_disagree({{0, 5}, {2, 7}, {3, 6}}),
            "rank 2 completed up to #7; rank 3 up to #6; rank 0 up to #5");
}
