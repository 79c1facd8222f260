// tests/test_trace.cc: base/trace.h's rows of the timeline (COLLIE_TRACE).
#include <fcntl.h>
#include <gtest/gtest.h>

#include <memory>

#include "base/trace.h"

namespace collie {
namespace {

// Run spans on one row of the timeline (COLLIE_TRACE) follow each other,
// and each ends at its own op's end, even when a later op on the stream is
// recorded first (the CI failure of trace_nccl_fake_device under ASan).
TEST(TraceRow, RunSpansFollowEachOtherAndEndAtTheirOwnEnd) {
  int fd = ::open("/dev/null", O_WRONLY);
  ASSERT_GE(fd, 0);
  trace::Track row(std::make_shared<trace::Sink>(fd, "/dev/null", 0, 1), 1);
  EXPECT_EQ(row.serial_start(100, 300), 100);
  EXPECT_EQ(row.serial_start(150, 400), 300);  // queued behind: starts when that ended
  // Ended at 250, recorded after the op that ended at 400: ends at 250.
  const trace::Nanos late = row.serial_start(120, 250);
  EXPECT_EQ(late, 250);
  EXPECT_EQ(row.serial_start(500, 600), 500);
}

}  // namespace
}  // namespace collie
