// tests/fake_segment.h: an in-process stand-in for the shm backend's
// Segment (comm/shm/segment.h), over which the algorithms test runs shm's
// collectives (comm/shm/steps.h): every rank a thread; the descriptors,
// small slots and round buffers plain memory of one FakeShmWorld; a phase
// counter per rank; waits that poll and yield until the deadline; a peer's
// memory read with memcpy (the threads share one address space); and
// failures on demand: a rank that aborts, or vanishes (its peers' waits
// and reads say it died), or offers no direct reads.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/shared_file.h"
#include "comm/shm/segment.h"

namespace collie::testing {

// What every rank's FakeSegment shares.
struct FakeShmWorld {
  // `chunk`: a round per rank (COLLIE_SHM_CHUNK); `small_bytes`: the
  // one-step cut-off and small slot (COLLIE_SHM_SMALL); `read_peers`: every
  // rank may read every peer's memory (CMA).
  FakeShmWorld(int ranks, size_t chunk, size_t small_bytes, bool read_peers)
      : n(ranks),
        read_peers(read_peers),
        descs(new shm::DescSlot[2 * static_cast<size_t>(ranks)]()),
        progress(new std::atomic<uint32_t>[static_cast<size_t>(ranks)]),
        offers_direct(new std::atomic<bool>[static_cast<size_t>(ranks)]),
        dead(new std::atomic<bool>[static_cast<size_t>(ranks)]),
        smalls(2 * static_cast<size_t>(ranks) * small_bytes),
        bigs(2 * static_cast<size_t>(ranks) * chunk) {
    layout.n = ranks;
    layout.chunk = chunk;
    layout.small = small_bytes;
    settings.chunk_bytes = chunk;
    settings.small_bytes = small_bytes;
    for (int r = 0; r < ranks; ++r) {
      progress[r] = 0;
      offers_direct[r] = true;
      dead[r] = false;
    }
  }

  const int n;
  const bool read_peers;
  shm::Layout layout;
  config::ShmTuning settings;
  std::unique_ptr<shm::DescSlot[]> descs;  // rank r's of parity p at 2r + p
  std::unique_ptr<std::atomic<uint32_t>[]> progress;
  std::unique_ptr<std::atomic<bool>[]> offers_direct;  // pinnable()'s answer, per rank
  std::unique_ptr<std::atomic<bool>[]> dead;           // vanished: its peers are told
  std::vector<uint8_t> smalls, bigs;
  std::atomic<int> aborted_by{-1};
  std::string abort_message;  // written before aborted_by
  std::chrono::milliseconds timeout{20000};
};

class FakeSegment {
 public:
  FakeSegment(FakeShmWorld& w, int me) : w_(w), me_(me) {}
  FakeSegment(const FakeSegment&) = delete;
  FakeSegment& operator=(const FakeSegment&) = delete;
  ~FakeSegment() {
    for (auto& [key, m] : mapped_) munmap(m.first, m.second);
  }

  const shm::Layout& layout() const { return w_.layout; }
  const config::ShmTuning& settings() const { return w_.settings; }
  bool can_read_peers() const { return w_.read_peers; }
  bool crowded() const { return false; }
  bool pinnable(const void*, size_t, const void*, size_t) { return w_.offers_direct[me_]; }

  shm::DescSlot& desc(int r, uint32_t seq) { return w_.descs[2 * r + (seq & 1)]; }
  uint8_t* small_slot(int r, uint32_t seq) {
    return w_.smalls.data() + (2 * static_cast<size_t>(r) + (seq & 1)) * w_.layout.small;
  }
  uint8_t* big(int r, int b) {
    return w_.bigs.data() + (2 * static_cast<size_t>(r) + b) * w_.layout.chunk;
  }

  uint32_t phase() const { return phase_; }
  void advance() { w_.progress[me_].store(++phase_, std::memory_order_release); }

