// comm/tcp/collectives.h: the TCP backend's algorithms, each written as the
// list of messages it exchanges (see tcp_mesh.h). Buffers are raw bytes plus
// a dtype; the caller has checked sizes and ranks.
//
//   ring_allreduce       reduce-scatter then all-gather around the ring,
//                        chunked so that sending, receiving and reducing
//                        overlap (Patarasuk & Yuan 2009; NCCL's ring).
//   rd_allreduce         recursive doubling (Thakur, Rabenseifner & Gropp
//                        2005, section 4), folding the ranks past the largest
//                        power of two in and out: log2(n) steps, for latency.
//   chain/tree_broadcast pipelined chain for bandwidth, binomial tree for
//                        latency.
//   ring_allgather, ring_reduce_scatter, dissemination_barrier.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/tcp/tcp_mesh.h"

namespace collie::tcp {

// Grow-only scratch memory owned by a communicator.
class Scratch {
 public:
  uint8_t* get(size_t bytes) {
    if (buf_.size() < bytes) buf_.resize(bytes);
    return buf_.data();
  }

 private:
  std::vector<uint8_t> buf_;
};

struct Ctx {
  Mesh& mesh;
  const OpDesc& desc;
  size_t chunk_bytes;
  Scratch& scratch;
  net::Deadline deadline;
};

void ring_allreduce(const Ctx& c, const void* in, void* out, size_t count, DType t, ReduceOp op);
void rd_allreduce(const Ctx& c, const void* in, void* out, size_t count, DType t, ReduceOp op);
void chain_broadcast(const Ctx& c, void* buf, size_t bytes, int root);
void tree_broadcast(const Ctx& c, void* buf, size_t bytes, int root);
// out holds size() blocks of `block_bytes`; `in` is this rank's block.
void ring_allgather(const Ctx& c, const void* in, void* out, size_t block_bytes);
// in holds size() blocks of `count` elements; out gets block rank().
void ring_reduce_scatter(const Ctx& c, const void* in, void* out, size_t count, DType t,
                         ReduceOp op);
void dissemination_barrier(const Ctx& c);

}  // namespace collie::tcp
