// tests/deterministic_check.cc: COLLIE_DETERMINISTIC over real processes,
// under collie-run (tcp, shm), mpirun (mpi) and two hosts (hier): every
// dtype, op and count, all-reduce and reduce-scatter, bit for bit the serial
// sum in rank order (deterministic_reference.h). Every backend matching that
// one reference is every backend giving the same bits.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "collie/comm.h"
#include "deterministic_reference.h"

namespace collie {
namespace {

TEST(DeterministicProcesses, EveryDtypeOpAndCountIsTheRankOrderSumBitForBit) {
  const char* expect = std::getenv("COLLIE_EXPECT_BACKEND");
  Options o;
  o.deterministic = 1;
  auto comm = connect(o);
  if (expect) {
    ASSERT_EQ(comm->backend(), expect);
  }
  // A tail and none; gathered whole and by all-to-all; 300001 f32 are 1.2 MB.
  EXPECT_EQ(testing::check_deterministic(*comm, {3, 97, 20000, 20001, 300001}), "")
      << "rank " << comm->rank() << " of " << comm->size() << " on " << comm->backend();
}

}  // namespace
}  // namespace collie
