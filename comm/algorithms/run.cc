// comm/algorithms/run.cc: runs one collective with the algorithm the cost
// model picks (choose.h), after the cases that need no messages at all.
#include <cstring>

#include "base/nonfinite.h"
#include "base/reduce.h"
#include "base/trace.h"
#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/choose.h"

namespace collie::algo {

void run_collective(const Ctx& c, const Op& op, const config::TcpTuning& tuning) {
  const int n = c.transport.size();
  const TensorView& in = op.in;
  const TensorView& out = op.out;
  switch (op.desc.op) {
    case OpKind::allreduce:
      if (n == 1 || in.numel == 0) {
        trace::algorithm(op, "local");
        if (op.seen) op.seen->search(c.transport.rank(), in.dtype, in.data, 0, in.numel);
        if (op.desc.redop == ReduceOp::avg)
          kernels::divide(in.dtype, out.data, in.data, in.numel, 1);
        else if (out.data != in.data)
          std::memmove(out.data, in.data, in.nbytes());
        return;
      }
      if (choose_allreduce(in.nbytes(), n, tuning) == AllreduceAlgo::ring) {
        trace::algorithm(op, "ring");
        ring_allreduce(c, in.data, out.data, in.numel, in.dtype, op.desc.redop, op.seen);
      } else {
        trace::algorithm(op, "recursive_doubling");
        rd_allreduce(c, in.data, out.data, in.numel, in.dtype, op.desc.redop, op.seen);
      }
      return;
    case OpKind::broadcast:
      if (n == 1 || in.numel == 0) return trace::algorithm(op, "local");
      if (choose_broadcast(in.nbytes(), n, tuning) == BroadcastAlgo::chain) {
        trace::algorithm(op, "chain");
        chain_broadcast(c, in.data, in.nbytes(), op.desc.tag);
      } else {
        trace::algorithm(op, "binomial_tree");
        tree_broadcast(c, in.data, in.nbytes(), op.desc.tag);
      }
      return;
    case OpKind::allgather:
      trace::algorithm(op, "ring");
      ring_allgather(c, in.data, out.data, in.nbytes());
      return;
    case OpKind::reduce_scatter:
      trace::algorithm(op, "ring");
      ring_reduce_scatter(c, in.data, out.data, out.numel, in.dtype, op.desc.redop);
      return;
    case OpKind::barrier:
      trace::algorithm(op, "dissemination");
      dissemination_barrier(c);
      return;
    case OpKind::alltoall:
      trace::algorithm(op, n == 1 ? "local" : "pairwise");
      pairwise_alltoall(c, in.data, out.data, in.nbytes() / static_cast<size_t>(n));
      return;
    case OpKind::p2p:
    case OpKind::split:
      break;
  }
  throw Error(ErrorCode::internal, op.desc.describe() + " is not a collective this runs");
}

}  // namespace collie::algo
