// collie/comm.h: the backend-neutral communicator.
//
// One API over every transport. connect() reads the rank, the world size and
// the rendezvous address (from Options, else the launcher's variables: see
// docs/architecture.md), picks a backend by name and returns a Communicator.
// Every operation is asynchronous (returns a Work) and runs in the order it
// was issued; every rank must issue the same collectives in the same order
// with the same counts, dtypes and ops. A rank that does not gets an error
// (mismatch), as does every rank when a peer dies (peer_lost) or stalls past
// the deadline (timeout): never a hang.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "collie/error.h"
#include "collie/store.h"
#include "collie/types.h"
#include "collie/work.h"

namespace collie {

namespace kernels {
struct NonFiniteSeen;  // base/nonfinite.h
}

struct Options {
  // -1 / empty: taken from the environment (collie's, torchrun's, Open MPI's,
  // SLURM's variables, in that order).
  int rank = -1;
  int world_size = -1;
  int local_rank = -1;
  int local_world_size = -1;
  std::string master_addr;
  int master_port = -1;
  // "tcp", "auto" (the best built backend for these ranks); later "shm",
  // "mpi", "nccl". COLLIE_BACKEND overrides "auto".
  std::string backend = "auto";
  // Deadline of every blocking step. 0: COLLIE_TIMEOUT (seconds), else 300 s.
  std::chrono::milliseconds timeout{0};
  // Peers present this before they may join. Empty: COLLIE_JOB_SECRET.
  std::string secret;
  // Rendezvous through this store instead of a TCP store served by rank 0.
  std::shared_ptr<Store> store;
  // Reproducible reductions: 1, all-reduce and reduce-scatter give, for a
  // given number of ranks, the same bits on every backend, algorithm,
  // message size and placement of ranks: the sum in rank order,
  // ((x0 + x1) + x2) + ..., f16 and bf16 accumulated in f32. 0 off; -1
  // COLLIE_DETERMINISTIC (default off). Every rank must set it alike (a
  // rank that does not is told so at the first all-reduce). Host memory.
  int deterministic = -1;
};

// Tag for the blocking forms of the collectives: comm.allreduce(in, out,
// op, collie::blocking) returns once the op has ended and throws its error,
// like allreduce(in, out, op).wait(), MPI's blocking calls or c10d's
// async_op=False.
struct Blocking {};
inline constexpr Blocking blocking{};

// The p2p tag of alltoall's messages: send and recv refuse it, so a
// user's message can never be taken for a block of an all-to-all. The
// largest tag every MPI allows (MPI_TAG_UB is at least 32767): the mpi
// backend passes tags through.
inline constexpr int kAlltoallTag = 32767;

// Which rank arrived last at this communicator's collectives
// (Communicator::arrivals; how it is told without clocks: base/arrivals.h).
struct Arrivals {
  uint64_t collectives = 0;            // compared
  std::vector<uint64_t> last;          // per rank: how many it arrived last at
  std::vector<double> median_late_ms;  // per rank: the median of how long after the first, then
  // "rank 2 arrived last in 91 % of 1000 collectives, median 14 ms after the
  // first; rank 0 in 5 %, ...", or "" when none were compared.
  std::string summary() const;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;
  virtual std::chrono::milliseconds timeout() const = 0;

