// comm/algorithms/barrier.cc: the dissemination barrier (Hensgen, Finkel &
// Manber 1988): in round k every rank signals rank + 2^k and waits for
// rank - 2^k, so after ceil(log2 n) rounds every rank has heard from all.
#include "comm/algorithms/algorithms.h"

namespace collie::algo {

void dissemination_barrier(const Ctx& c) {
  Transport& t = c.transport;
  const int n = t.size(), r = t.rank();
  uint8_t token = 0, sink = 0;
  for (int k = 1; k < n; k <<= 1) {
    t.post_send(c.desc, (r + k) % n, &token, 1);
    t.post_recv(c.desc, mod(r - k, n), &sink, 1);
    t.run(c.deadline);
  }
}

}  // namespace collie::algo
