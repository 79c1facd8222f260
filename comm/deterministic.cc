#include "comm/deterministic.h"

#include <algorithm>
#include <cstring>

#include "base/reduce.h"

namespace collie {

namespace {

// Below this many bytes gathered in all (n x the input), one all-gather of
// everything beats an all-to-all and an all-gather: one round of latency
// instead of two, and the sums are of a few KiB.
constexpr size_t kGatherAllBytes = 64 << 10;

constexpr size_t kTile = 4096;  // elements summed at a time: they stay in L1

bool is16(DType t) {
  return t == DType::f16 || t == DType::bf16;
}

Op step(const Op& op, OpKind kind, uint32_t seq, TensorView in, TensorView out, size_t count) {
  Op s;
  s.desc = {kind,
            op.desc.dtype,
            op.desc.redop,
            seq,
            op.desc.op == OpKind::allreduce ? kDeterministicAllreduce : kDeterministicReduceScatter,
            count};
  s.in = in;
  s.out = out;
  return s;
}

TensorView host(void* p, DType t, size_t n) {
  return TensorView{p, t, n, Device::cpu()};
}

}  // namespace

DeterministicPlan plan_deterministic(OpKind kind, size_t count, size_t esize, int n,
                                     bool native_alltoall) {
  DeterministicPlan p;
  const size_t ranks = static_cast<size_t>(n);
  if (kind == OpKind::reduce_scatter) {
    // The input is n blocks of `count`: exactly an all-to-all's.
    p.gather_all = !native_alltoall || count * ranks * ranks * esize <= kGatherAllBytes;
    p.block = count;
    p.steps = 1;
    return p;
  }
  p.block = count / ranks;
  p.tail = count - p.block * ranks;
  p.gather_all = !native_alltoall || p.block == 0 || count * ranks * esize <= kGatherAllBytes;
  p.steps = p.gather_all ? 1 : (p.tail ? 3 : 2);
  return p;
}

void RankOrderSum::add(int q, const void* term, size_t len) {
  const size_t es = dtype_size(t_);
  const int divisor = op_ == ReduceOp::avg && q == n_ - 1 ? n_ : 0;  // the last step divides
  if (is16(t_)) {
    if (acc_.size() < len * sizeof(float)) acc_.resize(len * sizeof(float));
    auto* acc = reinterpret_cast<float*>(acc_.data());
    if (q == 0) return kernels::convert(t_, term, DType::f32, acc, len, 1);
    if (wide_.size() < len) wide_.resize(len);
    kernels::convert(t_, term, DType::f32, wide_.data(), len, 1);
    return kernels::reduce(DType::f32, op_, acc, acc, wide_.data(), len, divisor);
  }
  if (acc_.size() < len * es) acc_.resize(len * es);
  if (q == 0) {
    std::memcpy(acc_.data(), term, len * es);
    return;
  }
  kernels::reduce(t_, op_, acc_.data(), acc_.data(), term, len, divisor);
}

void RankOrderSum::finish(void* out, size_t len) {
  if (is16(t_))
    kernels::convert(DType::f32, acc_.data(), t_, out, len, 1);
  else
    std::memcpy(out, acc_.data(), len * dtype_size(t_));
}

void reduce_in_rank_order(DType t, ReduceOp op, void* out, const void* src, size_t stride, int n,
                          size_t count) {
  // A tile at a time, so that the accumulator stays in L1.
  const size_t es = dtype_size(t);
  const auto* s = static_cast<const uint8_t*>(src);
  auto* o = static_cast<uint8_t*>(out);
  RankOrderSum sum(t, op, n);
  for (size_t at = 0; at < count; at += kTile) {
    const size_t len = std::min(kTile, count - at);
    for (int q = 0; q < n; ++q) sum.add(q, s + (q * stride + at) * es, len);
    sum.finish(o + at * es, len);
  }
}

uint32_t run_deterministic(const Op& op, int rank, int n, bool native_alltoall,
                           bool rank_order_scatter, std::vector<uint8_t>& scratch,
                           const std::function<void(Op&)>& run) {
  const DType t = op.desc.dtype;
  const size_t es = dtype_size(t), ranks = static_cast<size_t>(n), me = static_cast<size_t>(rank);
  const size_t count = op.desc.count;
  const DeterministicPlan p = plan_deterministic(op.desc.op, count, es, n, native_alltoall);
  uint32_t seq = op.desc.seq;
  const bool scatter = op.desc.op == OpKind::reduce_scatter;
  // What the first step gathers: every rank's whole input, or this rank's
  // block of every rank's.
  const size_t in_count = scatter ? ranks * count : count;
  // Scratch: what the first step gathers (nothing when the runner sums it
  // straight into the output), then the tails.
  const size_t gathered = p.gather_all         ? ranks * in_count
                          : rank_order_scatter ? 0
                                               : ranks * p.block;
  const size_t tail_at = gathered, need = (gathered + ranks * p.tail) * es;
  if (scratch.size() < need) scratch.resize(need);
  uint8_t* g = scratch.data();
  if (p.gather_all) {
    Op s = step(op, OpKind::allgather, seq, host(op.in.data, t, in_count),
                host(g, t, ranks * in_count), in_count);
    run(s);
    // Rank q's input at g + q x in_count: this rank's part of each.
    const size_t from = scatter ? me * count : 0;
    reduce_in_rank_order(t, op.desc.redop, op.out.data, g + from * es, in_count, n, count);
    return seq;
  }
  uint8_t* out = static_cast<uint8_t*>(op.out.data);
  uint8_t* mine = scatter ? out : out + me * p.block * es;
  if (rank_order_scatter) {
    // The runner sums this rank's block of every rank's input in rank order,
    // into its place in the output. In place that is where this rank's own
    // block of the input lies: the runner reads it before it writes there.
    Op s = step(op, OpKind::reduce_scatter, seq, host(op.in.data, t, ranks * p.block),
                host(mine, t, p.block), p.block);
    run(s);
  } else {
    Op exchange = step(op, OpKind::alltoall, seq, host(op.in.data, t, ranks * p.block),
                       host(g, t, ranks * p.block), ranks * p.block);
    run(exchange);
  }
  if (p.tail) {
    // Read before any sum is written: the op may be in place.
    const uint8_t* tail_in = static_cast<const uint8_t*>(op.in.data) + ranks * p.block * es;
    Op s = step(op, OpKind::allgather, ++seq, host(const_cast<uint8_t*>(tail_in), t, p.tail),
                host(g + tail_at * es, t, ranks * p.tail), p.tail);
    run(s);
  }
  if (!rank_order_scatter) reduce_in_rank_order(t, op.desc.redop, mine, g, p.block, n, p.block);
  if (scatter) return seq;
  if (p.tail)
    reduce_in_rank_order(t, op.desc.redop, out + ranks * p.block * es, g + tail_at * es, p.tail, n,
                         p.tail);
  Op s = step(op, OpKind::allgather, ++seq, host(mine, t, p.block), host(out, t, ranks * p.block),
              p.block);
  run(s);
  return seq;
}

}  // namespace collie