  // out = op over ranks of in. In place when in.data == out.data.
  virtual Work allreduce(TensorView in, TensorView out, ReduceOp op) = 0;
  Work allreduce(TensorView inout, ReduceOp op) { return allreduce(inout, inout, op); }
  // The same, searching the inputs for NaN and Inf inside the reduction as
  // it reads them (the reducer's check_nonfinite; host memory only): `seen`
  // gets what this rank saw, by the rank whose input it was, and the ranks'
  // findings together cover every rank's input once (kernels::NonFiniteSeen,
  // base/nonfinite.h). A backend that cannot search inside its reduction
  // has this rank's input searched first, in a pass of its own. `seen` must
  // outlive the Work.
  virtual Work allreduce(TensorView in, TensorView out, ReduceOp op,
                         kernels::NonFiniteSeen& seen) = 0;
  // Every rank's `buf` becomes root's.
  virtual Work broadcast(TensorView buf, int root) = 0;
  // out (size() * in.numel elements) = every rank's `in`, in rank order.
  // In place when in.data == out.data + rank() * in.nbytes().
  virtual Work allgather(TensorView in, TensorView out) = 0;
  // in has size() * out.numel elements; rank r gets block r of op over ranks.
  virtual Work reduce_scatter(TensorView in, TensorView out, ReduceOp op) = 0;
  virtual Work barrier() = 0;
  // in and out have size() x k elements each: block j of `in` (k elements)
  // goes to rank j, and block q of `out` comes from rank q (MPI_Alltoall).
  // in and out must not overlap. alltoallv: rank j gets send_counts[j]
  // elements, in rank order from the start of `in`; recv_counts[q] elements
  // come from rank q, in rank order into `out` (the counts must agree with
  // the peers': what q sends this rank is what this rank receives from q).
  // alltoall in host memory is one collective where the backend has its
  // own (shm through its segment, tcp one message per peer, mpi as
  // MPI_Ialltoall); otherwise (hier, nccl), and
  // alltoallv always, it runs as sends and receives between every pair at
  // once, as NCCL and Gloo run theirs (their p2p tag is kAlltoallTag, which
  // send/recv refuse).
  virtual Work alltoall(TensorView in, TensorView out) = 0;
  virtual Work alltoallv(TensorView in, const std::vector<size_t>& send_counts, TensorView out,
                         const std::vector<size_t>& recv_counts) = 0;
  // The blocking forms. Where nothing else of this communicator is queued
  // or running, a host backend runs the op on the calling thread, without
  // a Work (on shm that was a tenth of an 8 B all-reduce); otherwise the op
  // is queued behind the others and waited for.
  virtual void allreduce(TensorView in, TensorView out, ReduceOp op, Blocking) {
    allreduce(in, out, op).wait();
  }
  void allreduce(TensorView inout, ReduceOp op, Blocking b) { allreduce(inout, inout, op, b); }
  virtual void broadcast(TensorView buf, int root, Blocking) { broadcast(buf, root).wait(); }
  virtual void allgather(TensorView in, TensorView out, Blocking) { allgather(in, out).wait(); }
  virtual void reduce_scatter(TensorView in, TensorView out, ReduceOp op, Blocking) {
    reduce_scatter(in, out, op).wait();
  }
  virtual void barrier(Blocking) { barrier().wait(); }
  virtual void alltoall(TensorView in, TensorView out, Blocking) { alltoall(in, out).wait(); }
  // Point to point. Messages between two ranks arrive in the order they were
  // sent; the receiver's count, dtype and tag must match the sender's.
  // Sends and receives issued back to back progress together, so a pairwise
  // exchange (both send, then both receive) does not deadlock.
  virtual Work send(TensorView buf, int peer, int tag = 0) = 0;
  virtual Work recv(TensorView buf, int peer, int tag = 0) = 0;

  // Collective over this communicator: ranks passing the same color form a
  // new communicator, ordered by (key, rank). color < 0: this rank joins
  // none and gets nullptr.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

  // After ranks are lost (a peer died: this communicator failed with
  // peer_lost), a new communicator of the ranks still alive, in the old
  // order and numbered from 0 (NCCL's ncclCommShrink). Collective over the
  // survivors: each calls it, on this communicator, failed or not. Ranks in
  // `exclude`, and those this rank saw die (peer_lost), are left out at
  // once; every other rank is waited for up to `wait` (0: the smaller of the
  // timeout and 10 s), or until a survivor has decided, and those that have
  // not called by then are left out too. The survivors agree through the store
  // on who is in; a rank that calls after that is told it was left out. The
  // store must survive: it lives in rank 0's process unless the program
  // passed its own. Not on the mpi backend (no store).
  virtual std::unique_ptr<Communicator> shrink(const std::vector<int>& exclude = {},
                                               std::chrono::milliseconds wait = {}) {
    (void)exclude;
    (void)wait;
    throw Error(ErrorCode::unavailable, "shrink: this communicator cannot shrink");
  }

