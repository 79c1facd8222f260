// comm/shm/shm_runner.h: the shm backend's runner, the HostRunner over one
// segment: its collectives (comm/shm/shm_collectives.cc), its point-to-point
// messages (comm/shm/shm_p2p.cc), the peers' buffers it maps, and its
// state. Only this folder includes it; the registry gets the backend from
// comm/shm/shm_backend.h.
#pragma once

#include <sys/mman.h>

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/trace.h"
#include "comm/host_executor.h"
#include "comm/shm/region.h"
#include "comm/shm/segment.h"
#include "comm/shm/shm_choose.h"

namespace collie::shm {

// What this rank's segment offers the choices (rank 0's settings, the
// segment's layout, whether every rank may read its peers' memory).
inline Offer offer_of(const Segment& seg) {
  Offer o;
  o.small_bytes = seg.settings().small_bytes;
  o.inline_bytes = sizeof(DescSlot::inline_data);
  o.small_slot = seg.layout().small;
  o.chunk = seg.layout().chunk;
  o.reads_peers = seg.can_read_peers();
  o.crowded = seg.crowded();
  return o;
}

class ShmRunner final : public HostRunner {
 public:
  ShmRunner(const BackendContext& ctx, const config::ShmTuning& t, SpinBudget spin)
      : seg_(ctx, t, spin),
        me_(ctx.launch.rank),
        n_(ctx.launch.world_size),
        names_(ctx.names),
        srcs_(static_cast<size_t>(n_)),
        offer_(offer_of(seg_)),
        origins_(static_cast<size_t>(n_), -1) {}

 private:
  // ---- collectives -------------------------------------------------------

  bool runs_alltoall() const override { return true; }
  bool sums_in_rank_order() const override { return true; }
  // Every path of its all-reduce searches as it reduces (op.seen).
  bool searches_nonfinite(const Op& op) const override { return op.desc.op == OpKind::allreduce; }

  void run_collective(const Op& op, Deadline dl) override;

  void announce(const OpDesc& d, const RegionRef* reg = nullptr);

  void verify(const OpDesc& d, const What& what);

  void arrive(const OpDesc& d, const What& what, Deadline dl, const RegionRef* reg = nullptr);
  // The arrival of an op that may read peers' memory directly: says
  // whether this rank offers it (non-null `direct`) and where its buffers
  // are. Only these paths write or read the flag: the small ones leave it
  // alone (touching it there cost an 8 B all-reduce 10-15% here).
  void arrive_large(const OpDesc& d, const What& what, Deadline dl, const RegionRef* reg,
                    const Op* direct);

  // dst = srcs[0] op srcs[1] op ... in that order (avg divides at the last step).
  // With `seen` (an all-reduce's search for NaN and Inf), srcs[i] is searched
  // as rank origins_[i]'s input (-1: not searched here) at element `at` of
  // the op's buffer, inside the reduction.
  void reduce_into(void* dst, const std::vector<const void*>& srcs, size_t count, DType t,
                   ReduceOp op, kernels::NonFiniteSeen* seen = nullptr, size_t at = 0);

  // This rank's term of a one-step reduction from its input, not from the
  // copy it wrote into the segment (the same bits): once the peers have
  // read that line, reading it back here missed the cache (8% of an 8 B
  // all-reduce in perf). Not in place past the first term: reduce_into
  // writes the output before it reads term me_.
  void own_from_input(const Op& op);

  // A round of m elements cut into one slice per rank, each a whole number
  // of 64-byte lines (the last may be shorter, or empty): rank k's slice is
  // [lo(k), lo(k + 1)).
  struct Slices {
    size_t m, per;
    size_t lo(int k) const { return std::min(m, per * static_cast<size_t>(k)); }
  };
  Slices slices(size_t m, size_t es) const;

  // Reduces this rank's slice of every rank's round (base(q): where rank
  // q's round starts) into its own round, in place, starting from its own
  // data. Each slice is reduced once, by one rank, so every rank that copies
  // it gets the same bits.
  // With `seen`, every rank's slice is searched as that rank's input (the
  // round starting at element `at` of the op's buffer): each rank searches
  // its own slice of all inputs, so together they search every input once.
  template <class Base>
  void reduce_own_slice(Base base, const Slices& sl, size_t es, DType t, ReduceOp op,
                        kernels::NonFiniteSeen* seen = nullptr, size_t at = 0) {
    const size_t lo = sl.lo(me_), len = sl.lo(me_ + 1) - lo;
    if (!len) return;
    for (int i = 0; i < n_; ++i) srcs_[i] = base((me_ + i) % n_) + lo * es;
    if (seen)
      for (int i = 0; i < n_; ++i) origins_[i] = (me_ + i) % n_;
    reduce_into(base(me_) + lo * es, srcs_, len, t, op, seen, at + lo);
  }

  // An all-reduce's search where every rank reduces every input whole (the
  // small paths): each rank searches its own input only.
  void search_own_only() {
    std::fill(origins_.begin(), origins_.end(), -1);
    origins_[me_] = me_;
  }

  void allreduce(const Op& op, const What& what, Deadline dl);

  // Whether this rank offers direct reads for an op moving `bytes` here:
  // every rank may read every peer's memory, the op is large enough, and
  // the kernel can pin this rank's buffers for the peers' reads.
  bool offer_direct(const Op& op, size_t bytes);

  bool everyone_direct(uint32_t seq);

