// comm/nccl/nccl_state.h: the state of one NCCL communicator, which
// NcclBackend (nccl_backend.cc) wraps: its stream, the operations in flight
// (each ends when the event recorded after it has happened), the sends and
// receives waiting to be grouped, the watchdog thread that polls them
// against the deadline and looks in the store for a peer's failure, and the
// abort that fails them all. Built in every build, tested against a fake
// device (tests/fake_device.cc).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/continuations.h"
#include "base/trace.h"
#include "collie/comm.h"
#include "comm/nccl/nccl_backend.h"

namespace collie::nccl {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Point-to-point operations wait this long for others to join their group
// before the watchdog launches them (a wait on one launches them at once).
constexpr auto kGroupGrace = std::chrono::microseconds(500);
// Polls of CUDA events and NCCL's state: every kPollMin at first, then at
// twice the interval each time nothing ended, up to kPollMax.
constexpr auto kPollMin = std::chrono::microseconds(50);
constexpr auto kPollMax = std::chrono::milliseconds(2);
// How often the watchdog looks in the store for a peer's failure.
constexpr auto kPeerCheck = std::chrono::milliseconds(100);

inline ErrorCode code_of(const Result& r) {
  return r.remote ? ErrorCode::peer_lost : ErrorCode::internal;
}

// Polls a non-blocking communicator until its init, split or finalize has
// ended, or `deadline` passes (then the result is still in_progress).
Result settle(Api& api, Comm comm, Result r, Clock::time_point deadline);

class State;

// An operation on the communicator's stream; it ends when its event has.
class NcclWork final : public OpCompletion {
 public:
  NcclWork(std::weak_ptr<State> state, const OpDesc& desc, int rank, milliseconds timeout)
      : OpCompletion(desc, rank, timeout), state_(std::move(state)) {}

  bool query() override;
  bool wait_until(Clock::time_point deadline) override;
  void wait_on(void* stream) override;
  void abort(const Error& e) override;

  // Ends the op: its timeline entry (COLLIE_TRACE), once, then finish().
  void end(std::optional<Error> e, const Dispatch& dispatch = {}) {
    if (trace::OpSpan* s = trace.exchange(nullptr, std::memory_order_acq_rel)) trace::end(s, e);
    finish(std::move(e), dispatch);
  }

  // Under State::mu_: the event recorded after the op on the
  // communicator's stream, while the op is in flight.
  cuda::Event done = nullptr;
  std::atomic<trace::OpSpan*> trace{nullptr};  // the op's, until end()

 private:
  std::weak_ptr<State> state_;
};

// An operation not launched yet: point-to-point ones wait to be grouped.
struct Pending {
  Op op;
  std::shared_ptr<NcclWork> work;
  cuda::Stream after = nullptr;  // the issuing thread's stream at the call
};

class State : public std::enable_shared_from_this<State> {
 public:
  State(const BackendContext& ctx, Apis apis, Comm comm, int device)
      : ctx_(ctx),
        apis_(std::move(apis)),
        comm_(comm),
        device_(device),
        rank_(ctx.launch.rank),
        timeout_(ctx.launch.timeout),
        fail_key_(ctx.key + "/nccl/failed"),
        continuations_(std::make_shared<ContinuationThread>()),
        dispatch_(ContinuationThread::dispatch_to(continuations_)) {
    stream_ = apis_.cuda->create_stream();
    ready_ = apis_.cuda->create_event();
    barrier_buf_ = apis_.cuda->device_alloc(sizeof(float));
  }

  ~State() {
    for (cuda::Event e : free_events_) apis_.cuda->destroy_event(e);
    for (cuda::Event e : retired_events_) apis_.cuda->destroy_event(e);
    apis_.cuda->destroy_event(ready_);
    apis_.cuda->device_free(barrier_buf_);
    apis_.cuda->destroy_stream(stream_);
  }

  void start_watchdog() {
    watchdog_ = std::thread([self = shared_from_this()] { self->watch(); });
  }

  int device() const { return device_; }

  Work start(Op op);

  // Launches the point-to-point operations waiting to be grouped.
  void launch_pending();

  // Finishes the operations whose events have happened; checks NCCL's
  // state, the deadline and the peers. Returns whether anything is still
  // in flight or waiting to be launched.
  bool poll();

  // Records `cause` (unless a failure is recorded already), aborts the NCCL
  // communicator and fails everything in flight or waiting. `culprit`, when
  // given, fails with `cause` itself, the others with a message that says
  // the communicator failed. `tell_peers`: write the failure into the store
  // for the other ranks' watchdogs (not for a failure read from there).
  void fail(const Error& cause, const NcclWork* culprit, bool tell_peers);

  // ncclCommRegister; the handle deregisters while the communicator is
  // still there (NCCL frees what is left with the communicator). A
  // registration NCCL refuses is not an error: its collectives then copy.
  std::shared_ptr<void> register_memory(const TensorView& t);

  // Makes `stream` wait for `w` without the host.
  void wait_on(NcclWork& w, cuda::Stream stream);

  std::unique_ptr<Backend> split(const SplitPlan& plan);

  // Writes this rank's failure into the store, for the peers' watchdogs.
  void publish(const Error& e);

  void shutdown();

 private:
  friend class NcclWork;

  void launch_pending_locked();

  // One collective, or a group of sends and receives, on the stream.
  void launch_locked(std::vector<Pending>& ops);

  // The failure another rank wrote into the store, if any.
  std::optional<Error> peer_failure();

  void watch();

  const BackendContext ctx_;
  const Apis apis_;
  Comm comm_;
  const int device_;
  const int rank_;
  const milliseconds timeout_;
  const std::string fail_key_;
  std::shared_ptr<ContinuationThread> continuations_;
  Dispatch dispatch_;
  cuda::Stream stream_ = nullptr;
  cuda::Event ready_ = nullptr;  // recorded on an issuing thread's stream
  void* barrier_buf_ = nullptr;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<NcclWork>> inflight_;  // launch order
  std::vector<Pending> pending_;
  Clock::time_point pending_since_{};
  Clock::time_point front_since_{};  // when inflight_.front() became the running op
  Clock::time_point last_peer_check_{};
  std::vector<cuda::Event> free_events_;
  std::vector<cuda::Event> retired_events_;  // of aborted ops
  bool aborted_ = false;
  bool stop_ = false;
  std::thread watchdog_;
};

}  // namespace collie::nccl
