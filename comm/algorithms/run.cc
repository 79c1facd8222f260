// comm/algorithms/run.cc: runs one collective with the algorithm the cost
// model picks (choose.h), after the cases that need no messages at all.
#include <cstring>

#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/choose.h"
#include "comm/core/reduce.h"

namespace collie::algo {

void run_collective(const Ctx& c, const Op& op, const config::TcpTuning& tuning) {
  const int n = c.transport.size();
  const TensorView& in = op.in;
  const TensorView& out = op.out;
  switch (op.desc.op) {
    case OpKind::allreduce:
      if (n == 1 || in.numel == 0) {
        if (op.desc.redop == ReduceOp::avg)
          kernels::divide(in.dtype, out.data, in.data, in.numel, 1);
        else if (out.data != in.data)
          std::memmove(out.data, in.data, in.nbytes());
        return;
      }
      if (choose_allreduce(in.nbytes(), n, tuning) == AllreduceAlgo::ring)
        ring_allreduce(c, in.data, out.data, in.numel, in.dtype, op.desc.redop);
      else
        rd_allreduce(c, in.data, out.data, in.numel, in.dtype, op.desc.redop);
      return;
    case OpKind::broadcast:
      if (n == 1 || in.numel == 0) return;
      if (choose_broadcast(in.nbytes(), n, tuning) == BroadcastAlgo::chain)
        chain_broadcast(c, in.data, in.nbytes(), op.desc.tag);
      else
        tree_broadcast(c, in.data, in.nbytes(), op.desc.tag);
      return;
    case OpKind::allgather:
      ring_allgather(c, in.data, out.data, in.nbytes());
      return;
    case OpKind::reduce_scatter:
      ring_reduce_scatter(c, in.data, out.data, out.numel, in.dtype, op.desc.redop);
      return;
    case OpKind::barrier:
      dissemination_barrier(c);
      return;
    case OpKind::p2p:
    case OpKind::split:
      break;
  }
  throw Error(ErrorCode::internal, op.desc.describe() + " is not a collective this runs");
}

}  // namespace collie::algo
