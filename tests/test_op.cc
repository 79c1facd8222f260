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

// A rank with COLLIE_DETERMINISTIC on meets one with it off at the first
// all-reduce or reduce-scatter, in whichever step its backend runs first:
// an all-to-all, an all-gather, or (shm) a reduce-scatter summed in rank
// order. Each is named as the mode's step, so the error says why.
TEST(OpDesc, EveryStepOfTheDeterministicModeIsNamedSoAMismatchSaysWhy) {
  for (OpKind step : {OpKind::alltoall, OpKind::allgather, OpKind::reduce_scatter})
    for (OpKind plain : {OpKind::allreduce, OpKind::reduce_scatter}) {
      const int32_t tag =
          plain == OpKind::allreduce ? kDeterministicAllreduce : kDeterministicReduceScatter;
      const OpDesc off{plain, DType::f32, ReduceOp::sum, 3, 0, 4096};
      const OpDesc on{step, DType::f32, ReduceOp::sum, 3, tag, 4096};
      EXPECT_FALSE(same_collective(off, on));
      const std::string d = on.describe();
      EXPECT_NE(d.find(std::string("sum: a step of COLLIE_DETERMINISTIC's ") +
                       (plain == OpKind::allreduce ? "allreduce" : "reduce_scatter")),
                std::string::npos)
          << d;
      for (const auto& [mine, theirs] : {std::pair{off, on}, std::pair{on, off}}) {
        const std::string m =
            collective_mismatch(mine.describe() + " on rank 0", "rank 1", theirs).what();
        EXPECT_NE(m.find("COLLIE_DETERMINISTIC (Options::deterministic) is on for one and off "
                         "for the other"),
                  std::string::npos)
            << m;
      }
    }
}

}  // namespace
}  // namespace collie
