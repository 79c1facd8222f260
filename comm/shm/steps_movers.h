// comm/shm/steps_movers.h: the steps of the collectives that move data
// (broadcast, all-gather, all-to-all) or reduce it a block per rank
// (reduce-scatter) over a segment: small paths, direct reads and rounds.
// Part of comm/shm/steps.h, which includes it at its end (the class and
// the steps every collective shares are there).
#pragma once

#include "comm/shm/steps.h"

namespace collie::shm {

// Up to two rounds (an L2), where every rank may read every peer's
// memory: each non-root reads the root's buffer straight into its own
// (one copy, not two through the segment); the last wait keeps the
// root's buffer until all have read. Larger, the rounds win: the root's
// copy into the segment overlaps the others' copies out, where a direct
// read leaves the root idle (2 ranks: 1 MiB 1.9 x faster direct, 4 MiB
// 0.8 x, 64 MiB 0.7 x; bench/RESULTS.md).
template <class Seg>
inline void ShmSteps<Seg>::broadcast(const Op& op, const What& what, Deadline dl) {
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
template <class Seg>
inline void ShmSteps<Seg>::allgather(const Op& op, const What& what, Deadline dl) {
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
template <class Seg>
inline void ShmSteps<Seg>::reduce_scatter(const Op& op, const What& what, Deadline dl) {
  const OpDesc& d = op.desc;
  const DType t = op.in.dtype;
  const size_t es = dtype_size(t), cnt = op.out.numel;
  const size_t per_round = std::max<size_t>(seg_.layout().chunk / (es * n_), 1);
  const auto* in = static_cast<const uint8_t*>(op.in.data);
  auto* out = static_cast<uint8_t*>(op.out.data);
  const bool direct = offer_direct(op, op.in.nbytes());
  arrive_large(d, what, dl, nullptr, direct ? &op : nullptr);
  const bool in_order = rank_order_step(d);  // COLLIE_DETERMINISTIC's step
  if (direct && everyone_direct(d.seq)) {
    trace::algorithm(op, "direct");
    if (in_order)
      reduce_from_peers_in_order(op, out, static_cast<size_t>(me_) * cnt, cnt, what);
    else
      reduce_from_peers(op, out, static_cast<size_t>(me_) * cnt, cnt, what);
    seg_.advance();
    seg_.wait_all(what, dl);
    return;
  }
  trace::algorithm(op, "rounds");
  std::optional<RankOrderSum> sum;
  if (in_order) sum.emplace(t, d.redop, n_);
  for (size_t off = 0, r = 0; off < cnt; off += per_round, ++r) {
    const int b = static_cast<int>(r & 1);
    const size_t m = std::min(per_round, cnt - off);
    for (int k = 0; k < n_; ++k)
      std::memcpy(seg_.big(me_, b) + k * m * es, in + (k * cnt + off) * es, m * es);
    seg_.advance();
    seg_.wait_all(what, dl);
    for (int k = 0; k < n_; ++k) srcs_[k] = seg_.big(k, b) + me_ * m * es;
    if (sum) {
      for (int k = 0; k < n_; ++k) sum->add(k, srcs_[k], m);
      sum->finish(out + off * es, m);
    } else {
      reduce_into(out + off * es, srcs_, m, t, d.redop);
    }
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
template <class Seg>
inline void ShmSteps<Seg>::alltoall(const Op& op, const What& what, Deadline dl) {
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

}  // namespace collie::shm
