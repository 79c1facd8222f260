// comm/shm/steps.h: shm's collectives as steps over a segment: what each
// rank copies, reduces and reads, and where it advances its phase and waits
// for the others, written against any type `Seg` that offers the segment's
// operations below. The shm backend runs them over its shared memory
// (comm/shm/segment.h, instantiated in shm_collectives.cc); the algorithms
// test runs them over an in-process fake segment (tests/fake_segment.h), at
// every path and from 1 to 8 ranks, against float64 references.
//
// What a Seg offers (Segment's meaning of each):
//   layout(), settings(), can_read_peers(), crowded(), pinnable(...)
//                        what the choices read (offer_of, shm_choose.h)
//   desc(r, seq)         rank r's descriptor slot of op `seq` (DescSlot)
//   small_slot(r, seq), big(r, b)
//                        rank r's small slot, and its two round buffers
//   phase(), advance()   this rank's phase counter, and moving it on
//   wait_all(what, dl), wait_all_at(p, ...), wait_rank(r, p, ...),
//   wait_all_ready(seq, ...)
//                        until every other rank (or rank r) has reached
//                        this rank's phase (or p), or every descriptor of
//                        `seq` is ready; an error naming the late ranks at
//                        the deadline, or a peer's abort or death
//   read_peer(r, to, addr, len, what)
//                        len bytes at address `addr` in rank r's memory
//   peer_buffer(r, desc, what)
//                        rank r's registered region named by its descriptor
//   check(), aborted(), blame_peer(r, what)
//                        a peer's abort or death raised as its error
//   write_peer(r, addr, from, len, what), begin_writes(), end_writes()
//                        len bytes into rank r's memory; the bracket around
//                        a rank's writes into its peers' buffers, which a
//                        failing peer waits out before it returns its own
//                        (PeerWrites)
//
// Phases. Every rank advances its counter the same number of times for a
// given operation, so a phase number means the same step on every rank.
// Each collective starts with an arrival: the rank writes what it is calling
// into its descriptor slot, advances, waits for everyone, and compares (a
// different call on any rank is a mismatch, before any data moves). An
// arrival at operation s also proves every rank has finished s - 1, so the
// data areas are free again without a separate "done reading" phase.
#pragma once

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "base/nonfinite.h"
#include "base/reduce.h"
#include "base/trace.h"
#include "comm/deterministic.h"
#include "comm/shm/region.h"
#include "comm/shm/segment.h"
#include "comm/shm/shm_choose.h"

namespace collie::shm {

// A rank's writes into its peers' buffers, bracketed for as long as the
// object lives (Segment::begin_writes).
template <class Seg>
class PeerWrites {
 public:
  explicit PeerWrites(Seg& seg) : seg_(seg) { seg_.begin_writes(); }
  ~PeerWrites() { seg_.end_writes(); }
  PeerWrites(const PeerWrites&) = delete;
  PeerWrites& operator=(const PeerWrites&) = delete;

 private:
  Seg& seg_;
};

// What a rank's segment offers the choices (rank 0's settings, the
// segment's layout, whether every rank may read its peers' memory).
template <class Seg>
Offer offer_of(const Seg& seg) {
  Offer o;
  o.small_bytes = seg.settings().small_bytes;
  o.inline_bytes = sizeof(DescSlot::inline_data);
  o.small_slot = seg.layout().small;
  o.chunk = seg.layout().chunk;
  o.reads_peers = seg.can_read_peers();
  o.crowded = seg.crowded();
  return o;
}

// The collective a rank's descriptor describes.
inline OpDesc desc_of(const DescSlot& s) {
  OpDesc d;
  d.op = static_cast<OpKind>(s.op);
  d.dtype = static_cast<DType>(s.dtype);
  d.redop = static_cast<ReduceOp>(s.redop);
  d.seq = s.seq;
  d.tag = s.tag;
  d.count = s.count;
  return d;
}

template <class Seg>
class ShmSteps {
 public:
  // Seg is made from `seg_args`; me and n are this rank and the world size.
  template <class... A>
  ShmSteps(int me, int n, RankNames names, A&&... seg_args)
      : seg_(std::forward<A>(seg_args)...),
        me_(me),
        n_(n),
        names_(std::move(names)),
        srcs_(static_cast<size_t>(n_)),
        offer_(offer_of(seg_)),
        origins_(static_cast<size_t>(n_), -1) {}

  // Runs collective `op` (not a send or receive) on this rank.
  void collective(const Op& op, Deadline dl);

  Seg& segment() { return seg_; }

 protected:
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

