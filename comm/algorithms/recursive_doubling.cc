// comm/algorithms/recursive_doubling.cc: all-reduce in log2(n) exchanges of
// the whole buffer, for small messages (Thakur, Rabenseifner & Gropp 2005,
// section 4). Ranks past the largest power of two p fold their data into a
// partner below p first and get the result back last.
#include <cstring>

#include "base/reduce.h"
#include "comm/algorithms/algorithms.h"

namespace collie::algo {

void rd_allreduce(const Ctx& c, const void* in, void* out, size_t count, DType t, ReduceOp op) {
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
  if (r < extra) {
    exchange(r + p, nullptr, tmp);
    kernels::reduce(t, op == ReduceOp::avg ? ReduceOp::sum : op, out, in, tmp, count);
  } else if (out != in) {
    std::memcpy(out, in, bytes);
  }
  for (int k = 1; k < p; k <<= 1) {
    // Both partners compute a op b on the same two operands; the ops are
    // commutative, so every rank ends with bit-identical results.
    exchange(r ^ k, out, tmp);
    int divisor = (op == ReduceOp::avg && k * 2 == p) ? n : 0;
    kernels::reduce(t, op, out, out, tmp, count, divisor);
  }
  if (op == ReduceOp::avg && p == 1) kernels::divide(t, out, out, count, n);
  if (r < extra) exchange(r + p, out, nullptr);
}

}  // namespace collie::algo
