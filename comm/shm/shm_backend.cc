// comm/shm/shm_backend.cc: collectives and messages inside the segment.
//
// Phases. Every rank advances its counter the same number of times for a
// given operation, so a phase number means the same step on every rank.
// Each collective starts with an arrival: the rank writes what it is calling
// into its descriptor slot, advances, waits for everyone, and compares (a
// different call on any rank is a mismatch, before any data moves). An
// arrival at operation s also proves every rank has finished s - 1, so the
// data areas are free again without a separate "done reading" phase.
#include "comm/shm/shm_backend.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>

#include "base/reduce.h"
#include "base/shared_file.h"
#include "base/trace.h"
#include "comm/host_executor.h"
#include "comm/shm/region.h"
#include "comm/shm/segment.h"
#include "comm/shm/shm_choose.h"

namespace collie::shm {

namespace {

// The collective a rank's descriptor describes.
OpDesc desc_of(const DescSlot& s) {
  OpDesc d;
  d.op = static_cast<OpKind>(s.op);
  d.dtype = static_cast<DType>(s.dtype);
  d.redop = static_cast<ReduceOp>(s.redop);
  d.seq = s.seq;
  d.tag = s.tag;
  d.count = s.count;
  return d;
}

// What this rank's segment offers the choices (rank 0's settings, the
// segment's layout, whether every rank may read its peers' memory).
Offer offer_of(const Segment& seg) {
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
        offer_(offer_of(seg_)),
        me_(ctx.launch.rank),
        n_(ctx.launch.world_size),
        names_(ctx.names),
        srcs_(static_cast<size_t>(n_)) {}

 private:
  // ---- collectives -------------------------------------------------------

  bool runs_alltoall() const override { return true; }

  void run_collective(const Op& op, Deadline dl) override {
    const OpDesc& d = op.desc;
    const What what(d);
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

  void announce(const OpDesc& d, const RegionRef* reg = nullptr) {
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

  void verify(const OpDesc& d, const What& what) {
    for (int r = 0; r < n_; ++r) {
      if (r == me_) continue;
      const OpDesc theirs = desc_of(seg_.desc(r, d.seq));
      if (!same_collective(theirs, d))
        throw collective_mismatch(what.str() + " on " + names_(me_), names_(r), theirs);
    }
  }

  void arrive(const OpDesc& d, const What& what, Deadline dl, const RegionRef* reg = nullptr) {
    announce(d, reg);
    seg_.advance();
    seg_.wait_all(what, dl);
    verify(d, what);
  }
  // The arrival of an op that may read peers' memory directly: says
  // whether this rank offers it (non-null `direct`) and where its buffers
  // are. Only these paths write or read the flag: the small ones leave it
  // alone (touching it there cost an 8 B all-reduce 10-15% here).
  void arrive_large(const OpDesc& d, const What& what, Deadline dl, const RegionRef* reg,
                    const Op* direct) {
    DescSlot& s = seg_.desc(me_, d.seq);
    s.direct = direct != nullptr;
    if (direct) {  // the second line only then
      s.large.in_addr = reinterpret_cast<uint64_t>(direct->in.data);
      s.large.out_addr = reinterpret_cast<uint64_t>(direct->out.data);
    }
    arrive(d, what, dl, reg);
  }

  // dst = srcs[0] op srcs[1] op ... in that order (avg divides at the last step).
  void reduce_into(void* dst, const std::vector<const void*>& srcs, size_t count, DType t,
                   ReduceOp op) {
    const int k = static_cast<int>(srcs.size());
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
  void own_from_input(const Op& op) {
    if (op.in.data != op.out.data || me_ == 0) srcs_[me_] = op.in.data;
  }

  // A round of m elements cut into one slice per rank, each a whole number
  // of 64-byte lines (the last may be shorter, or empty): rank k's slice is
  // [lo(k), lo(k + 1)).
  struct Slices {
    size_t m, per;
    size_t lo(int k) const { return std::min(m, per * static_cast<size_t>(k)); }
  };
  Slices slices(size_t m, size_t es) const {
    const size_t align = std::max<size_t>(64 / es, 1);
    const size_t per = (m + n_ - 1) / n_;
    return {m, (per + align - 1) / align * align};
  }

  // Reduces this rank's slice of every rank's round (base(q): where rank
  // q's round starts) into its own round, in place, starting from its own
  // data. Each slice is reduced once, by one rank, so every rank that copies
  // it gets the same bits.
  template <class Base>
  void reduce_own_slice(Base base, const Slices& sl, size_t es, DType t, ReduceOp op) {
    const size_t lo = sl.lo(me_), len = sl.lo(me_ + 1) - lo;
    if (!len) return;
    for (int i = 0; i < n_; ++i) srcs_[i] = base((me_ + i) % n_) + lo * es;
    reduce_into(base(me_) + lo * es, srcs_, len, t, op);
  }

  void allreduce(const Op& op, const What& what, Deadline dl) {
    const OpDesc& d = op.desc;
    const DType t = op.in.dtype;
    const size_t es = dtype_size(t), count = op.in.numel, bytes = count * es;
    const Path path = small_path(n_, bytes, offer_);
    if (path == Path::local) {
      trace::algorithm(op, "local");
      arrive(d, what, dl);
      std::vector<const void*> one{op.in.data};
      if (count) reduce_into(op.out.data, one, count, t, d.redop);
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
      reduce_into(op.out.data, srcs_, count, t, d.redop);
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
      reduce_into(op.out.data, srcs_, count, t, d.redop);
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
      reduce_own_slice([&](int q) { return seg_.big(q, b); }, sl, es, t, d.redop);
      seg_.advance();
      seg_.wait_all(what, dl);
      for (int k = 0; k < n_; ++k) {
        const size_t klo = sl.lo(k), klen = sl.lo(k + 1) - klo;
        if (klen) std::memcpy(out + (off + klo) * es, seg_.big(k, b) + klo * es, klen * es);
      }
      seg_.advance();
    }
  }

  // Whether this rank offers direct reads for an op moving `bytes` here:
  // every rank may read every peer's memory, the op is large enough, and
  // the kernel can pin this rank's buffers for the peers' reads.
  bool offer_direct(const Op& op, size_t bytes) {
    return direct_size(bytes, offer_) &&
           seg_.pinnable(op.in.data, op.in.nbytes(), op.out.data, op.out.nbytes());
  }

  bool everyone_direct(uint32_t seq) {
    for (int r = 0; r < n_; ++r)
      if (!seg_.desc(r, seq).direct) return false;
    return true;
  }

  // dst[0, len) = the elements [at, at + len) of every rank's input reduced,
  // this rank's term first and then the peers' in rank order after it: a
  // piece at a time, each peer's piece read into the scratch buffer (which
  // stays in this rank's cache) and reduced from there.
  void reduce_from_peers(const Op& op, uint8_t* dst, size_t at, size_t len, const What& what) {
    const OpDesc& d = op.desc;
    const DType t = op.in.dtype;
    const size_t es = dtype_size(t);
    const size_t piece = direct_piece(offer_, es);
    if (scratch_.size() < piece * es) scratch_.resize(piece * es);
    const auto* own = static_cast<const uint8_t*>(op.in.data) + at * es;
    for (size_t off = 0; off < len; off += piece) {
      seg_.check();  // a peer's abort, before the next piece, not the next wait
      const size_t m = std::min(piece, len - off);
      for (int i = 1; i < n_; ++i) {
        const int q = (me_ + i) % n_;
        seg_.read_peer(q, scratch_.data(), seg_.desc(q, d.seq).large.in_addr + (at + off) * es,
                       m * es, what);
        const int divisor = (d.redop == ReduceOp::avg && i == n_ - 1) ? n_ : 0;
        kernels::reduce(t, d.redop, dst + off * es, i == 1 ? own + off * es : dst + off * es,
                        scratch_.data(), m, divisor);
      }
    }
  }

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
  void allreduce_direct(const Op& op, const What& what, Deadline dl) {
    const OpDesc& d = op.desc;
    const DType t = op.in.dtype;
    const size_t es = dtype_size(t), count = op.in.numel;
    const Slices sl = slices(count, es);
    const size_t lo = sl.lo(me_);
    auto* out = static_cast<uint8_t*>(op.out.data);
    reduce_from_peers(op, out + lo * es, lo, sl.lo(me_ + 1) - lo, what);
    seg_.advance();
    seg_.wait_all(what, dl);
    for (int k = 0; k < n_; ++k) {
      const size_t klo = sl.lo(k), klen = sl.lo(k + 1) - klo;
      if (k != me_ && klen)
        seg_.read_peer(k, out + klo * es, seg_.desc(k, d.seq).large.out_addr + klo * es, klen * es,
                       what);
    }
    seg_.advance();
    seg_.wait_all(what, dl);
  }

  bool everyone_shared(uint32_t seq) {
    for (int r = 0; r < n_; ++r)
      if (seg_.desc(r, seq).reg_id == 0) return false;
    return true;
  }

  // Rank r's buffer of this op, mapped here (opened through /proc on the
  // first op that names its region, then kept until the runner goes).
  uint8_t* peer_buffer(int r, const DescSlot& s, const What& what) {
    Mapping& m = mapped_[{r, s.reg_id}];
    m.used = ++uses_;
    if (!m.base) {
      // A peer's freed region stays alive while it is mapped here: keep at
      // most kMaxMapped, dropping the one used longest ago (reopened if it
      // comes back).
      if (mapped_.size() > kMaxMapped) {
        auto old = mapped_.begin();
        for (auto it = mapped_.begin(); it != mapped_.end(); ++it)
          if (it->second.used < old->second.used) old = it;
        mapped_.erase(old);
      }
      m.base = static_cast<uint8_t*>(
          shared_file::open(seg_.info(r).pid, s.large.reg_fd, s.large.reg_bytes, names_(me_),
                            names_(r) + "'s shared buffer of " + what.str()));
      m.bytes = s.large.reg_bytes;
    }
    return m.base + s.large.reg_offset;
  }

  // Every rank's buffer is mapped by every other: in rounds of n slices,
  // each rank reduces its own slice of every rank's buffer
  // into its own buffer, in place, and after one wait copies the others'
  // reduced slices from their buffers into its own while they are still in
  // the shared cache. Each slice is reduced once, so every rank ends with
  // the same bits. The last wait keeps every buffer unchanged until no rank
  // reads it any more.
  void allreduce_shared(const Op& op, const What& what, Deadline dl) {
    const OpDesc& d = op.desc;
    const DType t = op.in.dtype;
    const size_t es = dtype_size(t), count = op.in.numel;
    std::vector<uint8_t*> buf(n_);
    for (int r = 0; r < n_; ++r)
      buf[r] =
          r == me_ ? static_cast<uint8_t*>(op.in.data) : peer_buffer(r, seg_.desc(r, d.seq), what);
    // Slices of 1 MiB per rank per round: no segment space limits them
    // here, and with 256 KiB slices the waits cost 2 MiB to 256 MiB a fifth
    // to two fifths of their speed (bench/RESULTS.md). Fixed, not the
    // segment's round: that follows the L2 now, and this was measured alone.
    const size_t per_round = std::max<size_t>(kSharedSlice / es, 1) * n_;
    for (size_t off = 0; off < count; off += per_round) {
      const Slices sl = slices(std::min(per_round, count - off), es);
      reduce_own_slice([&](int q) { return buf[q] + off * es; }, sl, es, t, d.redop);
      seg_.advance();
      seg_.wait_all(what, dl);
      for (int k = 0; k < n_; ++k) {
        const size_t klo = off + sl.lo(k), klen = sl.lo(k + 1) - sl.lo(k);
        if (k != me_ && klen) std::memcpy(buf[me_] + klo * es, buf[k] + klo * es, klen * es);
      }
    }
    seg_.advance();
    seg_.wait_all(what, dl);
  }

  // Up to two rounds (an L2), where every rank may read every peer's
  // memory: each non-root reads the root's buffer straight into its own
  // (one copy, not two through the segment); the last wait keeps the
  // root's buffer until all have read. Larger, the rounds win: the root's
  // copy into the segment overlaps the others' copies out, where a direct
  // read leaves the root idle (2 ranks: 1 MiB 1.9 x faster direct, 4 MiB
  // 0.8 x, 64 MiB 0.7 x; bench/RESULTS.md).
  void broadcast(const Op& op, const What& what, Deadline dl) {
    const OpDesc& d = op.desc;
    const int root = d.tag;
    const size_t bytes = op.in.nbytes(), chunk = seg_.layout().chunk;
    auto* buf = static_cast<uint8_t*>(op.in.data);
    const bool direct = broadcast_direct_size(bytes, offer_) && offer_direct(op, bytes);
    arrive_large(d, what, dl, nullptr, direct ? &op : nullptr);
    if (direct && everyone_direct(d.seq)) {
      trace::algorithm(op, "direct");
      if (me_ != root) seg_.read_peer(root, buf, seg_.desc(root, d.seq).large.in_addr, bytes, what);
      seg_.advance();
      seg_.wait_all(what, dl);
      return;
    }
    trace::algorithm(op, "rounds");
    const uint32_t base = seg_.phase();
    for (size_t off = 0, r = 0; off < bytes; off += chunk, ++r) {
      const int b = static_cast<int>(r & 1);
      const size_t m = std::min(chunk, bytes - off);
      // Phases per round: ready = base + 2r + 1, done = base + 2r + 2.
      if (me_ == root) {
        if (r >= 2) seg_.wait_all_at(base + 2 * static_cast<uint32_t>(r - 2) + 2, what, dl);
        std::memcpy(seg_.big(root, b), buf + off, m);
        seg_.advance();
      } else {
        seg_.advance();
        seg_.wait_rank(root, seg_.phase(), what, dl);
        std::memcpy(buf + off, seg_.big(root, b), m);
      }
      seg_.advance();
    }
  }

  // Direct: each rank reads every peer's block from its input.
  void allgather(const Op& op, const What& what, Deadline dl) {
    const size_t block = op.in.nbytes(), chunk = seg_.layout().chunk;
    const auto* in = static_cast<const uint8_t*>(op.in.data);
    auto* out = static_cast<uint8_t*>(op.out.data);
    const bool direct = offer_direct(op, block * n_);
    arrive_large(op.desc, what, dl, nullptr, direct ? &op : nullptr);
    if (direct && everyone_direct(op.desc.seq)) {
      trace::algorithm(op, "direct");
      if (in != out + me_ * block) std::memcpy(out + me_ * block, in, block);
      for (int i = 1; i < n_; ++i) {
        const int k = (me_ + i) % n_;
        seg_.read_peer(k, out + k * block, seg_.desc(k, op.desc.seq).large.in_addr, block, what);
      }
      seg_.advance();
      seg_.wait_all(what, dl);
      return;
    }
    trace::algorithm(op, "rounds");
    for (size_t off = 0, r = 0; off < block; off += chunk, ++r) {
      const int b = static_cast<int>(r & 1);
      const size_t m = std::min(chunk, block - off);
      std::memcpy(seg_.big(me_, b), in + off, m);
      seg_.advance();
      seg_.wait_all(what, dl);
      for (int k = 0; k < n_; ++k) std::memmove(out + k * block + off, seg_.big(k, b), m);
      seg_.advance();
    }
  }

  // Direct: each rank reduces its own block of every rank's input into its
  // output, a piece at a time through the scratch buffer.
  void reduce_scatter(const Op& op, const What& what, Deadline dl) {
    const OpDesc& d = op.desc;
    const DType t = op.in.dtype;
    const size_t es = dtype_size(t), cnt = op.out.numel;
    const size_t per_round = std::max<size_t>(seg_.layout().chunk / (es * n_), 1);
    const auto* in = static_cast<const uint8_t*>(op.in.data);
    auto* out = static_cast<uint8_t*>(op.out.data);
    const bool direct = offer_direct(op, op.in.nbytes());
    arrive_large(d, what, dl, nullptr, direct ? &op : nullptr);
    if (direct && everyone_direct(d.seq)) {
      trace::algorithm(op, "direct");
      reduce_from_peers(op, out, static_cast<size_t>(me_) * cnt, cnt, what);
      seg_.advance();
      seg_.wait_all(what, dl);
      return;
    }
    trace::algorithm(op, "rounds");
    for (size_t off = 0, r = 0; off < cnt; off += per_round, ++r) {
      const int b = static_cast<int>(r & 1);
      const size_t m = std::min(per_round, cnt - off);
      for (int k = 0; k < n_; ++k)
        std::memcpy(seg_.big(me_, b) + k * m * es, in + (k * cnt + off) * es, m * es);
      seg_.advance();
      seg_.wait_all(what, dl);
      for (int k = 0; k < n_; ++k) srcs_[k] = seg_.big(k, b) + me_ * m * es;
      reduce_into(out + off * es, srcs_, m, t, d.redop);
      seg_.advance();
    }
  }

  // Block k of each rank's input goes to rank k's output, at the sender's
  // place. The smallest go as all-reduce's do: the whole input in the
  // rank's descriptor (inline) or its small slot (one_step), one arrival.
  // Direct: every rank reads its block of each peer's input from the
  // peer's memory. Rounds: each rank puts a piece of every block in its
  // buffer, and every rank takes its own piece from each; double-buffered
  // as allgather's rounds.
  void alltoall(const Op& op, const What& what, Deadline dl) {
    const OpDesc& d = op.desc;
    const size_t bytes = op.in.nbytes(), block = bytes / static_cast<size_t>(n_);
    const auto* in = static_cast<const uint8_t*>(op.in.data);
    auto* out = static_cast<uint8_t*>(op.out.data);
    const size_t mine = static_cast<size_t>(me_) * block;
    // Rank k's block for this rank, from where k put its whole input.
    auto take = [&](auto&& input_of) {
      for (int k = 0; k < n_; ++k)
        if (k != me_) std::memcpy(out + static_cast<size_t>(k) * block, input_of(k) + mine, block);
    };
    if (block) std::memcpy(out + mine, in + mine, block);  // this rank's own
    const Path path = small_path(n_, bytes, offer_);
    if (path == Path::local) {
      trace::algorithm(op, "local");
      return arrive(d, what, dl);
    }
    if (path == Path::inline_line) {
      trace::algorithm(op, "inline");
      DescSlot& s = seg_.desc(me_, d.seq);
      std::memcpy(s.inline_data, in, bytes);
      announce(d);
      s.ready.store(d.seq, std::memory_order_release);
      seg_.advance();
      seg_.wait_all_ready(d.seq, what, dl);
      verify(d, what);
      take([&](int k) { return static_cast<const uint8_t*>(seg_.desc(k, d.seq).inline_data); });
      return;
    }
    if (path == Path::one_step) {
      trace::algorithm(op, "one_step");
      std::memcpy(seg_.small_slot(me_, d.seq), in, bytes);
      arrive(d, what, dl);
      take([&](int k) { return static_cast<const uint8_t*>(seg_.small_slot(k, d.seq)); });
      return;
    }
    const bool direct = offer_direct(op, bytes);
    arrive_large(d, what, dl, nullptr, direct ? &op : nullptr);
    if (direct && everyone_direct(d.seq)) {
      trace::algorithm(op, "direct");
      for (int i = 1; i < n_; ++i) {
        const int k = (me_ + i) % n_;
        seg_.read_peer(k, out + static_cast<size_t>(k) * block,
                       seg_.desc(k, d.seq).large.in_addr + mine, block, what);
      }
      seg_.advance();
      seg_.wait_all(what, dl);
      return;
    }
    trace::algorithm(op, "rounds");
    const size_t per = std::max<size_t>(seg_.layout().chunk / static_cast<size_t>(n_), 1);
    for (size_t off = 0, r = 0; off < block; off += per, ++r) {
      const int b = static_cast<int>(r & 1);
      const size_t m = std::min(per, block - off);
      for (int k = 0; k < n_; ++k)
        if (k != me_)
          std::memcpy(seg_.big(me_, b) + static_cast<size_t>(k) * m,
                      in + static_cast<size_t>(k) * block + off, m);
      seg_.advance();
      seg_.wait_all(what, dl);
      for (int k = 0; k < n_; ++k)
        if (k != me_)
          std::memcpy(out + static_cast<size_t>(k) * block + off,
                      seg_.big(k, b) + static_cast<size_t>(me_) * m, m);
      seg_.advance();
    }
  }

  // ---- point to point ----------------------------------------------------

  struct Pending {
    size_t index;      // in the batch
    size_t done = 0;   // bytes moved
    uint32_t ack = 0;  // a send handed over by address: done when the tail reaches this
  };

  void run_p2p(P2pBatch& batch, Deadline dl) override {
    std::vector<std::deque<Pending>> sends(n_), recvs(n_);
    size_t taken = 0, left = 0;
    auto take_new = [&] {
      for (; taken < batch.ops.size(); ++taken, ++left) {
        const Op& op = batch.ops[taken];
        (op.is_send ? sends : recvs)[op.peer].push_back({taken});
      }
    };
    take_new();
    const size_t slot = seg_.layout().p2p_slot, slots = seg_.layout().p2p_slots;
    for (;;) {
      const uint32_t seen = seg_.bell(me_).value.load(std::memory_order_acquire);
      bool moved = false;
      for (int p = 0; p < n_; ++p) {
        // Sends to p: fill free slots in order.
        while (!sends[p].empty()) {
          Pending& s = sends[p].front();
          const Op& op = batch.ops[s.index];
          const size_t total = op.in.nbytes();
          Counter& head = seg_.mail_head(me_, p);
          Counter& tail = seg_.mail_tail(me_, p);
          bool finished = false;
          if (s.ack) {  // handed over: wait for the receiver to have read it
            if (static_cast<int32_t>(tail.value.load(std::memory_order_acquire) - s.ack) < 0) break;
            finished = true;
          }
          if (!finished && s.done == 0 && send_by_address(total, seg_.reads_peers(p)) &&
              seg_.pinnable(op.in.data, total, op.in.data, total)) {
            const uint32_t h = head.value.load(std::memory_order_relaxed);
            if (h - tail.value.load(std::memory_order_acquire) >= slots) break;
            SlotHeader& hdr = seg_.mail_header(me_, p, h);
            hdr = {op.desc.seq, op.desc.tag, total, 0, 0, 1};
            const uint64_t addr = reinterpret_cast<uint64_t>(op.in.data);
            std::memcpy(seg_.mail_data(me_, p, h), &addr, sizeof addr);
            s.done = total;
            s.ack = h + 1;
            seg_.publish(head, h + 1);
            seg_.ring(p);
            moved = true;
            break;  // finished once the receiver frees the slot
          }
          for (; !finished;) {
            uint32_t h = head.value.load(std::memory_order_relaxed);
            if (h - tail.value.load(std::memory_order_acquire) >= slots) break;
            const size_t len = std::min(slot, total - s.done);
            SlotHeader& hdr = seg_.mail_header(me_, p, h);
            hdr = {op.desc.seq, op.desc.tag, total, s.done, static_cast<uint32_t>(len), 0};
            if (len > 0)  // an empty message's buffer may be null (an all-to-all's empty block)
              std::memcpy(seg_.mail_data(me_, p, h),
                          static_cast<const uint8_t*>(op.in.data) + s.done, len);
            s.done += len;
            seg_.publish(head, h + 1);
            seg_.ring(p);
            moved = true;
            if (s.done == total) {
              finished = true;
              break;
            }
          }
          if (!finished) break;
          batch.finished(s.index);
          sends[p].pop_front();
          --left;
        }
        // Receives from p: take what has arrived, in order.
        while (!recvs[p].empty()) {
          Pending& rv = recvs[p].front();
          const Op& op = batch.ops[rv.index];
          const size_t total = op.in.nbytes();
          Counter& head = seg_.mail_head(p, me_);
          Counter& tail = seg_.mail_tail(p, me_);
          bool finished = false;
          for (;;) {
            uint32_t tl = tail.value.load(std::memory_order_relaxed);
            if (head.value.load(std::memory_order_acquire) == tl) break;
            const SlotHeader& hdr = seg_.mail_header(p, me_, tl);
            if (hdr.seq != op.desc.seq || hdr.tag != op.desc.tag || hdr.total != total ||
                hdr.offset != rv.done || hdr.len > total - rv.done || (hdr.direct && rv.done != 0))
              throw Error(ErrorCode::mismatch,
                          names_(me_) + " expects message #" + std::to_string(op.desc.seq) +
                              " from " + names_(p) + " (tag " + std::to_string(op.desc.tag) + ", " +
                              std::to_string(total) + " bytes) but " + names_(p) +
                              " sent message #" + std::to_string(hdr.seq) + " (tag " +
                              std::to_string(hdr.tag) + ", " + std::to_string(hdr.total) +
                              " bytes)");
            if (hdr.direct) {  // the whole message, from the sender's buffer
              uint64_t addr = 0;
              std::memcpy(&addr, seg_.mail_data(p, me_, tl), sizeof addr);
              seg_.read_peer(p, op.in.data, addr, total, What(op.desc));
              rv.done = total;
            } else {
              if (hdr.len > 0)
                std::memcpy(static_cast<uint8_t*>(op.in.data) + rv.done, seg_.mail_data(p, me_, tl),
                            hdr.len);
              rv.done += hdr.len;
            }
            seg_.publish(tail, tl + 1);
            seg_.ring(p);
            moved = true;
            if (rv.done == total) {
              finished = true;
              break;
            }
          }
          if (!finished) break;
          batch.finished(rv.index);
          recvs[p].pop_front();
          --left;
        }
      }
      if (moved) continue;
      if (batch.refill()) {
        take_new();
        continue;
      }
      if (left == 0) return;
      std::vector<int> peers;
      std::string what;
      for (int p = 0; p < n_; ++p) {
        if (!sends[p].empty() || !recvs[p].empty()) peers.push_back(p);
        if (what.empty() && !sends[p].empty())
          what = batch.ops[sends[p].front().index].desc.describe() + " to " + names_(p);
        if (what.empty() && !recvs[p].empty())
          what = batch.ops[recvs[p].front().index].desc.describe() + " from " + names_(p);
      }
      seg_.wait_bell(seen, peers, what, dl);
    }
  }

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
  const Offer offer_;  // what the choices depend on (comm/shm/shm_choose.h)
  static constexpr size_t kMaxMapped = 64;
  std::map<std::pair<int, uint64_t>, Mapping> mapped_;  // (rank, region id): peers' buffers
  uint64_t uses_ = 0;
  const int me_, n_;
  const RankNames names_;  // for messages
  // One source pointer per rank, reused by every reduction: a vector per
  // small op cost it a malloc.
  std::vector<const void*> srcs_;
  // A peer's piece (direct all-reduce, reduce-scatter). Last, after the
  // fields every small op uses (placed before them, one A/B run of the
  // one-step all-reduce was 6-15% slower; see arrive_large).
  std::vector<uint8_t> scratch_;
};

std::string unusable(const config::Launch& l) {
  if (l.local_world_size == l.world_size) return "";
  return "it needs every rank on one host, and these " + std::to_string(l.world_size) +
         " ranks have " + std::to_string(l.local_world_size) + " per host (use tcp across hosts)";
}

}  // namespace

std::unique_ptr<HostRunner> make_runner(const BackendContext& ctx) {
  auto t = config::shm_tuning(ctx.env);
  // The spin is allowed whatever the rank count: the segment spins only
  // while the awake ranks fit their cores (Segment::core_free), which is
  // what the host-wide guess of the other backends approximates.
  return std::make_unique<ShmRunner>(ctx, t, SpinBudget::from_setting(t.spin_us, true));
}

BackendEntry backend_entry() {
  BackendEntry e{"shm", true, "", &unusable, [](const BackendContext& ctx) {
                   return make_host_backend("shm", &make_runner, ctx);
                 }};
  e.make_runner = &make_runner;
  return e;
}

}  // namespace collie::shm