  // A new communicator of this one's ranks, numbered as here, and `joiners`
  // processes that join the running job (collie::join(), or connect()
  // under COLLIE_JOIN=1, as collie-run --elastic restarts a lost rank),
  // numbered size() .. size() + joiners - 1 in the order they came (NCCL's
  // ncclCommGrow). Collective over this communicator's ranks; it need not
  // work (shrink() it first after a loss, or grow the shrunk one). Waits up
  // to `wait` (0: the timeout) for the joiners, then fails with `timeout`
  // naming how many came. Rank 0 takes the joiners through the job's store,
  // which must outlive the lost ranks (collie-run's does). The new
  // communicator is a generation of its own: nothing of this one's traffic
  // or keys is taken for its. Not on the mpi backend (no store).
  virtual std::unique_ptr<Communicator> grow(int joiners, std::chrono::milliseconds wait = {}) {
    (void)joiners;
    (void)wait;
    throw Error(ErrorCode::unavailable, "grow: this communicator cannot grow");
  }

  // Fails this communicator (code `aborted`, with `reason`): the operation
  // in flight stops, every later call fails at once, and the peers are told,
  // so that they fail too instead of waiting for their deadline. Any thread.
  virtual void abort(const std::string& reason) = 0;
  // The communicator's first failure, without waiting: empty while it works.
  virtual std::optional<Error> error() const = 0;
  // A reference to this communicator that stays safe to call after the
  // owner destroys it: calls then fail with `unavailable` instead of
  // touching freed memory. Comm hooks whose continuations issue operations
  // later (PowerSGD's second all-reduce) hold one of these.
  virtual std::shared_ptr<Communicator> share() = 0;

  // Zeroed host memory of `bytes` bytes, 64-byte aligned, that this
  // communicator's backend reduces in place without copying it in or out:
  // on shm, pages every rank of the host maps (an all-reduce whose buffer is
  // such memory on every rank reads the peers' buffers directly); elsewhere,
  // ordinary host memory. The reducer keeps its buckets in it. Not
  // collective. The memory lives until the last copy of the pointer goes,
  // even after the communicator is destroyed.
  virtual std::shared_ptr<void> allocate(size_t bytes) = 0;

  // Says that `memory` will be moved again and again (a reducer's bucket
  // arena): where the backend can use that, it registers it once (NCCL's
  // ncclCommRegister, so that its collectives on it need no copy through
  // NCCL's own buffers) and the returned handle undoes it when its last copy
  // goes; keep it no longer than the memory. nullptr where there is nothing
  // to register (host backends). Collective where the backend's first use
  // of device memory is (it may make the NCCL communicator).
  virtual std::shared_ptr<void> register_memory(TensorView memory) {
    (void)memory;
    return nullptr;
  }

  // Which rank arrived last, and how long after the first, at each of the
  // host collectives (host memory, any backend but nccl) this communicator
  // ran since the previous call (up to the last 4096), every rank's
  // account compared. Collective: one all-gather. Off
  // (COLLIE_ARRIVALS=0), or with one rank, nothing is compared.
  virtual Arrivals arrivals() = 0;
};

std::unique_ptr<Communicator> connect(const Options& options = {});

// A process that joins a running job: it waits (up to the timeout) in the
// job's store until a communicator of the job grows by it
// (Communicator::grow), and returns its place there. The launch variables
// and Options give the store and the secret as for connect(); its rank and
// world size come from the grow. connect() does this under COLLIE_JOIN=1.
std::unique_ptr<Communicator> join(const Options& options = {});

// The CUDA stream (a cudaStream_t) that this thread's operations on CUDA
// tensors are ordered after, as PyTorch's current stream: each starts once
// the work the thread queued on that stream before the call has finished.
// nullptr, the default, is the legacy default stream. Their Work's
// wait_on(stream) orders a stream after them in turn.
void set_cuda_stream(void* stream);
void* cuda_stream();

// Backends this build has, by name.
std::vector<std::string> available_backends();

}  // namespace collie
