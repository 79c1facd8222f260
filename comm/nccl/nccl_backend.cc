// comm/nccl/nccl_backend.cc: the NCCL backend (see nccl_backend.h). The
// logic is built in every build and tested against a fake device; only the
// registry's line depends on whether this build has NCCL.
#include "comm/nccl/nccl_backend.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <thread>
#include <utility>

#include "base/continuations.h"
#include "base/log.h"
#include "base/trace.h"
#include "collie/comm.h"
#include "collie_build_config.h"

namespace collie::nccl {

namespace {

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

ErrorCode code_of(const Result& r) {
  return r.remote ? ErrorCode::peer_lost : ErrorCode::internal;
}

// Polls a non-blocking communicator until its init, split or finalize has
// ended, or `deadline` passes (then the result is still in_progress).
Result settle(Api& api, Comm comm, Result r, Clock::time_point deadline) {
  auto step = kPollMin;
  while (r.code == Result::Code::in_progress && comm) {
    if (Clock::now() >= deadline) return r;
    std::this_thread::sleep_for(step);
    step = std::min<std::chrono::microseconds>(step * 2, kPollMax);
    r = api.async_error(comm);
  }
  return r;
}

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

  Work start(Op op) {
    auto w = std::make_shared<NcclWork>(weak_from_this(), op.desc, rank_, timeout_);
    w->trace = op.trace;
    if (auto first = ctx_.failure->get()) {
      w->end(FailureLatch::earlier(*first, w->description()));
      return Work(w);
    }
    Pending p{std::move(op), w, cuda_stream()};
    try {
      std::unique_lock lk(mu_);
      if (p.op.p2p()) {
        if (pending_.empty()) pending_since_ = Clock::now();
        pending_.push_back(std::move(p));
      } else {
        launch_pending_locked();
        std::vector<Pending> one;
        one.push_back(std::move(p));
        launch_locked(one);
      }
      cv_.notify_one();
    } catch (const Error& e) {
      fail(e, nullptr, true);
      w->end(e, dispatch_);  // when it was never launched
    }
    return Work(w);
  }

  // Launches the point-to-point operations waiting to be grouped.
  void launch_pending() {
    try {
      std::lock_guard lk(mu_);
      launch_pending_locked();
    } catch (const Error& e) {
      fail(e, nullptr, true);
    }
  }

  // Finishes the operations whose events have happened; checks NCCL's
  // state, the deadline and the peers. Returns whether anything is still
  // in flight or waiting to be launched.
  bool poll() {
    std::vector<std::shared_ptr<NcclWork>> ended;
    std::optional<Error> err;
    std::shared_ptr<NcclWork> culprit;
    bool check_peers = false, busy;
    {
      std::lock_guard lk(mu_);
      const auto now = Clock::now();
      try {
        if (!pending_.empty() && now - pending_since_ >= kGroupGrace) launch_pending_locked();
        // NCCL's state first: after an error, kernels end without their
        // result, and their events happen all the same.
        if (!inflight_.empty()) {
          if (Result r = apis_.nccl->async_error(comm_); r.failed())
            err = Error(code_of(r), "NCCL reported an error on rank " + std::to_string(rank_) +
                                        " while " + inflight_.front()->description() +
                                        " was in flight: " + r.message);
        }
        // One stream: events happen in launch order.
        while (!err && !inflight_.empty() && apis_.cuda->query(inflight_.front()->done)) {
          auto& w = inflight_.front();
          if (ctx_.inspector && w->desc().op != OpKind::p2p)
            ctx_.inspector->completed(w->desc().seq);
          free_events_.push_back(std::exchange(w->done, nullptr));
          ended.push_back(std::move(w));
          inflight_.pop_front();
          front_since_ = now;
        }
        if (!err && !inflight_.empty()) {
          if (now - front_since_ >= timeout_) {
            err = Error(ErrorCode::timeout,
                        inflight_.front()->description() + " did not finish within " +
                            log::seconds(timeout_) +
                            ": a peer died, stalled or issued other operations; collie aborted "
                            "the NCCL communicator (NCCL itself would wait for ever)");
            culprit = inflight_.front();
          } else if (ctx_.store && now - last_peer_check_ >= kPeerCheck) {
            last_peer_check_ = now;
            check_peers = true;
          }
        }
      } catch (const Error& e) {
        err = e;
      }
      busy = !inflight_.empty() || !pending_.empty();
    }
    for (auto& w : ended) w->end(std::nullopt, dispatch_);
    // Where every rank is (through the store, a few seconds at most), asked
    // before the abort reaches the peers.
    if (err && culprit && err->code() == ErrorCode::timeout && ctx_.inspector &&
        culprit->desc().op != OpKind::p2p)
      err = ctx_.inspector->explain(culprit->desc(), *err);
    // A failure read from the store is not written back to it.
    bool from_peer = false;
    if (!err && check_peers) {
      err = peer_failure();
      from_peer = err.has_value();
    }
    if (err) {
      fail(*err, culprit.get(), !from_peer);
      return false;
    }
    return busy;
  }

