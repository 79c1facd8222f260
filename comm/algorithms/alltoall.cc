// comm/algorithms/alltoall.cc: the pairwise all-to-all. Every rank posts a
// receive from and a send to each peer at once, in the order rank + k,
// rank - k (k = 1..n-1, as MPI's pairwise exchange orders its steps, so
// that no peer is everyone's first), and moves them together: each pair
// has its own connection, so the n - 1 exchanges overlap. Every message
// goes, an empty one too, so that a count a peer disagrees with is a
// mismatch on both ranks.
#include <cstring>

#include "comm/algorithms/algorithms.h"

namespace collie::algo {

void pairwise_alltoall(const Ctx& c, const void* in, void* out, size_t block_bytes) {
  Transport& t = c.transport;
  const int n = t.size(), r = t.rank();
  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  const size_t mine = static_cast<size_t>(r) * block_bytes;
  if (block_bytes) std::memcpy(dst + mine, src + mine, block_bytes);
  if (n == 1) return;
  for (int k = 1; k < n; ++k) {
    const int from = mod(r - k, n), to = mod(r + k, n);
    t.post_recv(c.desc, from, dst + static_cast<size_t>(from) * block_bytes, block_bytes);
    t.post_send(c.desc, to, src + static_cast<size_t>(to) * block_bytes, block_bytes);
  }
  t.run(c.deadline);
}

}  // namespace collie::algo
