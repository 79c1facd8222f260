// comm/algorithms/recursive_doubling.cc: all-reduce in log2(n) exchanges of
// the whole buffer, for small messages (Thakur, Rabenseifner & Gropp 2005,
// section 4). Ranks past the largest power of two p fold their data into a
// partner below p first and get the result back last.
#include <cstring>

#include "base/nonfinite.h"
#include "base/reduce.h"
#include "comm/algorithms/algorithms.h"

namespace collie::algo {

void rd_allreduce(const Ctx& c, const void* in, void* out, size_t count, DType t, ReduceOp op,
                  kernels::NonFiniteSeen* seen) {
  Transport& tr = c.transport;
  const int n = tr.size(), r = tr.rank();
  const size_t bytes = count * dtype_size(t);
  int p = 1;
  while (p * 2 <= n) p *= 2;
  const int extra = n - p;
  uint8_t* tmp = c.scratch.get(bytes);
  auto exchange = [&](int peer, const void* send_buf, void* recv_buf) {
    if (send_buf) tr.post_send(c.desc, peer, send_buf, bytes);
    if (recv_buf) tr.post_recv(c.desc, peer, recv_buf, bytes);
    tr.run(c.deadline);
  };
  if (r >= p) {
    // Fold in: hand this rank's data to its partner below p, get the result.
    exchange(r - p, in, nullptr);
    exchange(r - p, nullptr, out);
    return;
  }
  // The search (seen): a rank below p searches its own input where it first
  // reduces it (the fold, or the first exchange), and a folding partner's
  // at the fold.
  if (r < extra) {
    exchange(r + p, nullptr, tmp);
    const ReduceOp fold = op == ReduceOp::avg ? ReduceOp::sum : op;
    if (seen)
      kernels::reduce_searching(t, fold, out, in, tmp, count, 0, *seen, 0, r, r + p);
    else
      kernels::reduce(t, fold, out, in, tmp, count);
  } else if (out != in) {
    std::memcpy(out, in, bytes);
  }
  for (int k = 1; k < p; k <<= 1) {
    // Both partners compute lower op upper, the lower rank's operand first,
    // so that every rank ends with the same bits: the ops commute on
    // numbers, not on NaNs (which NaN's payload a sum keeps, and whether
    // min or max returns the NaN or the number depends on the order).
    exchange(r ^ k, out, tmp);
    int divisor = (op == ReduceOp::avg && k * 2 == p) ? n : 0;
    const bool lower = (r & k) == 0;
    const void* a = lower ? out : tmp;
    const void* b = lower ? tmp : out;
    if (seen && k == 1) {
      const int own = r < extra ? -1 : r;
      kernels::reduce_searching(t, op, out, a, b, count, divisor, *seen, 0, lower ? own : -1,
                                lower ? -1 : own);
    } else {
      kernels::reduce(t, op, out, a, b, count, divisor);
    }
  }
  if (op == ReduceOp::avg && p == 1) kernels::divide(t, out, out, count, n);
  if (r < extra) exchange(r + p, out, nullptr);
}

}  // namespace collie::algo