  // Records `cause` (unless a failure is recorded already), aborts the NCCL
  // communicator and fails everything in flight or waiting. `culprit`, when
  // given, fails with `cause` itself, the others with a message that says
  // the communicator failed. `tell_peers`: write the failure into the store
  // for the other ranks' watchdogs (not for a failure read from there).
  void fail(const Error& cause, const NcclWork* culprit, bool tell_peers) {
    const bool first = ctx_.failure->set(cause);
    const Error e = *ctx_.failure->get();
    std::vector<std::shared_ptr<NcclWork>> ended;
    {
      std::lock_guard lk(mu_);
      if (comm_ && !aborted_) {
        apis_.nccl->abort(comm_);
        aborted_ = true;
      }
      for (auto& w : inflight_) {
        retired_events_.push_back(std::exchange(w->done, nullptr));
        ended.push_back(std::move(w));
      }
      inflight_.clear();
      for (auto& p : pending_) ended.push_back(std::move(p.work));
      pending_.clear();
    }
    if (first && tell_peers) publish(e);
    for (auto& w : ended) {
      if (w.get() == culprit && first)
        w->end(e, dispatch_);
      else
        w->end(Error(e.code(),
                     w->description() + " cannot finish: the communicator failed: " + e.what()),
               dispatch_);
    }
    cv_.notify_all();
  }

  // ncclCommRegister; the handle deregisters while the communicator is
  // still there (NCCL frees what is left with the communicator). A
  // registration NCCL refuses is not an error: its collectives then copy.
  std::shared_ptr<void> register_memory(const TensorView& t) {
    void* handle = nullptr;
    {
      std::lock_guard lk(mu_);
      if (!comm_ || aborted_) return nullptr;
      if (!apis_.nccl->register_memory(comm_, t.data, t.nbytes(), &handle).ok() || !handle)
        return nullptr;
    }
    std::weak_ptr<State> weak = weak_from_this();
    return std::shared_ptr<void>(handle, [weak](void* h) {
      if (auto st = weak.lock()) {
        std::lock_guard lk(st->mu_);
        if (st->comm_ && !st->aborted_) st->apis_.nccl->deregister_memory(st->comm_, h);
      }
    });
  }

  // Makes `stream` wait for `w` without the host.
  void wait_on(NcclWork& w, cuda::Stream stream) {
    launch_pending();
    std::lock_guard lk(mu_);
    if (w.done) apis_.cuda->stream_wait(stream, w.done);
  }

  std::unique_ptr<Backend> split(const SplitPlan& plan);

  // Writes this rank's failure into the store, for the peers' watchdogs.
  void publish(const Error& e) {
    if (!ctx_.store) return;
    try {
      ctx_.store->compare_set(
          fail_key_, {}, to_bytes(std::to_string(static_cast<int>(e.code())) + ":" + e.what()));
    } catch (const Error&) {
      // The store is gone: the peers see that for themselves.
    }
  }

