// comm/algorithms/p2p.cc: a batch of sends and receives over a Transport,
// as the tcp and fake runners run it (algorithms.h: run_p2p).
#include "comm/algorithms/algorithms.h"
#include "comm/host_executor.h"

namespace collie::algo {

void run_p2p(Transport& t, P2pBatch& batch, Deadline deadline) {
  size_t posted = 0;
  auto post_new = [&] {
    for (; posted < batch.ops.size(); ++posted) {
      const Op& op = batch.ops[posted];
      auto done = [&batch, i = posted] { batch.finished(i); };
      if (op.is_send)
        t.post_send(op.desc, op.peer, op.in.data, op.in.nbytes(), done);
      else
        t.post_recv(op.desc, op.peer, op.in.data, op.in.nbytes(), done);
    }
  };
  post_new();
  t.run(deadline, [&] {
    if (!batch.refill()) return false;
    post_new();
    return true;
  });
}

}  // namespace collie::algo
