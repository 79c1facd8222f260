// comm/nccl/nccl_state.cc: see nccl_state.h.
#include "comm/nccl/nccl_state.h"

#include <algorithm>

#include "base/log.h"

namespace collie::nccl {

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

Work State::start(Op op) {
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

void State::launch_pending() {
  try {
    std::lock_guard lk(mu_);
    launch_pending_locked();
  } catch (const Error& e) {
    fail(e, nullptr, true);
  }
}

bool State::poll() {
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
        if (ctx_.inspector && w->desc().op != OpKind::p2p) ctx_.inspector->completed(w->desc().seq);
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

void State::fail(const Error& cause, const NcclWork* culprit, bool tell_peers) {
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

std::shared_ptr<void> State::register_memory(const TensorView& t) {
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

void State::wait_on(NcclWork& w, cuda::Stream stream) {
  launch_pending();
  std::lock_guard lk(mu_);
  if (w.done) apis_.cuda->stream_wait(stream, w.done);
}

void State::publish(const Error& e) {
  if (!ctx_.store) return;
  try {
    ctx_.store->compare_set(fail_key_, {},
                            to_bytes(std::to_string(static_cast<int>(e.code())) + ":" + e.what()));
  } catch (const Error&) {
    // The store is gone: the peers see that for themselves.
  }
}

void State::shutdown() {
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

void State::launch_pending_locked() {
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

void State::launch_locked(std::vector<Pending>& ops) {
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
    throw Error(
        r.failed() ? code_of(r) : ErrorCode::timeout,
        "NCCL could not launch " + ops.front().work->description() + ": " +
            (r.failed() ? r.message : "it was still in progress after " + log::seconds(timeout_)));
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

std::optional<Error> State::peer_failure() {
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

void State::watch() {
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

}  // namespace collie::nccl