  void shutdown() {
    std::vector<std::shared_ptr<NcclWork>> unlaunched;
    {
      std::lock_guard lk(mu_);
      for (auto& p : pending_) unlaunched.push_back(std::move(p.work));
      pending_.clear();
    }
    for (auto& w : unlaunched)
      w->end(Error(ErrorCode::unavailable,
                   w->description() +
                       " never ran: its communicator was destroyed first (nothing waited "
                       "for it, so it was still waiting to be grouped with other sends and "
                       "receives)"),
             dispatch_);
    // What runs ends, or fails at its deadline (poll() enforces it).
    while (poll()) std::this_thread::sleep_for(kPollMin);
    {
      std::lock_guard lk(mu_);
      stop_ = true;
      cv_.notify_all();
    }
    if (watchdog_.joinable()) watchdog_.join();
    std::lock_guard lk(mu_);
    if (comm_ && !aborted_) {
      Result r = settle(*apis_.nccl, comm_, apis_.nccl->finalize(comm_), Clock::now() + timeout_);
      if (r.ok())
        apis_.nccl->destroy(comm_);
      else
        apis_.nccl->abort(comm_);
    }
    comm_ = nullptr;
    continuations_->stop();
  }

 private:
  friend class NcclWork;

  void launch_pending_locked() {
    if (pending_.empty()) return;
    std::vector<Pending> group;
    group.swap(pending_);
    try {
      launch_locked(group);
    } catch (...) {
      // Back where fail() finds them.
      for (Pending& p : group)
        if (p.work) pending_.push_back(std::move(p));
      throw;
    }
  }

  // One collective, or a group of sends and receives, on the stream.
  void launch_locked(std::vector<Pending>& ops) {
    if (aborted_) throw *ctx_.failure->get();
    // After the work the issuing threads queued on their streams.
    cuda::Stream last = nullptr;
    for (size_t i = 0; i < ops.size(); ++i) {
      if (i > 0 && ops[i].after == last) continue;
      last = ops[i].after;
      apis_.cuda->record(ready_, last);
      apis_.cuda->stream_wait(stream_, ready_);
    }
    for (const Pending& p : ops) {
      trace::started(p.op);  // queued on the stream: it runs once those before it have
      trace::algorithm(p.op, "nccl");
    }
    Api& api = *apis_.nccl;
    Result r;
    const Op& op = ops.front().op;
    const OpDesc& d = op.desc;
    switch (d.op) {
      case OpKind::allreduce:
        r = api.allreduce(op.in.data, op.out.data, op.in.numel, d.dtype, d.redop, comm_, stream_);
        break;
      case OpKind::broadcast:
        r = api.broadcast(op.in.data, op.in.data, op.in.numel, d.dtype, d.tag, comm_, stream_);
        break;
      case OpKind::allgather:
        r = api.allgather(op.in.data, op.out.data, op.in.numel, d.dtype, comm_, stream_);
        break;
      case OpKind::reduce_scatter:
        r = api.reduce_scatter(op.in.data, op.out.data, op.out.numel, d.dtype, d.redop, comm_,
                               stream_);
        break;
      case OpKind::barrier:
        // A one-element all-reduce: it ends once every rank has reached it.
        r = api.allreduce(barrier_buf_, barrier_buf_, 1, DType::f32, ReduceOp::sum, comm_, stream_);
        break;
      case OpKind::p2p:
        r = api.group_start();
        for (const Pending& p : ops) {
          if (!r.failed())
            r = p.op.is_send ? api.send(p.op.in.data, p.op.in.numel, p.op.desc.dtype, p.op.peer,
                                        comm_, stream_)
                             : api.recv(p.op.in.data, p.op.in.numel, p.op.desc.dtype, p.op.peer,
                                        comm_, stream_);
        }
        if (Result end = api.group_end(); !r.failed()) r = end;
        break;
      case OpKind::split:
      case OpKind::alltoall:  // host memory only (runs_alltoall is false)
        throw Error(ErrorCode::internal,
                    std::string(to_string(d.op)) + " reached the NCCL launch path");
    }
    r = settle(api, comm_, r, Clock::now() + timeout_);
    if (!r.ok())
      throw Error(r.failed() ? code_of(r) : ErrorCode::timeout,
                  "NCCL could not launch " + ops.front().work->description() + ": " +
                      (r.failed() ? r.message
                                  : "it was still in progress after " + log::seconds(timeout_)));
    const auto now = Clock::now();
    if (inflight_.empty()) front_since_ = now;
    for (Pending& p : ops) {
      cuda::Event e;
      if (free_events_.empty()) {
        e = apis_.cuda->create_event();
      } else {
        e = free_events_.back();
        free_events_.pop_back();
      }
      apis_.cuda->record(e, stream_);
      p.work->done = e;
      inflight_.push_back(std::move(p.work));
    }
  }

