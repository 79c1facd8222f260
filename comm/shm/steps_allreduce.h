// comm/shm/steps_allreduce.h: the all-reduce's steps over a segment: inline,
// one step, rounds, direct (a slice each, or the whole buffer at two ranks)
// and in place over registered memory.
// Part of comm/shm/steps.h, which includes it at its end (the class and
// the steps every collective shares are there).
#pragma once

#include "comm/shm/steps.h"

namespace collie::shm {

template <class Seg>
inline void ShmSteps<Seg>::allreduce(const Op& op, const What& what, Deadline dl) {
  const OpDesc& d = op.desc;
  const DType t = op.in.dtype;
  const size_t es = dtype_size(t), count = op.in.numel, bytes = count * es;
  const Path path = small_path(n_, bytes, offer_);
  if (path == Path::local) {
    trace::algorithm(op, "local");
    arrive(d, what, dl);
    std::vector<const void*> one{op.in.data};
    if (op.seen) search_own_only();  // origins_[0] is this rank (me_ is 0)
    if (count) reduce_into(op.out.data, one, count, t, d.redop, op.seen);
    return;
  }
  if (path == Path::inline_line) {
    // The smallest: input, call and flag in one line per rank.
    trace::algorithm(op, "inline");
    DescSlot& mine = seg_.desc(me_, d.seq);
    std::memcpy(mine.inline_data, op.in.data, bytes);
    announce(d);
    mine.ready.store(d.seq, std::memory_order_release);
    seg_.advance();
    seg_.wait_all_ready(d.seq, what, dl);
    verify(d, what);
    for (int r = 0; r < n_; ++r) srcs_[r] = seg_.desc(r, d.seq).inline_data;
    own_from_input(op);
    if (op.seen) search_own_only();
    reduce_into(op.out.data, srcs_, count, t, d.redop, op.seen);
    return;
  }
  if (path == Path::one_step) {
    // One step: everyone's input in its slot, then every rank reduces
    // every slot into its own output, in rank order (the same bits on
    // every rank).
    trace::algorithm(op, "one_step");
    std::memcpy(seg_.small_slot(me_, d.seq), op.in.data, bytes);
    arrive(d, what, dl);
    for (int r = 0; r < n_; ++r) srcs_[r] = seg_.small_slot(r, d.seq);
    own_from_input(op);
    if (op.seen) search_own_only();
    reduce_into(op.out.data, srcs_, count, t, d.redop, op.seen);
    return;
  }
  // In place over memory every rank's peers can map (Communicator::
  // allocate): no copies in or out of the segment.
  const std::optional<RegionRef> reg =
      op.in.data == op.out.data ? find_region(op.in.data, bytes) : std::nullopt;
  const bool direct = offer_direct(op, bytes);
  arrive_large(d, what, dl, reg ? &*reg : nullptr, direct ? &op : nullptr);
  if (reg && everyone_shared(d.seq)) {
    trace::algorithm(op, "in_place");
    return allreduce_shared(op, what, dl);
  }
  if (direct && everyone_direct(d.seq)) {
    if (whole_size(n_, bytes)) {
      trace::algorithm(op, "whole");
      return allreduce_whole(op, what, dl);
    }
    trace::algorithm(op, "direct");
    return allreduce_direct(op, what, dl);
  }
  trace::algorithm(op, "rounds");
  // Rounds of `per_round` elements: copy in, reduce own slice of
  // everyone's round in place, copy every slice out.
  const size_t per_round = std::max<size_t>(seg_.layout().chunk / es, 1);
  const auto* in = static_cast<const uint8_t*>(op.in.data);
  auto* out = static_cast<uint8_t*>(op.out.data);
  for (size_t off = 0, r = 0; off < count; off += per_round, ++r) {
    const int b = static_cast<int>(r & 1);
    const size_t m = std::min(per_round, count - off);
    const Slices sl = slices(m, es);
    std::memcpy(seg_.big(me_, b), in + off * es, m * es);
    seg_.advance();
    seg_.wait_all(what, dl);
    reduce_own_slice([&](int q) { return seg_.big(q, b); }, sl, es, t, d.redop, op.seen, off);
    seg_.advance();
    seg_.wait_all(what, dl);
    for (int k = 0; k < n_; ++k) {
      const size_t klo = sl.lo(k), klen = sl.lo(k + 1) - klo;
      if (klen) std::memcpy(out + (off + klo) * es, seg_.big(k, b) + klo * es, klen * es);
    }
    seg_.advance();
  }
}

// Every rank may read and write every peer's memory (process_vm_readv
// and process_vm_writev, as Open MPI's single copy does): no copy through
// the segment. Each rank reduces its own 1/n slice of the whole buffer, a
// piece at a time: it reads each peer's input piece into a scratch buffer
// that stays in its cache and reduces it into its output; then it writes
// its reduced slice into every peer's output. Per rank that is the input
// and a peer's slice read, the output written, against the segment path's
// copy in, reduce in place and copy out. Each slice is reduced once, so
// every rank ends with the same bits. The one wait, at the end, keeps
// every buffer unchanged until no rank reads or writes it any more.
template <class Seg>
inline void ShmSteps<Seg>::allreduce_direct(const Op& op, const What& what, Deadline dl) {
  const OpDesc& d = op.desc;
  const DType t = op.in.dtype;
  const size_t es = dtype_size(t), count = op.in.numel;
  const Slices sl = slices(count, es);
  const size_t lo = sl.lo(me_);
  auto* out = static_cast<uint8_t*>(op.out.data);
  reduce_from_peers(op, out + lo * es, lo, sl.lo(me_ + 1) - lo, what);
  // Pushed, not pulled: this rank writes its reduced slice, still in its
  // cache, into every peer's output (process_vm_writev), instead of
  // reading each peer's slice after a wait, lines the peer had just
  // written (dirty in the other CPU's cache): 2-3 x faster from 1 to 4 MiB
  // (bench/RESULTS.md), and one wait instead of two. No rank reads or
  // writes the part of a buffer that another writes: a peer reads only its
  // own slice of every input, and in place that slice is one this rank
  // never writes.
  const size_t len = sl.lo(me_ + 1) - lo;
  if (len) {
    PeerWrites<Seg> writes(seg_);  // a failing peer waits for it to end
    for (int k = 0; k < n_; ++k)
      if (k != me_)
        seg_.write_peer(k, seg_.desc(k, d.seq).large.out_addr + lo * es, out + lo * es, len * es,
                        what);
  }
  seg_.advance();
  seg_.wait_all(what, dl);
}

// Two ranks, up to kWholeMax (shm_choose.h): each rank reduces the whole
// buffer, reading the peer's whole input, so one wait instead of
// allreduce_direct's two. Rank 0's term first on both ranks, so that both
// end with the same bits (min and max of a NaN, a NaN's payload). Out of
// place, a piece at a time into the output, then the wait keeps each input
// unchanged until the peer has read it; in place, the peer's input read
// whole into scratch, the wait (the peer has read this rank's input), then
// the reduction into the buffer. Ranks may differ in place or not: each
// waits once, and writes nothing the peer still reads. With op.seen each
// rank searches its own input, as the one-step path does.
template <class Seg>
inline void ShmSteps<Seg>::allreduce_whole(const Op& op, const What& what, Deadline dl) {
  const OpDesc& d = op.desc;
  const DType t = op.in.dtype;
  const size_t es = dtype_size(t), count = op.in.numel;
  const int peer = 1 - me_;
  const bool in_place = op.in.data == op.out.data;
  const size_t piece = in_place ? count : direct_piece(offer_, es);
  if (scratch_.size() < piece * es) scratch_.resize(piece * es);
  const auto* own = static_cast<const uint8_t*>(op.in.data);
  auto* dst = static_cast<uint8_t*>(op.out.data);
  const uint64_t from = seg_.desc(peer, d.seq).large.in_addr;
  const int divisor = d.redop == ReduceOp::avg ? 2 : 0;
  // Elements [off, off + m): the peer's, read into scratch, reduced with
  // this rank's own, rank 0's term first.
  auto read = [&](size_t off, size_t m) {
    seg_.check();  // a peer's abort, before the next piece, not the next wait
    seg_.read_peer(peer, scratch_.data(), from + off * es, m * es, what);
  };
  auto reduce = [&](size_t off, size_t m) {
    const uint8_t* mine = own + off * es;
    const void* a = me_ == 0 ? mine : scratch_.data();
    const void* b = me_ == 0 ? static_cast<const void*>(scratch_.data()) : mine;
    if (op.seen)
      kernels::reduce_searching(t, d.redop, dst + off * es, a, b, m, divisor, *op.seen, off,
                                me_ == 0 ? 0 : -1, me_ == 1 ? 1 : -1);
    else
      kernels::reduce(t, d.redop, dst + off * es, a, b, m, divisor);
  };
  if (in_place) {  // read, wait, write
    read(0, count);
    seg_.advance();
    seg_.wait_all(what, dl);
    reduce(0, count);
    return;
  }
  for (size_t off = 0; off < count; off += piece) {  // read and write, then wait
    const size_t m = std::min(piece, count - off);
    read(off, m);
    reduce(off, m);
  }
  seg_.advance();
  seg_.wait_all(what, dl);
}

// Every rank's buffer is mapped by every other: in rounds of n slices,
// each rank reduces its own slice of every rank's buffer into its own
// buffer, in place, and copies the result into every other rank's buffer
// while it is still in its cache. Each slice is reduced once, so every
// rank ends with the same bits. The one wait, at the end, keeps every
// buffer unchanged until no rank reads or writes it any more.
template <class Seg>
inline void ShmSteps<Seg>::allreduce_shared(const Op& op, const What& what, Deadline dl) {
  const OpDesc& d = op.desc;
  const DType t = op.in.dtype;
  const size_t es = dtype_size(t), count = op.in.numel;
  std::vector<uint8_t*> buf(n_);
  for (int r = 0; r < n_; ++r)
    buf[r] = r == me_ ? static_cast<uint8_t*>(op.in.data)
                      : seg_.peer_buffer(r, seg_.desc(r, d.seq), what);
  // Slices of 1 MiB per rank per round: no segment space limits them
  // here (chosen when every round ended in a wait, which cost 256 KiB
  // slices a fifth to two fifths of their speed: bench/RESULTS.md); a
  // slice is this machine's L2, where it stays between its reduction and
  // its copies.
  const size_t per_round = std::max<size_t>(kSharedSlice / es, 1) * n_;
  std::optional<PeerWrites<Seg>> writes;
  writes.emplace(seg_);  // a failing peer waits for it to end
  for (size_t off = 0; off < count; off += per_round) {
    const Slices sl = slices(std::min(per_round, count - off), es);
    reduce_own_slice([&](int q) { return buf[q] + off * es; }, sl, es, t, d.redop, op.seen, off);
    // Pushed, not pulled: this rank writes its reduced slice, still in its
    // cache, into every peer's buffer. Reading a peer's slice right after
    // the peer wrote it instead (the peer's dirty lines, from the other
    // CPU's cache) ran at a fifth of a memcpy's speed in this VM's slow
    // spells, and needed a wait per round (bench/RESULTS.md). No rank reads
    // or writes another's slice, so the rounds need no wait: only the last
    // one, before any rank returns its buffer.
    const size_t lo = off + sl.lo(me_), len = sl.lo(me_ + 1) - sl.lo(me_);
    seg_.check();  // a peer that failed: its buffer is its caller's again
    for (int k = 0; k < n_; ++k)
      if (k != me_ && len) std::memcpy(buf[k] + lo * es, buf[me_] + lo * es, len * es);
  }
  writes.reset();
  seg_.advance();
  seg_.wait_all(what, dl);
}

}  // namespace collie::shm
