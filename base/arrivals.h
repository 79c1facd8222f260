// base/arrivals.h: which rank is slow, named without comparing clocks.
// Each rank records, for every host collective, how long it ran there:
// from the moment this rank started it (its arrival: the op reached the
// front of the executor's queue) to its end. No rank can end a collective
// before the last one has arrived, and all end at about the same moment,
// so the rank that ran shortest arrived last, and the longest run less the
// shortest is how long after the first it came. Clocks on different hosts
// never meet: each duration is one host's own.
//
// The communicator compares its ranks' records on demand
// (Communicator::arrivals, a collective; the reducer's log does so every
// COLLIE_REDUCER_LOG_EVERY iterations); under collie-run every rank leaves
// its record of the world communicator in the job's store when it closes,
// and collie-run compares them at the job's end.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/op.h"
#include "collie/comm.h"

namespace collie::arrivals {

// The executor's stopwatch: the time-stamp counter where there is one (10
// ns a read on this project's VMs, against 21 for steady_clock: two reads
// per op are a few percent of an 8-byte shm all-reduce), else steady_clock
// in nanoseconds.
inline uint64_t ticks() noexcept {
#if defined(__x86_64__)
  return __builtin_ia32_rdtsc();
#else
  return static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
#endif
}

// Which collectives are timed: every one of kTimedBytes or more, and one
// in kSampleSmall of the smaller (by number, so the same on every rank).
// Two counter reads and a store are about 30 ns, 3 % of a 1 KiB shm
// all-reduce and nothing beside a large one.
constexpr size_t kTimedBytes = 16 << 10;
constexpr uint32_t kSampleSmall = 8;
inline bool timed(const OpDesc& d) {
  return d.count * dtype_size(d.dtype) >= kTimedBytes || d.seq % kSampleSmall == 0;
}

// The last kEntries collectives of one rank of one communicator, each packed
// in 64 bits: its number (OpDesc::seq) above, its run below in units of
// 2^kShift ticks (about 100 ns; saturating after minutes). 0: no entry.
class Log {
 public:
  static constexpr size_t kEntries = 4096;
  static constexpr int kShift = 8;

  Log();
  // After each collective (the executor: one writer at a time): its number
  // and the ticks() it ran for.
  void record(uint32_t seq, uint64_t ran_ticks) noexcept {
    const uint64_t units = std::min<uint64_t>(ran_ticks >> kShift, UINT32_MAX);
    ring_[seq % kEntries].store((static_cast<uint64_t>(seq) << 32) | units,
                                std::memory_order_relaxed);
  }
  // The entries as they are now (any thread), and one more word: the
  // nanoseconds of a unit on this host, a double's bits (each rank's
  // own: hosts' counters may tick at different rates).
  std::vector<uint64_t> snapshot() const;
  // The highest number already compared (Communicator::arrivals), so that
  // each comparison covers the collectives since the one before.
  uint32_t compared() const { return compared_.load(std::memory_order_relaxed); }
  void set_compared(uint32_t seq) { compared_.store(seq, std::memory_order_relaxed); }

 private:
  std::array<std::atomic<uint64_t>, kEntries> ring_{};
  // Where the counter and steady_clock were at the start, for its rate.
  const uint64_t ticks0_;
  const std::chrono::steady_clock::time_point time0_;
  std::atomic<uint32_t> compared_{0};
};

// Where rank r leaves the world communicator's log in the job's store
// under collie-run (under the round's prefix, COLLIE_STORE_PREFIX).
inline std::string store_key(int rank) {
  return "collie/world/arrivals/" + std::to_string(rank);
}

// A communicator's log: null with one rank, or when off (COLLIE_ARRIVALS=0).
inline std::shared_ptr<Log> log_for(int ranks, bool on) {
  return ranks > 1 && on ? std::make_shared<Log>() : nullptr;
}

// Compares the ranks' snapshots (logs[r]: rank r's): the collectives
// numbered above `after` that every rank recorded, up to the last one every
// rank has. `*through` (when given) gets that last number.
Arrivals compare(const std::vector<std::vector<uint64_t>>& logs, uint32_t after,
                 uint32_t* through = nullptr);

}  // namespace collie::arrivals