  // The failure another rank wrote into the store, if any.
  std::optional<Error> peer_failure() {
    try {
      if (!ctx_.store->check({fail_key_})) return std::nullopt;
      std::string v = to_string(ctx_.store->get(fail_key_));
      size_t colon = v.find(':');
      int code = std::atoi(v.substr(0, colon).c_str());
      if (code < 1 || code > kNumErrorCodes || colon == std::string::npos)
        code = static_cast<int>(ErrorCode::peer_lost);
      return Error(static_cast<ErrorCode>(code),
                   "rank " + std::to_string(rank_) + " stopped because another rank failed: " +
                       v.substr(colon == std::string::npos ? 0 : colon + 1));
    } catch (const Error& e) {
      return Error(ErrorCode::peer_lost,
                   "rank " + std::to_string(rank_) +
                       " lost the store while operations were in flight: " + e.what());
    }
  }

  void watch() {
    try {
      apis_.cuda->set_device(device_);
    } catch (const Error&) {
      // The calls below report the device's state themselves.
    }
    auto step = std::chrono::duration_cast<std::chrono::microseconds>(kPollMin);
    std::unique_lock lk(mu_);
    while (!stop_) {
      if (inflight_.empty() && pending_.empty()) {
        cv_.wait(lk, [&] { return stop_ || !inflight_.empty() || !pending_.empty(); });
        step = kPollMin;
        continue;
      }
      const size_t before = inflight_.size();
      lk.unlock();
      poll();
      lk.lock();
      step = inflight_.size() < before ? std::chrono::microseconds(kPollMin)
                                       : std::min<std::chrono::microseconds>(step * 2, kPollMax);
      cv_.wait_for(lk, step, [&] { return stop_; });
    }
  }

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

bool NcclWork::query() {
  if (!ended())
    if (auto st = state_.lock()) st->poll();
  return ended();
}

bool NcclWork::wait_until(Clock::time_point deadline) {
  auto st = state_.lock();
  if (!st) return block_until(deadline);
  st->launch_pending();
  auto step = std::chrono::microseconds(2);
  for (;;) {
    if (ended()) return true;
    st->poll();
    if (ended()) return true;
    const auto now = Clock::now();
    if (now >= deadline) return false;
    if (block_until(std::min(deadline, now + step))) return true;
    step = std::min<std::chrono::microseconds>(step * 2, kPollMax);
  }
}

void NcclWork::wait_on(void* stream) {
  if (auto st = state_.lock()) st->wait_on(*this, stream);
}

void NcclWork::abort(const Error& e) {
  if (auto st = state_.lock())
    st->fail(e, this, true);
  else
    end(e);
}

class NcclBackend final : public Backend {
 public:
  explicit NcclBackend(std::shared_ptr<State> st) : st_(std::move(st)) {}
  std::string name() const override { return "nccl"; }
  bool accepts(const Device& d) const override {
    return d.kind == Device::Kind::cuda && d.index == st_->device();
  }
  Work start(Op op) override { return st_->start(std::move(op)); }
  std::unique_ptr<Backend> split(const SplitPlan& plan) override { return st_->split(plan); }
  std::shared_ptr<void> register_memory(const TensorView& t) override {
    return accepts(t.device) ? st_->register_memory(t) : nullptr;
  }
  void abort(const Error& e) override {
    // The front has recorded `e` already: fail() would not count it as
    // this rank's first failure, which is what it tells the peers.
    st_->publish(e);
    st_->fail(e, nullptr, false);
  }
  void shutdown() override { st_->shutdown(); }

