// comm/algorithms/algorithms.h: collie's collective algorithms, written
// against a Transport (comm/transport.h), so that any transport that posts
// messages runs them, and an in-process fake tests them at any world size.
// Buffers are raw bytes plus a dtype; the front has checked sizes and ranks.
//
//   ring_allreduce        NCCL's ring as its step list: send; k-2 x
//                         receive-reduce-send; receive-reduce-copy-send; k-2 x
//                         receive-copy-send; receive. Chunked and pipelined
//                         (Patarasuk & Yuan 2009; NCCL src/device/all_reduce.h).
//   rd_allreduce          recursive doubling (Thakur, Rabenseifner & Gropp
//                         2005, section 4), the ranks past the largest power of
//                         two folded in and out: log2(n) steps, for latency.
//   ring_reduce_scatter   send; k-2 x receive-reduce-send; receive-reduce-copy.
//   ring_allgather        send; k-2 x receive-copy-send; receive.
//   chain_broadcast       pipelined chain, for bandwidth.
//   tree_broadcast        binomial tree, for latency.
//   dissemination_barrier log2(n) rounds of 1-byte messages.
//   pairwise_alltoall     a send to and a receive from every peer, all
//                         posted at once (each pair has its own connection),
//                         empty blocks too; blocks over the chunk size in
//                         chunk-sized messages.
//
// run_collective() is the one place that picks among them (choose.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "base/config.h"
#include "base/op.h"
#include "comm/transport.h"

namespace collie {
struct P2pBatch;  // comm/host_executor.h
}

namespace collie::algo {

// a mod n in [0, n), for rank arithmetic around a ring.
inline int mod(int a, int n) {
  return ((a % n) + n) % n;
}

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
  Transport& transport;
  const OpDesc& desc;
  size_t chunk_bytes;  // pipelining granularity
  Scratch& scratch;
  Deadline deadline;
};

// With `seen`, each searches the inputs for NaN and Inf as it reduces them
// (base/nonfinite.h): a ring its own input at every step and its left
// neighbour's first segment, which arrives untouched; recursive doubling
// the inputs of its first exchange. Every rank's input is searched once.
void ring_allreduce(const Ctx& c, const void* in, void* out, size_t count, DType t, ReduceOp op,
                    kernels::NonFiniteSeen* seen = nullptr);
void rd_allreduce(const Ctx& c, const void* in, void* out, size_t count, DType t, ReduceOp op,
                  kernels::NonFiniteSeen* seen = nullptr);
void chain_broadcast(const Ctx& c, void* buf, size_t bytes, int root);
void tree_broadcast(const Ctx& c, void* buf, size_t bytes, int root);
// out holds size() blocks of `block_bytes`; `in` is this rank's block.
void ring_allgather(const Ctx& c, const void* in, void* out, size_t block_bytes);
// in holds size() blocks of `count` elements; out gets block rank().
void ring_reduce_scatter(const Ctx& c, const void* in, void* out, size_t count, DType t,
                         ReduceOp op);
void dissemination_barrier(const Ctx& c);
// in and out hold size() blocks of `block_bytes`: block j of `in` goes to
// rank j, block q of `out` comes from rank q.
void pairwise_alltoall(const Ctx& c, const void* in, void* out, size_t block_bytes);
// A batch of sends and receives (comm/host_executor.h): each op completes as
// soon as its bytes have moved, and ops issued while the batch runs join
// it, so that the classic exchange (send, then receive, on both sides) does
// not wait for the send before receiving.
void run_p2p(Transport& t, P2pBatch& batch, Deadline deadline);

// Runs collective `op` (not send/recv) over c.transport with the algorithm
// the cost model picks for these sizes (or the one `tuning` forces).
void run_collective(const Ctx& c, const Op& op, const config::TcpTuning& tuning);

}  // namespace collie::algo