  Seg seg_;
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

// Every member below is inline: an 8 B to 4 KiB op is a few hundred
// nanoseconds, and out-of-line helpers (arrive, verify, reduce_into, ...)
// made shm's 512 B all-reduce and all-to-all 8 % slower (bench/RESULTS.md,
// "The house moved, again").
template <class Seg>
inline void ShmSteps<Seg>::collective(const Op& op, Deadline dl) {
  const OpDesc& d = op.desc;
  const What what(d);
  // A rank that aborted may have left its part of this op in the segment
  // before it did: an op that finds every part there need not wait, and
  // would never see the abort.
  if (seg_.aborted()) seg_.check();
  switch (d.op) {
    case OpKind::allreduce:
      return allreduce(op, what, dl);
    case OpKind::broadcast:
      return broadcast(op, what, dl);
    case OpKind::allgather:
      return allgather(op, what, dl);
    case OpKind::reduce_scatter:
      return reduce_scatter(op, what, dl);
    case OpKind::barrier:
      trace::algorithm(op, "flags");
      return arrive(d, what, dl);
    case OpKind::alltoall:
      return alltoall(op, what, dl);
    case OpKind::p2p:
    case OpKind::split:
      break;
  }
  throw Error(ErrorCode::internal, what.str() + " is not a collective the shm backend runs");
}

template <class Seg>
inline void ShmSteps<Seg>::announce(const OpDesc& d, const RegionRef* reg) {
  DescSlot& s = seg_.desc(me_, d.seq);
  s.reg_id = reg ? reg->id : 0;
  if (reg) {
    s.large.reg_bytes = reg->bytes;
    s.large.reg_offset = reg->offset;
    s.large.reg_fd = reg->fd;
  }
  s.seq = d.seq;
  s.op = static_cast<uint8_t>(d.op);
  s.dtype = static_cast<uint8_t>(d.dtype);
  s.redop = static_cast<uint8_t>(d.redop);
  s.tag = d.tag;
  s.count = d.count;
}

template <class Seg>
inline void ShmSteps<Seg>::verify(const OpDesc& d, const What& what) {
  for (int r = 0; r < n_; ++r) {
    if (r == me_) continue;
    const OpDesc theirs = desc_of(seg_.desc(r, d.seq));
    if (!same_collective(theirs, d))
      throw collective_mismatch(what.str() + " on " + names_(me_), names_(r), theirs);
  }
}

template <class Seg>
inline void ShmSteps<Seg>::arrive(const OpDesc& d, const What& what, Deadline dl,
                                  const RegionRef* reg) {
  announce(d, reg);
  seg_.advance();
  seg_.wait_all(what, dl);
  verify(d, what);
}

// The arrival of an op that may read peers' memory directly: says
// whether this rank offers it (non-null `direct`) and where its buffers
// are. Only these paths write or read the flag: the small ones leave it
// alone (touching it there cost an 8 B all-reduce 10-15% here).
template <class Seg>
inline void ShmSteps<Seg>::arrive_large(const OpDesc& d, const What& what, Deadline dl,
                                        const RegionRef* reg, const Op* direct) {
  DescSlot& s = seg_.desc(me_, d.seq);
  s.direct = direct != nullptr;
  if (direct) {  // the second line only then
    s.large.in_addr = reinterpret_cast<uint64_t>(direct->in.data);
    s.large.out_addr = reinterpret_cast<uint64_t>(direct->out.data);
  }
  arrive(d, what, dl, reg);
}

// dst = srcs[0] op srcs[1] op ... in that order (avg divides at the last step).
template <class Seg>
inline void ShmSteps<Seg>::reduce_into(void* dst, const std::vector<const void*>& srcs,
                                       size_t count, DType t, ReduceOp op,
                                       kernels::NonFiniteSeen* seen, size_t at) {
  const int k = static_cast<int>(srcs.size());
  if (seen) {
    if (k == 1 && origins_[0] >= 0) seen->search(origins_[0], t, srcs[0], at, count);
    for (int i = 1; i < k; ++i) {
      const int divisor = (op == ReduceOp::avg && i == k - 1) ? n_ : 0;
      kernels::reduce_searching(t, op, dst, i == 1 ? srcs[0] : dst, srcs[i], count, divisor, *seen,
                                at, i == 1 ? origins_[0] : -1, origins_[i]);
    }
    if (k > 1) return;
  }
  if (k == 1) {
    if (op == ReduceOp::avg)
      kernels::divide(t, dst, srcs[0], count, 1);
    else if (dst != srcs[0])
      std::memmove(dst, srcs[0], count * dtype_size(t));
    return;
  }
  for (int i = 1; i < k; ++i) {
    int divisor = (op == ReduceOp::avg && i == k - 1) ? n_ : 0;
    kernels::reduce(t, op, dst, i == 1 ? srcs[0] : dst, srcs[i], count, divisor);
  }
}

// This rank's term of a one-step reduction from its input, not from the
// copy it wrote into the segment (the same bits): once the peers have
// read that line, reading it back here missed the cache (8% of an 8 B
// all-reduce in perf). Not in place past the first term: reduce_into
// writes the output before it reads term me_.
template <class Seg>
inline void ShmSteps<Seg>::own_from_input(const Op& op) {
  if (op.in.data != op.out.data || me_ == 0) srcs_[me_] = op.in.data;
}

template <class Seg>
inline typename ShmSteps<Seg>::Slices ShmSteps<Seg>::slices(size_t m, size_t es) const {
  const size_t align = std::max<size_t>(64 / es, 1);
  const size_t per = (m + n_ - 1) / n_;
  return {m, (per + align - 1) / align * align};
}

// Whether this rank offers direct reads for an op moving `bytes` here:
// every rank may read every peer's memory, the op is large enough, and
// the kernel can pin this rank's buffers for the peers' reads.
template <class Seg>
inline bool ShmSteps<Seg>::offer_direct(const Op& op, size_t bytes) {
  return direct_size(bytes, offer_) &&
         seg_.pinnable(op.in.data, op.in.nbytes(), op.out.data, op.out.nbytes());
}

template <class Seg>
inline bool ShmSteps<Seg>::everyone_direct(uint32_t seq) {
  for (int r = 0; r < n_; ++r)
    if (!seg_.desc(r, seq).direct) return false;
  return true;
}

// dst[0, len) = the elements [at, at + len) of every rank's input reduced,
// this rank's term first and then the peers' in rank order after it: a
// piece at a time, each peer's piece read into the scratch buffer (which
// stays in this rank's cache) and reduced from there.
template <class Seg>
inline void ShmSteps<Seg>::reduce_from_peers(const Op& op, uint8_t* dst, size_t at, size_t len,
                                             const What& what) {
  const OpDesc& d = op.desc;
  const DType t = op.in.dtype;
  const size_t es = dtype_size(t);
  const size_t piece = direct_piece(offer_, es);
  if (scratch_.size() < piece * es) scratch_.resize(piece * es);
  const auto* own = static_cast<const uint8_t*>(op.in.data) + at * es;
  if (n_ == 1) {  // no peer: this rank's own term is the result (the fake segment's case)
    if (dst != own) std::memmove(dst, own, len * es);
    return;
  }
  for (size_t off = 0; off < len; off += piece) {
    seg_.check();  // a peer's abort, before the next piece, not the next wait
    const size_t m = std::min(piece, len - off);
    for (int i = 1; i < n_; ++i) {
      const int q = (me_ + i) % n_;
      seg_.read_peer(q, scratch_.data(), seg_.desc(q, d.seq).large.in_addr + (at + off) * es,
                     m * es, what);
      const int divisor = (d.redop == ReduceOp::avg && i == n_ - 1) ? n_ : 0;
      if (op.seen)  // this rank's own input at the first term, each peer's as it comes
        kernels::reduce_searching(t, d.redop, dst + off * es,
                                  i == 1 ? own + off * es : dst + off * es, scratch_.data(), m,
                                  divisor, *op.seen, at + off, i == 1 ? me_ : -1, q);
      else
        kernels::reduce(t, d.redop, dst + off * es, i == 1 ? own + off * es : dst + off * es,
                        scratch_.data(), m, divisor);
    }
  }
}

// COLLIE_DETERMINISTIC's reduce-scatter step: every rank's term in rank
// order, this rank's own at its place, a piece at a time as above; the
// piece's sum is written only once every term is in (dst may be where this
// rank's own term lies: an in-place all-reduce's block).
template <class Seg>
inline void ShmSteps<Seg>::reduce_from_peers_in_order(const Op& op, uint8_t* dst, size_t at,
                                                      size_t len, const What& what) {
  const OpDesc& d = op.desc;
  const DType t = op.in.dtype;
  const size_t es = dtype_size(t);
  const size_t piece = direct_piece(offer_, es);
  if (scratch_.size() < piece * es) scratch_.resize(piece * es);
  const auto* own = static_cast<const uint8_t*>(op.in.data) + at * es;
  RankOrderSum sum(t, d.redop, n_);
  for (size_t off = 0; off < len; off += piece) {
    seg_.check();  // a peer's abort, before the next piece, not the next wait
    const size_t m = std::min(piece, len - off);
    for (int q = 0; q < n_; ++q) {
      const void* term = own + off * es;
      if (q != me_) {
        seg_.read_peer(q, scratch_.data(), seg_.desc(q, d.seq).large.in_addr + (at + off) * es,
                       m * es, what);
        term = scratch_.data();
      }
      sum.add(q, term, m);
    }
    sum.finish(dst + off * es, m);
  }
}

template <class Seg>
inline bool ShmSteps<Seg>::everyone_shared(uint32_t seq) {
  for (int r = 0; r < n_; ++r)
    if (seg_.desc(r, seq).reg_id == 0) return false;
  return true;
}

}  // namespace collie::shm

// Each collective's steps.
#include "comm/shm/steps_allreduce.h"  // IWYU pragma: export
#include "comm/shm/steps_movers.h"     // IWYU pragma: export