 private:
  std::shared_ptr<State> st_;
};

std::unique_ptr<Backend> make_over(const BackendContext& ctx, Apis apis, Comm comm, int device) {
  auto st = std::make_shared<State>(ctx, std::move(apis), comm, device);
  st->start_watchdog();
  return std::make_unique<NcclBackend>(std::move(st));
}

std::unique_ptr<Backend> State::split(const SplitPlan& plan) {
  launch_pending();
  if (auto first = ctx_.failure->get())
    throw FailureLatch::earlier(*first, "split on rank " + std::to_string(rank_));
  Comm made = nullptr;
  Result r;
  {
    std::lock_guard lk(mu_);
    r = apis_.nccl->split(comm_, plan.color, plan.key, &made, false);
    // A rank that joins none has no new communicator to poll: the parent
    // says when its part is done.
    r = settle(*apis_.nccl, made ? made : comm_, r, Clock::now() + timeout_);
  }
  if (!r.ok()) {
    if (made) apis_.nccl->abort(made);
    throw Error(r.failed() ? code_of(r) : ErrorCode::timeout,
                "ncclCommSplit on rank " + std::to_string(rank_) + " (color " +
                    std::to_string(plan.color) + ") " +
                    (r.failed() ? "failed: " + r.message
                                : "did not finish within " + log::seconds(timeout_) +
                                      ": a rank of the parent did not call split"));
  }
  if (plan.color < 0) return nullptr;
  return make_over(plan.context, apis_, made, device_);
}

std::unique_ptr<Backend> create(const BackendContext& ctx) {
  return make_backend(ctx, {cuda::device_api(), api()});
}

}  // namespace

std::unique_ptr<Backend> make_backend(const BackendContext& ctx, Apis apis) {
  const config::Launch& launch = ctx.launch;
  const std::string who = ctx.names(launch.rank);
  if (!apis.cuda || !apis.nccl)
    throw Error(ErrorCode::unavailable, who + ": this build of collie has no NCCL");
  std::string why;
  const int devices = apis.cuda->device_count(&why);
  if (devices <= 0)
    throw Error(ErrorCode::unavailable,
                who + ": the nccl backend needs a CUDA device, and none can be used: " + why);
  const int device = launch.local_rank % devices;
  // As every DDP program's torch.cuda.set_device(local_rank): the calling
  // thread's device becomes the communicator's.
  apis.cuda->set_device(device);
  const auto deadline = Clock::now() + launch.timeout;
  UniqueId id{};
  const std::string id_key = ctx.key + "/nccl/id";
  if (launch.rank == 0) {
    if (Result r = apis.nccl->unique_id(&id); !r.ok())
      throw Error(code_of(r), who + ": ncclGetUniqueId failed: " + r.message);
    if (ctx.store) ctx.store->set(id_key, Bytes(id.bytes, id.bytes + sizeof id.bytes));
  }
  if (launch.world_size > 1) {
    if (!ctx.store) throw Error(ErrorCode::internal, who + ": the nccl backend has no store");
    // Rank 0 writes the id before it says it has joined.
    std::vector<std::string> joined;
    for (int q = 0; q < launch.world_size; ++q)
      joined.push_back(ctx.key + "/nccl/joined/" + std::to_string(q));
    ctx.store->set(joined[static_cast<size_t>(launch.rank)], to_bytes("1"));
    wait_for_ranks(*ctx.store, joined, deadline, launch.timeout, who, ctx.names);
    if (launch.rank != 0) {
      Bytes b = ctx.store->get(id_key);
      if (b.size() != sizeof id.bytes)
        throw Error(ErrorCode::mismatch, who + ": NCCL's unique id in the store has " +
                                             std::to_string(b.size()) + " bytes, not " +
                                             std::to_string(sizeof id.bytes));
      std::copy(b.begin(), b.end(), id.bytes);
    }
  }
  Comm comm = nullptr;
  Result r = apis.nccl->init_rank(&comm, launch.world_size, id, launch.rank, false);
  r = settle(*apis.nccl, comm, r, deadline);
  if (!r.ok()) {
    if (comm) apis.nccl->abort(comm);
    if (r.failed()) throw Error(code_of(r), who + ": NCCL's init failed: " + r.message);
    throw Error(ErrorCode::timeout,
                who + ": every rank joined, but NCCL's init did not finish within " +
                    log::seconds(launch.timeout) + " (NCCL_DEBUG=INFO shows where it waits)");
  }
  return make_over(ctx, std::move(apis), comm, device);
}

BackendEntry backend_entry() {
#if COLLIE_HAVE_NCCL
  BackendEntry e{"nccl", true, "", nullptr, &create};
#else
  BackendEntry e{"nccl", false,
                 "this build has no NCCL: configure with -Dcuda=enabled -Dnccl=enabled, with the "
                 "CUDA toolkit and NCCL under CUDA_HOME",
                 nullptr, &create};
#endif
  // CPU tensors cannot go to it, so `auto` never picks it on its own.
  e.automatic = false;
  return e;
}

}  // namespace collie::nccl
