// comm/host_executor.h: how host-progress backends (tcp; later shm, mpi)
// run operations: in issue order, one at a time, on a progress thread, or
// on the thread that waits for one (it runs every operation up to its own,
// which saves two thread wake-ups per small op: on this kind of VM a wake-up
// costs more than a small all-reduce). Point-to-point operations issued back
// to back run as one batch, so a pairwise exchange (both ranks send, then
// both receive) cannot deadlock on socket buffers.
//
// Continuations (Work::then) of these operations run on a continuation
// thread of their own, never on the thread that moves bytes, and never while
// the executor is held: a continuation may compute for long, issue more
// operations and wait for them, and communication goes on meanwhile.
//
// The first failure is recorded in the communicator's FailureLatch; the
// operations queued behind it fail with it when their turn comes.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "base/continuations.h"
#include "comm/backend.h"
#include "comm/transport.h"

namespace collie {

// Sends and receives the executor runs together. `ops` grows while the batch
// runs: refill() appends those issued since (returns whether it did).
// finished(i) completes ops[i] as soon as it is done.
struct P2pBatch {
  std::vector<Op> ops;
  std::function<bool()> refill;
  std::function<void(size_t)> finished;
};

// What a host-progress backend gives its executor.
class HostRunner {
 public:
  virtual ~HostRunner() = default;
  // Runs one collective to its end, or throws collie::Error.
  virtual void run_collective(const Op& op, Deadline deadline) = 0;
  virtual void run_p2p(P2pBatch& batch, Deadline deadline) = 0;
  // After the first failure, on the thread that holds the executor: tell
  // the peers and tear the connections down.
  virtual void abort_peers(const Error& e) noexcept = 0;
  // A clean end: tell the peers goodbye.
  virtual void close() noexcept = 0;
  // Interrupts a run in progress from another thread, so that it takes in
  // queued point-to-point ops or notices an abort in the latch.
  virtual void wake() noexcept = 0;
  // Memory this runner reduces in place (Communicator::allocate), or
  // nullptr: the backend's default.
  virtual std::shared_ptr<void> allocate(size_t) { return nullptr; }
  // Whether run_collective takes OpKind::alltoall (Backend::runs_alltoall).
  virtual bool runs_alltoall() const { return false; }
  // Whether run_collective sums a reduce-scatter step of COLLIE_DETERMINISTIC
  // (comm/deterministic.h: rank_order_step) in rank order itself, f16 and
  // bf16 in f32, as RankOrderSum does; else the steps use an all-to-all.
  virtual bool sums_in_rank_order() const { return false; }
  // Whether run_collective searches `op`'s inputs for NaN and Inf inside
  // its reduction (op.seen, base/nonfinite.h); else the executor searches
  // this rank's input in a pass of its own before it runs the op.
  virtual bool searches_nonfinite(const Op&) const { return false; }
};

// A first-in first-out queue over storage it keeps: std::deque allocated
// and freed a node every few ops.
template <class T>
class Fifo {
 public:
  bool empty() const { return n_ == 0; }
  T& front() { return buf_[head_]; }
  void push_back(T v) {
    if (n_ == buf_.size()) grow();
    buf_[(head_ + n_) & (buf_.size() - 1)] = std::move(v);
    ++n_;
  }
  void pop_front() {
    buf_[head_] = T{};  // what it held goes now, not when the slot is reused
    head_ = (head_ + 1) & (buf_.size() - 1);
    --n_;
  }

 private:
  void grow() {
    std::vector<T> b(std::max<size_t>(16, 2 * buf_.size()));  // a power of 2
    for (size_t i = 0; i < n_; ++i) b[i] = std::move(buf_[(head_ + i) & (buf_.size() - 1)]);
    buf_.swap(b);
    head_ = 0;
  }
  std::vector<T> buf_;
  size_t head_ = 0, n_ = 0;
};

class HostExecutor : public std::enable_shared_from_this<HostExecutor> {
 public:
  // `world_size`: the ranks `runner` runs over (for COLLIE_DETERMINISTIC's
  // steps, comm/deterministic.h).
  static std::shared_ptr<HostExecutor> start(HostRunner& runner,
                                             std::shared_ptr<FailureLatch> failure, int rank,
                                             std::chrono::milliseconds timeout,
                                             std::shared_ptr<StallInspector> inspector = nullptr,
                                             int world_size = 1,
                                             std::shared_ptr<arrivals::Log> arrivals = nullptr);
  ~HostExecutor();

