// comm/algorithms/broadcast.cc: a pipelined chain for bandwidth (the root's
// chunks flow down the ranks, each forwarded as soon as it arrives) and a
// binomial tree for latency (log2(n) rounds).
#include <algorithm>
#include <vector>

#include "comm/algorithms/algorithms.h"

namespace collie::algo {

void chain_broadcast(const Ctx& c, void* buf, size_t bytes, int root) {
  Transport& t = c.transport;
  const int n = t.size();
  const int v = mod(t.rank() - root, n);
  const int prev = mod(t.rank() - 1, n), next = mod(t.rank() + 1, n);
  const size_t chunk = std::max<size_t>(1, c.chunk_bytes);
  const size_t nchunks = (bytes + chunk - 1) / chunk;
  auto* b = static_cast<uint8_t*>(buf);
  auto len = [&](size_t k) { return std::min(chunk, bytes - k * chunk); };
  const bool forwards = v < n - 1;
  if (v == 0) {
    for (size_t k = 0; k < nchunks; ++k) t.post_send(c.desc, next, b + k * chunk, len(k));
  } else {
    // Chunks are forwarded in order, whatever order their arrivals are
    // reported in: the next rank matches them in the order they are sent.
    std::vector<uint8_t> arrived(nchunks, 0);
    size_t next_send = 0;
    auto forward = [&] {
      while (next_send < nchunks && arrived[next_send]) {
        t.post_send(c.desc, next, b + next_send * chunk, len(next_send));
        ++next_send;
      }
    };
    for (size_t k = 0; k < nchunks; ++k)
      t.post_recv(c.desc, prev, b + k * chunk, len(k), [&, k] {
        arrived[k] = 1;
        if (forwards) forward();
      });
    t.run(c.deadline);
    return;
  }
  t.run(c.deadline);
}

void tree_broadcast(const Ctx& c, void* buf, size_t bytes, int root) {
  Transport& t = c.transport;
  const int n = t.size();
  const int v = mod(t.rank() - root, n);
  auto actual = [&](int rel) { return mod(rel + root, n); };
  int mask = 1;
  int parent = -1;
  while (mask < n) {
    if (v & mask) {
      parent = actual(v - mask);
      break;
    }
    mask <<= 1;
  }
  auto send_to_children = [&, mask] {
    for (int m = mask >> 1; m > 0; m >>= 1)
      if (v + m < n) t.post_send(c.desc, actual(v + m), buf, bytes);
  };
  if (parent < 0)
    send_to_children();
  else
    t.post_recv(c.desc, parent, buf, bytes, send_to_children);
  t.run(c.deadline);
}

}  // namespace collie::algo
