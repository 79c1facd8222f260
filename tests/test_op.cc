// tests/test_op.cc: base/op.h, an operation's description and the one
// "same collective?" check that tcp, shm and mpi report mismatches with.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "base/op.h"

namespace collie {
namespace {

// The one "same collective?" check and its error (base/op.h), which tcp,
// shm and mpi all report through: every field tells two collectives
// apart, and the message names both calls and both ranks.
TEST(OpDesc, SameCollectiveComparesEveryFieldAndTheMismatchNamesBothCalls) {
  const OpDesc mine{OpKind::allreduce, DType::f32, ReduceOp::sum, 7, 0, 1000};
  EXPECT_TRUE(same_collective(mine, mine));
  std::vector<OpDesc> others(6, mine);
  others[0].op = OpKind::allgather;
  others[1].dtype = DType::f64;
  others[2].redop = ReduceOp::max;
  others[3].seq = 8;
  others[4].tag = 1;
  others[5].count = 999;
  for (const OpDesc& o : others) EXPECT_FALSE(same_collective(mine, o)) << o.describe();
  const Error e = collective_mismatch(mine.describe() + " on rank 0", "rank 2", others[5]);
  EXPECT_EQ(e.code(), ErrorCode::mismatch);
  const std::string m = e.what();
  EXPECT_NE(m.find("allreduce #7 (f32 x 1000, sum) on rank 0 does not match rank 2, which called "
                   "allreduce #7 (f32 x 999, sum)"),
            std::string::npos)
      << m;
}

}  // namespace
}  // namespace collie
