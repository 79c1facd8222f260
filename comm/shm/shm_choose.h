// comm/shm/shm_choose.h: every choice the shm backend makes, in one place:
// which path an op takes, by its size and by what the segment offers, and
// the cut-offs with the measurements behind them. Pure functions of their
// inputs, inline (they run on every op), unit-tested in
// tests/test_shm_choose.cc. The settings a user may change are
// COLLIE_SHM_SMALL and COLLIE_SHM_CHUNK (base/config.h: ShmTuning) and
// COLLIE_SHM_CMA=0 (no direct reads); the cut-offs below are constants.
#pragma once

#include <algorithm>
#include <cstddef>

namespace collie::shm {

// What the choices depend on, as this rank's segment has it.
struct Offer {
  size_t small_bytes = 0;    // COLLIE_SHM_SMALL: one step up to here
  size_t inline_bytes = 0;   // the descriptor line's room for data
  size_t small_slot = 0;     // the segment's small slot per rank
  size_t chunk = 0;          // a round per rank (COLLIE_SHM_CHUNK or the automatic one)
  bool reads_peers = false;  // every rank may read every peer's memory (CMA)
  bool crowded = false;      // more ranks on this host than CPUs
};

// Collectives from here up read peers' memory directly where every rank
// may (2 ranks: an all-reduce of 32 KiB 8-10% faster than the rounds, 64 KiB
// 1.3 x, 4-16 MiB 1.8-2 x; the other collectives 1.6-2.1 x up to 16 MiB;
// bench/RESULTS.md).
inline constexpr size_t kDirectMin = 32 * 1024;
// With more ranks than CPUs, from 64 KiB: since the all-reduce pushes its
// reduced slices (one wait, not two), 3 ranks on 2 cores take 64 and
// 128 KiB directly in 0.55 and 0.45 x the rounds' time, 4 ranks 0.9-1.0
// and 0.5-0.9 x; at 32 KiB the rounds stay ahead (direct 0.75-1.33 x
// their time at 3 ranks, 1.1-1.4 x at 4: bench/RESULTS.md). Before the push, 256 KiB: a 64 KiB
// all-reduce read directly was 0.69-0.82 x the rounds at 4 ranks.
inline constexpr size_t kDirectMinCrowded = 64 * 1024;
// A direct all-reduce of 2 ranks up to this size reduces the whole buffer
// on each rank, reading the peer's whole input: one wait instead of two.
// Measured against the reduce-scatter and all-gather (7 interleaved runs):
// 64-256 KiB 0.66-0.74 x the time, 512 KiB 0.93 x, 1 MiB 1.14 x, 2 MiB
// 1.36 x (past the L2, the second read of the whole input costs more than
// the wait it saves; bench/RESULTS.md).
inline constexpr size_t kWholeMax = 512 * 1024;
// A direct all-reduce reduces a peer's data in pieces of a round / this.
inline constexpr size_t kDirectPieces = 4;
// The in-place all-reduce's slice per rank and step.
inline constexpr size_t kSharedSlice = 1 << 20;
// A send from here up goes by address where its receiver may read this
// rank's memory: one copy instead of two through 64 KiB slots, and no
// hand-off per slot.
inline constexpr size_t kDirectSend = 64 * 1024;

// How an all-reduce or all-to-all moves `bytes` (this rank's input) among
// `ranks`, before the ranks agree on anything: alone; inside each rank's
// descriptor line (input, call and flag in one cache line); in one step
// through the small slots; or as a large op (rounds, direct or in place,
// which the ranks then agree on).
enum class Path { local, inline_line, one_step, large };
inline Path small_path(int ranks, size_t bytes, const Offer& o) {
  if (ranks == 1 || bytes == 0) return Path::local;
  if (bytes <= std::min(o.small_bytes, o.inline_bytes)) return Path::inline_line;
  if (bytes <= std::min(o.small_bytes, o.small_slot)) return Path::one_step;
  return Path::large;
}

// Whether an op moving `bytes` is one for direct reads of the peers'
// memory (the caller also checks that the kernel can pin its buffers).
inline bool direct_size(size_t bytes, const Offer& o) {
  return o.reads_peers && bytes >= (o.crowded ? kDirectMinCrowded : kDirectMin);
}

// Whether a direct all-reduce of `bytes` among `ranks` reduces the whole
// buffer on each rank (rather than a slice each, then gathered).
inline bool whole_size(int ranks, size_t bytes) {
  return ranks == 2 && bytes <= kWholeMax;
}

// A broadcast reads the root directly only up to two rounds (one L2): in
// the rounds the root's copy in overlaps the others' copies out, while a
// direct read leaves the root idle and, past the reader's L2, streams the
// root's buffer alone (at 4 MiB 0.5-1.0 x the rounds; bench/RESULTS.md).
inline bool broadcast_direct_size(size_t bytes, const Offer& o) {
  return bytes <= 2 * o.chunk && direct_size(bytes, o);
}

// Elements of `elem_size` bytes a direct all-reduce reduces at a time.
inline size_t direct_piece(const Offer& o, size_t elem_size) {
  return std::max<size_t>(o.chunk / kDirectPieces / elem_size, 1);
}

// Whether a send of `bytes` goes by address (its receiver may read this
// rank's memory) rather than through the mail slots.
inline bool send_by_address(size_t bytes, bool receiver_reads) {
  return receiver_reads && bytes >= kDirectSend;
}

}  // namespace collie::shm
