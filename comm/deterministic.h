// comm/deterministic.h: the reproducible all-reduce and reduce-scatter
// (COLLIE_DETERMINISTIC, Options::deterministic): for a given rank count, the
// same bits whatever the backend, algorithm, chunk size, message size, hosts
// and placement: element i is ((x0[i] + x1[i]) + x2[i]) + ... in rank order,
// accumulated in the dtype's own type (f16 and bf16 in f32, rounded once).
//
// How: every rank's block b goes to rank b in an all-to-all (bits moved,
// never combined on the way), each rank sums the blocks it received in rank
// order, and an all-gather hands the sums round: as many bytes per rank as a
// ring's reduce-scatter and all-gather. Small messages, and backends without
// an all-to-all of their own (hier), all-gather every rank's whole input
// instead and sum it all locally. The steps are collectives of the backend
// itself, run by the host executor one after another inside the one op, each
// with a number of its own (the front reserves them), and marked in their
// descriptions, so that a rank with the mode off meets a mismatch that says
// so at the first all-reduce.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "base/op.h"

namespace collie {

struct DeterministicPlan {
  bool gather_all = false;  // one all-gather of every rank's whole input
  size_t block = 0;         // else: the all-to-all's block (elements)
  size_t tail = 0;          // the elements past size x block (all-reduce), gathered apart
  int steps = 1;            // collectives, so numbers the op takes
};

// How `kind` (allreduce or reduce_scatter) of `count` elements (the
// caller's count: reduce_scatter's output) of `esize` bytes runs on `n`
// ranks; `native_alltoall`: the backend runs OpKind::alltoall.
DeterministicPlan plan_deterministic(OpKind kind, size_t count, size_t esize, int n,
                                     bool native_alltoall);

// Runs `op` (its desc.seq the first of plan.steps numbers) as the plan's
// steps through `run`, on rank `rank` of `n`; `scratch` is kept between
// ops by the caller. Returns the number of the last step.
// `rank_order_scatter`: the runner sums a tagged reduce-scatter in rank
// order itself (HostRunner::sums_in_rank_order), so the first step is that,
// straight into the output, instead of an all-to-all into `scratch` and a
// sum here: one pass over the data fewer.
uint32_t run_deterministic(const Op& op, int rank, int n, bool native_alltoall,
                           bool rank_order_scatter, std::vector<uint8_t>& scratch,
                           const std::function<void(Op&)>& run);

// out[i] = op over q of blocks[q][i] in rank order (q = 0, 1, ..., n - 1),
// blocks[q] at src + q * stride elements; avg divides at the last step, as
// the default mode's last step does; f16 and bf16 accumulate in f32.
void reduce_in_rank_order(DType t, ReduceOp op, void* out, const void* src, size_t stride, int n,
                          size_t count);

// The same a term at a time, for a backend that reads the terms where they
// lie (shm's direct reads): add(0, ...) to add(n - 1, ...) over `len`
// elements, then finish() writes the result. `out` may be where a term was
// read from: nothing is written before finish().
class RankOrderSum {
 public:
  RankOrderSum(DType t, ReduceOp op, int n) : t_(t), op_(op), n_(n) {}
  void add(int q, const void* term, size_t len);
  void finish(void* out, size_t len);

 private:
  DType t_;
  ReduceOp op_;
  int n_;
  std::vector<uint8_t> acc_;  // f32 for f16 and bf16, else the dtype
  std::vector<float> wide_;   // a 16-bit term widened
};

// Whether a step's description is a reduce-scatter step of the mode's own
// (OpKind::reduce_scatter tagged by run_deterministic), which a runner that
// says HostRunner::sums_in_rank_order() must sum in rank order.
inline bool rank_order_step(const OpDesc& d) {
  return d.op == OpKind::reduce_scatter &&
         (d.tag == kDeterministicAllreduce || d.tag == kDeterministicReduceScatter);
}

}  // namespace collie
