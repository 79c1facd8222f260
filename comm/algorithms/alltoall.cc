// comm/algorithms/alltoall.cc: the pairwise all-to-all. Every rank posts a
// receive from and a send to each peer at once, in the order rank + k,
// rank - k (k = 1..n-1, as MPI's pairwise exchange orders its steps, so
// that no peer is everyone's first), and moves them together: each pair
// has its own connection, so the n - 1 exchanges overlap. Every message
// goes, an empty one too, so that a count a peer disagrees with is a
// mismatch on both ranks.
//
// A block larger than the chunk (COLLIE_TCP_CHUNK_BYTES, 512 KiB; at least
// 64 KiB) goes as chunk-sized messages, the peers' first chunks before anyone's second:
// over TCP a 16 MiB block sent whole took 1.2 x as long as in 512 KiB
// messages (bench/RESULTS.md; 128 KiB messages were slower again). The own
// block is copied while the transport waits for the peers.
#include <algorithm>
#include <cstring>

#include "comm/algorithms/algorithms.h"

namespace collie::algo {

namespace {
constexpr size_t kDeferredCopyBytes = 64 * 1024;
// A piece is at least this long whatever the chunk: a test's 64 B chunk
// cut a 16 KiB block into 256 messages (the algorithms test under TSan went
// from 1 to 23 s), and nothing measured gains from pieces under 512 KiB.
constexpr size_t kMinPieceBytes = 64 * 1024;
}  // namespace

void pairwise_alltoall(const Ctx& c, const void* in, void* out, size_t block_bytes) {
  Transport& t = c.transport;
  const int n = t.size(), r = t.rank();
  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  const size_t mine = static_cast<size_t>(r) * block_bytes;
  auto own_block = [&] {
    if (block_bytes && dst + mine != src + mine) std::memcpy(dst + mine, src + mine, block_bytes);
  };
  // A small own block is copied at once: for it, the call through run's
  // idle function cost more than the copy (3 % of an 8 B all-to-all).
  if (n == 1 || block_bytes < kDeferredCopyBytes) own_block();
  if (n == 1) return;
  const size_t piece = std::max(c.chunk_bytes, kMinPieceBytes);
  size_t off = 0;
  do {
    const size_t len = std::min(piece, block_bytes - off);
    for (int k = 1; k < n; ++k) {
      const int from = mod(r - k, n), to = mod(r + k, n);
      t.post_recv(c.desc, from, dst + static_cast<size_t>(from) * block_bytes + off, len);
      t.post_send(c.desc, to, src + static_cast<size_t>(to) * block_bytes + off, len);
    }
    off += len;
  } while (off < block_bytes);
  // The own block is copied the first time nothing can move (the sends
  // handed to the kernel, the peers' blocks not yet arrived), or at the end.
  if (block_bytes < kDeferredCopyBytes) return t.run(c.deadline);
  bool copied = false;
  t.run(c.deadline, [&] {
    if (copied) return false;
    copied = true;
    own_block();
    return true;
  });
}

}  // namespace collie::algo