  // dst[0, len) = the elements [at, at + len) of every rank's input reduced,
  // this rank's term first and then the peers' in rank order after it: a
  // piece at a time, each peer's piece read into the scratch buffer (which
  // stays in this rank's cache) and reduced from there.
  void reduce_from_peers(const Op& op, uint8_t* dst, size_t at, size_t len, const What& what);
  // The same in rank order (COLLIE_DETERMINISTIC's reduce-scatter step).
  void reduce_from_peers_in_order(const Op& op, uint8_t* dst, size_t at, size_t len,
                                  const What& what);

  // Every rank may read every peer's memory (process_vm_readv, as Open
  // MPI's single copy does): no copy through the segment. Each rank reduces
  // its own 1/n slice of the whole buffer, a piece at a time: it reads each
  // peer's input piece into a scratch buffer that stays in its cache and
  // reduces it into its output; after one wait it reads the others' reduced
  // slices from their outputs into its own. Per rank that is the input and
  // a peer's slice read, the output written, against the segment path's
  // copy in, reduce in place and copy out. Each slice is reduced once, so
  // every rank ends with the same bits. The last wait keeps every buffer
  // unchanged until no rank reads it any more. In place works too: the
  // slice a rank reads from a peer's buffer in the first half is one that
  // peer only writes in the second.
  void allreduce_direct(const Op& op, const What& what, Deadline dl);
  void allreduce_whole(const Op& op, const What& what, Deadline dl);

  bool everyone_shared(uint32_t seq);

  // Rank r's buffer of this op, mapped here (opened through /proc on the
  // first op that names its region, then kept until the runner goes).
  uint8_t* peer_buffer(int r, const DescSlot& s, const What& what);

  // Every rank's buffer is mapped by every other: in rounds of n slices,
  // each rank reduces its own slice of every rank's buffer
  // into its own buffer, in place, and after one wait copies the others'
  // reduced slices from their buffers into its own while they are still in
  // the shared cache. Each slice is reduced once, so every rank ends with
  // the same bits. The last wait keeps every buffer unchanged until no rank
  // reads it any more.
  void allreduce_shared(const Op& op, const What& what, Deadline dl);

  // Up to two rounds (an L2), where every rank may read every peer's
  // memory: each non-root reads the root's buffer straight into its own
  // (one copy, not two through the segment); the last wait keeps the
  // root's buffer until all have read. Larger, the rounds win: the root's
  // copy into the segment overlaps the others' copies out, where a direct
  // read leaves the root idle (2 ranks: 1 MiB 1.9 x faster direct, 4 MiB
  // 0.8 x, 64 MiB 0.7 x; bench/RESULTS.md).
  void broadcast(const Op& op, const What& what, Deadline dl);

  // Direct: each rank reads every peer's block from its input.
  void allgather(const Op& op, const What& what, Deadline dl);

  // Direct: each rank reduces its own block of every rank's input into its
  // output, a piece at a time through the scratch buffer.
  void reduce_scatter(const Op& op, const What& what, Deadline dl);

  // Block k of each rank's input goes to rank k's output, at the sender's
  // place. The smallest go as all-reduce's do: the whole input in the
  // rank's descriptor (inline) or its small slot (one_step), one arrival.
  // Direct: every rank reads its block of each peer's input from the
  // peer's memory. Rounds: each rank puts a piece of every block in its
  // buffer, and every rank takes its own piece from each; double-buffered
  // as allgather's rounds.
  void alltoall(const Op& op, const What& what, Deadline dl);

  // ---- point to point ----------------------------------------------------

  struct Pending {
    size_t index;      // in the batch
    size_t done = 0;   // bytes moved
    uint32_t ack = 0;  // a send handed over by address: done when the tail reaches this
  };

  void run_p2p(P2pBatch& batch, Deadline dl) override;

  std::shared_ptr<void> allocate(size_t bytes) override { return allocate_region(bytes); }

  void abort_peers(const Error& e) noexcept override { seg_.abort(e); }
  void close() noexcept override { seg_.close(); }
  // A point-to-point batch sleeps until its bell changes: ring it, so that
  // it takes in the ops issued since (a bare futex wake-up left it asleep,
  // and a send waiting for a receive that never joined hung). Then wake
  // every sleeper, so that they see an abort.
  void wake() noexcept override {
    seg_.ring(me_);
    seg_.wake_all();
  }

  struct Mapping {
    uint8_t* base = nullptr;
    size_t bytes = 0;
    uint64_t used = 0;
    Mapping() = default;
    Mapping(const Mapping&) = delete;
    Mapping& operator=(const Mapping&) = delete;
    ~Mapping() {
      if (base) munmap(base, bytes);
    }
  };

  Segment seg_;
  static constexpr size_t kMaxMapped = 64;
  std::map<std::pair<int, uint64_t>, Mapping> mapped_;  // (rank, region id): peers' buffers
  uint64_t uses_ = 0;
  const int me_, n_;
  const RankNames names_;  // for messages
  // One source pointer per rank, reused by every reduction: a vector per
  // small op cost it a malloc.
  std::vector<const void*> srcs_;
  // A peer's piece (direct all-reduce, reduce-scatter). After the fields
  // every small op uses (placed before them, one A/B run of the one-step
  // all-reduce was 6-15% slower; see arrive_large).
  std::vector<uint8_t> scratch_;
  // What the choices depend on (comm/shm/shm_choose.h). Last: right after
  // seg_ it moved the fields above by 16 bytes, and the 64 B all-reduce
  // went from 0.32 to 0.40 us (bench/RESULTS.md, "The house moved, again").
  const Offer offer_;
  // reduce_into's search (op.seen): whose input srcs_[i] is. Last, after
  // every field the small ops use, for the reason above.
  std::vector<int> origins_;
};

}  // namespace collie::shm