  void wait_all(const shm::What& what, Deadline dl) { wait_all_at(phase_, what, dl); }
  void wait_all_at(uint32_t target, const shm::What& what, Deadline dl) {
    wait_until([&](int r) { return r == me_ || reached(r, target); }, what, dl);
  }
  void wait_rank(int r, uint32_t target, const shm::What& what, Deadline dl) {
    wait_until([&](int q) { return q != r || reached(q, target); }, what, dl);
  }
  void wait_all_ready(uint32_t seq, const shm::What& what, Deadline dl) {
    wait_until(
        [&](int r) {
          return r == me_ || desc(r, seq).ready.load(std::memory_order_acquire) == seq;
        },
        what, dl);
  }

  void read_peer(int r, void* local, uint64_t remote, size_t len, const shm::What& what) {
    blame_peer(r, what);
    std::memcpy(local, reinterpret_cast<const void*>(remote), len);
  }

  void write_peer(int r, uint64_t remote, const void* local, size_t len, const shm::What& what) {
    blame_peer(r, what);
    std::memcpy(reinterpret_cast<void*>(remote), local, len);
  }
  // In one process no rank's buffer goes back to its caller while a peer
  // writes (the threads share the test's buffers until all have ended):
  // the bracket only looks for an abort, as Segment's does.
  void begin_writes() { check(); }
  void end_writes() noexcept {}

  // The region mapped a second time in this process, as a peer would map
  // it (through /proc/<pid>/fd), and kept until the segment goes.
  uint8_t* peer_buffer(int r, const shm::DescSlot& s, const shm::What& what) {
    auto it = mapped_.find({r, s.reg_id});
    if (it == mapped_.end()) {
      void* p = shared_file::open(getpid(), s.large.reg_fd, s.large.reg_bytes, name(me_),
                                  name(r) + "'s shared buffer of " + what.str());
      it = mapped_.emplace(std::pair{r, s.reg_id}, std::pair{p, s.large.reg_bytes}).first;
    }
    return static_cast<uint8_t*>(it->second.first) + s.large.reg_offset;
  }

  void check() {
    const int a = w_.aborted_by.load(std::memory_order_acquire);
    if (a >= 0 && a != me_)
      throw Error(ErrorCode::aborted, name(a) + " aborted the communicator: " + w_.abort_message);
  }
  bool aborted() const { return w_.aborted_by.load(std::memory_order_relaxed) >= 0; }
  void blame_peer(int r, const shm::What& what) {
    check();
    if (r != me_ && w_.dead[r].load(std::memory_order_acquire))
      throw Error(ErrorCode::peer_lost, name(me_) + ": " + name(r) +
                                            " died while this rank waits for it in " + what.str());
  }

  // This rank tells every other that it gave up (Segment::abort).
  void abort(const std::string& why) {
    w_.abort_message = why;
    w_.aborted_by.store(me_, std::memory_order_release);
  }

 private:
  static std::string name(int r) { return "rank " + std::to_string(r); }
  bool reached(int r, uint32_t target) const {
    return static_cast<int32_t>(w_.progress[r].load(std::memory_order_acquire) - target) >= 0;
  }
  // Until ok(r) holds for every rank r; a peer's abort or death, or the
  // deadline (naming the ranks not there), is an error.
  template <class Ok>
  void wait_until(Ok ok, const shm::What& what, Deadline dl) {
    for (;;) {
      std::vector<int> late;
      for (int r = 0; r < w_.n; ++r)
        if (!ok(r)) late.push_back(r);
      if (late.empty()) return;
      check();
      for (int r : late) blame_peer(r, what);
      if (std::chrono::steady_clock::now() > dl) {
        std::string who;
        for (int r : late) who += (who.empty() ? "" : ", ") + std::to_string(r);
        throw Error(ErrorCode::timeout, what.str() + " timed out on " + name(me_) +
                                            " waiting for rank" + (late.size() > 1 ? "s " : " ") +
                                            who);
      }
      std::this_thread::yield();
    }
  }

  FakeShmWorld& w_;
  const int me_;
  uint32_t phase_ = 0;
  std::map<std::pair<int, uint64_t>, std::pair<void*, size_t>> mapped_;
};

}  // namespace collie::testing