  Work submit(Op op);
  // A blocking call's first half, under the front's lock: whether `op` (a
  // collective) may run on the calling thread now, nothing being queued or
  // running. If so, the executor is held for it until run_claimed(op).
  bool claim(const Op& op);
  // Runs a claimed op to its end, with the same checks, deadline and error
  // handling as a queued one, and releases the executor; throws its error.
  void run_claimed(Op& op);
  // The latch holds `e` already: stop the running op, or tell the peers now
  // if nothing runs.
  void abort(const Error& e);
  // Later submits fail at once; queued ops fail; the running op ends; the
  // runner says goodbye; the continuations still queued run; threads join.
  void shutdown();

  HostExecutor(HostRunner& runner, std::shared_ptr<FailureLatch> failure, int rank,
               std::chrono::milliseconds timeout, std::shared_ptr<StallInspector> inspector,
               int world_size = 1, std::shared_ptr<arrivals::Log> arrivals = nullptr);

 private:
  class Queued;
  struct Task {
    Op op;
    std::shared_ptr<Queued> done;
    uint64_t ticket = 0;
    std::chrono::steady_clock::time_point issued{};
  };

  void loop();
  // A waiter's turn: runs queued ops up to and including `ticket`.
  void run_until(uint64_t ticket);
  void pop_batch(std::vector<Task>& batch);  // with mu_ held; into an empty batch
  void execute_and_release(std::vector<Task>& batch);
  std::optional<Error> execute(std::vector<Task>& batch);
  // A collective, after the latch was looked at: runs it; returns its error.
  std::optional<Error> execute_collective(Op& op);
  // An op that threw `ex`: the error to report (the latch records it).
  Error failure_of(const Op& op, const std::exception& ex);
  // Frees the executor after a run: wakes the progress thread if ops wait.
  void release();
  // Records the first failure, tells the peers; returns the error to report.
  Error fail(Error e);
  std::string rank_str() const;

  // A batch buffer per thread, reused: a fresh vector per op cost a malloc
  // and a free.
  static thread_local std::vector<Task> spare_;

  HostRunner& runner_;
  std::shared_ptr<FailureLatch> failure_;
  const std::shared_ptr<StallInspector> inspector_;
  // How long each collective ran here (base/arrivals.h), or null.
  const std::shared_ptr<arrivals::Log> arrivals_;
  const int rank_;
  const int size_;
  const std::chrono::milliseconds timeout_;
  std::vector<uint8_t> scratch_;  // COLLIE_DETERMINISTIC's gathered blocks, kept between ops
  std::shared_ptr<ContinuationThread> continuations_;
  Dispatch dispatch_;

  std::mutex mu_;
  std::condition_variable cv_;
  Fifo<Task> queue_;
  uint64_t next_ticket_ = 1;
  bool busy_ = false;
  bool running_p2p_ = false;
  bool stop_ = false;
  bool sleeping_ = false;  // the progress thread waits for a notify (no op for kIdle)
  // How long the progress thread waits before it looks at the queue again
  // (host_executor.cc: kGrace doubling to kMaxPoll).
  std::chrono::microseconds poll_;
  std::chrono::steady_clock::time_point last_issued_{};
  std::thread thread_;
};

// `timeout` from now, for an op's deadline: never before steady_clock's
// now() + timeout, at most one kernel tick after it.
Deadline deadline_after(std::chrono::milliseconds timeout);

// Makes a host-progress backend's runner for the communicator `ctx`
// describes (collective over its ranks).
using RunnerFactory = std::unique_ptr<HostRunner> (*)(const BackendContext& ctx);

// Makes the runner of the communicator `plan` describes out of its parent's
// runner, for backends whose split goes through their own communicator
// (mpi's MPI_Comm_split, which ranks with color < 0 call too); nullptr for
// a rank with color < 0. Collective over the parent's ranks.
using RunnerSplitter = std::unique_ptr<HostRunner> (*)(HostRunner& parent, const SplitPlan& plan);

// A Backend whose operations run on a HostExecutor over `make(ctx)`: what
// tcp, shm, hier and mpi share. Its split makes the new runner with
// `split` when given, else afresh with `make(plan.context)`.
std::unique_ptr<Backend> make_host_backend(std::string name, RunnerFactory make,
                                           const BackendContext& ctx,
                                           RunnerSplitter split = nullptr);

}  // namespace collie
