// tests/test_shm_choose.cc: comm/shm/shm_choose.h, the shm backend's
// choices: each path at the edges of its cut-offs, as COLLIE_SHM_SMALL,
// the segment's layout, CMA and crowding change them.
#include <gtest/gtest.h>

#include "comm/shm/shm_choose.h"

namespace collie::shm {
namespace {

Offer two_ranks() {
  Offer o;
  o.small_bytes = 16 * 1024;  // COLLIE_SHM_SMALL's default
  o.inline_bytes = 40;
  o.small_slot = 8 * 1024;
  o.chunk = 256 * 1024;
  o.reads_peers = true;
  o.crowded = false;
  return o;
}

TEST(ShmChoose, SmallPathsByTheSmallestLimitThatHolds) {
  const Offer o = two_ranks();
  EXPECT_EQ(small_path(1, 4096, o), Path::local);  // one rank: nothing to move
  EXPECT_EQ(small_path(2, 0, o), Path::local);
  EXPECT_EQ(small_path(2, 1, o), Path::inline_line);
  EXPECT_EQ(small_path(2, 40, o), Path::inline_line);
  EXPECT_EQ(small_path(2, 41, o), Path::one_step);
  EXPECT_EQ(small_path(2, 8 * 1024, o), Path::one_step);  // the slot, not COLLIE_SHM_SMALL
  EXPECT_EQ(small_path(2, 8 * 1024 + 1, o), Path::large);
  Offer lower = o;
  lower.small_bytes = 16;  // COLLIE_SHM_SMALL=16: below the line's room too
  EXPECT_EQ(small_path(3, 16, lower), Path::inline_line);
  EXPECT_EQ(small_path(3, 17, lower), Path::large);
  Offer none = o;
  none.small_bytes = 0;  // COLLIE_SHM_SMALL=0: every op large
  EXPECT_EQ(small_path(2, 1, none), Path::large);
}

TEST(ShmChoose, DirectReadsFrom32KiBOr64KiBWhenCrowdedAndNeverWithoutCma) {
  Offer o = two_ranks();
  EXPECT_FALSE(direct_size(kDirectMin - 1, o));
  EXPECT_TRUE(direct_size(kDirectMin, o));
  EXPECT_EQ(kDirectMin, 32u * 1024);
  o.crowded = true;
  EXPECT_FALSE(direct_size(63 * 1024, o));
  EXPECT_TRUE(direct_size(64 * 1024, o));
  o.reads_peers = false;  // COLLIE_SHM_CMA=0, or the kernel refused
  EXPECT_FALSE(direct_size(64 << 20, o));
}

// Two ranks reduce the whole buffer each up to 512 KiB (one wait); more
// ranks, or more bytes, a slice each.
TEST(ShmChoose, TwoRanksReduceTheWholeBufferUpTo512KiB) {
  EXPECT_EQ(kWholeMax, 512u * 1024);
  EXPECT_TRUE(whole_size(2, kDirectMin));
  EXPECT_TRUE(whole_size(2, kWholeMax));
  EXPECT_FALSE(whole_size(2, kWholeMax + 1));
  EXPECT_FALSE(whole_size(3, 64 * 1024));
  EXPECT_FALSE(whole_size(4, kDirectMin));
}

TEST(ShmChoose, BroadcastReadsDirectlyUpToTwoRounds) {
  const Offer o = two_ranks();
  EXPECT_FALSE(broadcast_direct_size(16 * 1024, o));  // below the direct minimum
  EXPECT_TRUE(broadcast_direct_size(64 * 1024, o));
  EXPECT_TRUE(broadcast_direct_size(2 * o.chunk, o));
  EXPECT_FALSE(broadcast_direct_size(2 * o.chunk + 1, o));
}

TEST(ShmChoose, DirectPiecesAreAQuarterRoundOfWholeElements) {
  const Offer o = two_ranks();
  EXPECT_EQ(direct_piece(o, 4), o.chunk / 4 / 4);
  EXPECT_EQ(direct_piece(o, 8), o.chunk / 4 / 8);
  Offer tiny = o;
  tiny.chunk = 8;
  EXPECT_EQ(direct_piece(tiny, 8), 1u);  // never zero elements
}

TEST(ShmChoose, SendsGoByAddressFrom64KiBToAReceiverThatMayRead) {
  EXPECT_FALSE(send_by_address(kDirectSend - 1, true));
  EXPECT_TRUE(send_by_address(kDirectSend, true));
  EXPECT_FALSE(send_by_address(1 << 20, false));
}

}  // namespace
}  // namespace collie::shm
