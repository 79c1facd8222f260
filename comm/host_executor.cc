#include "comm/host_executor.h"

#include <time.h>

#include "base/log.h"
#include "base/nonfinite.h"
#include "base/trace.h"
#include "comm/deterministic.h"

namespace collie {

namespace {
// How long the progress thread leaves a fresh op to a waiter.
constexpr auto kGrace = std::chrono::microseconds(100);
// After this long with no op issued, the progress thread sleeps until a
// submit wakes it; before, it looks at the queue by itself, every kGrace at
// first, then at twice the interval each time it found nothing to do (the
// queue empty, or its op taken by a waiter), up to kMaxPoll; running an op
// itself brings it back to kGrace. Each look is a wake-up that preempts a
// rank spinning on the same core: at a fixed 100 us, they cost the mpi
// backend's 32 KiB to 2 MiB all-reduces 30 to 50% on 2 cores.
constexpr auto kIdle = std::chrono::milliseconds(5);
constexpr auto kMaxPoll = std::chrono::microseconds(1000);
}  // namespace

// `timeout` from now, by the kernel's tick clock (CLOCK_MONOTONIC_COARSE:
// steady_clock's base, up to a tick behind it) plus a tick: never before
// the precise deadline, at most a tick (4 ms here) after it, for a quarter
// of a precise clock read's cost (6 against 24 ns here; that read was a
// twentieth of an 8 B shm all-reduce).
Deadline deadline_after(std::chrono::milliseconds timeout) {
  using std::chrono::nanoseconds;
  static const nanoseconds tick = [] {
    timespec r{};
    if (clock_getres(CLOCK_MONOTONIC_COARSE, &r) != 0) return nanoseconds(-1);
    return nanoseconds(static_cast<int64_t>(r.tv_sec) * 1000000000 + r.tv_nsec);
  }();
  timespec ts{};
  if (tick.count() < 0 || clock_gettime(CLOCK_MONOTONIC_COARSE, &ts) != 0)
    return Deadline::clock::now() + timeout;
  return Deadline(nanoseconds(static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec) + tick) +
         timeout;
}

// A completion the executor ends; a waiter runs the queue up to it.
class HostExecutor::Queued final : public OpCompletion {
 public:
  Queued(const OpDesc& desc, int rank, std::chrono::milliseconds timeout,
         std::shared_ptr<HostExecutor> ex, uint64_t ticket)
      : OpCompletion(desc, rank, timeout), ex_(std::move(ex)), ticket_(ticket) {}

  bool wait_until(Clock::time_point deadline) override {
    run_to_here();
    return block_until(deadline);
  }
  // Work::wait: after this thread ran the op, no clock read (a tenth of an
  // 8 B shm all-reduce's time went to three). A wait shorter than the op's
  // own deadline is the caller's limit (PyTorch's Work.wait(timeout)): it
  // runs nothing, leaving the queue to the progress thread, and ends at the
  // limit whatever runs (this thread running the op could take the op's
  // deadline and those of the ops ahead of it).
  bool wait_for(std::chrono::milliseconds timeout) override {
    if (timeout >= default_timeout()) run_to_here();
    return ended() || block_until(Clock::now() + timeout);
  }

 private:
  void run_to_here() {
    if (!ended()) ex_->run_until(ticket_);
  }

  // Kept alive by its ops (a weak pointer cost three locked instructions
  // per op); once shut down, it has ended every op and runs nothing.
  const std::shared_ptr<HostExecutor> ex_;
  const uint64_t ticket_;
};

HostExecutor::HostExecutor(HostRunner& runner, std::shared_ptr<FailureLatch> failure, int rank,
                           std::chrono::milliseconds timeout,
                           std::shared_ptr<StallInspector> inspector, int world_size,
                           std::shared_ptr<arrivals::Log> arrivals)
    : runner_(runner),
      failure_(std::move(failure)),
      inspector_(std::move(inspector)),
      arrivals_(std::move(arrivals)),
      rank_(rank),
      size_(world_size),
      timeout_(timeout),
      continuations_(std::make_shared<ContinuationThread>()),
      poll_(kGrace) {
  // The continuation thread is shared with the dispatch function, which
  // completions may still call after this executor is gone.
  dispatch_ = ContinuationThread::dispatch_to(continuations_);
}

std::shared_ptr<HostExecutor> HostExecutor::start(HostRunner& runner,
                                                  std::shared_ptr<FailureLatch> failure, int rank,
                                                  std::chrono::milliseconds timeout,
                                                  std::shared_ptr<StallInspector> inspector,
                                                  int world_size,
                                                  std::shared_ptr<arrivals::Log> arrivals) {
  auto ex = std::make_shared<HostExecutor>(runner, std::move(failure), rank, timeout,
                                           std::move(inspector), world_size, std::move(arrivals));
  ex->thread_ = std::thread([weak = std::weak_ptr<HostExecutor>(ex)] {
    if (auto self = weak.lock()) self->loop();
  });
  return ex;
}

HostExecutor::~HostExecutor() {
  if (thread_.joinable()) thread_.detach();  // shutdown() joins; this only guards misuse
}

std::string HostExecutor::rank_str() const {
  return "rank " + std::to_string(rank_);
}

Work HostExecutor::submit(Op op) {
  std::shared_ptr<Queued> done;
  bool wake = false;
  {
    std::lock_guard lk(mu_);
    // A waiter gives up only after the op's own deadline (and that of one op
    // ahead of it) has passed, so the op's error, which says what it was
    // waiting for, arrives first.
    if (stop_) {
      Error e(ErrorCode::unavailable, op.desc.describe() + " on " + rank_str() +
                                          " was issued while its communicator was being destroyed");
      trace::finished(op, e);
      return Work::failed(e);
    }
    uint64_t ticket = next_ticket_++;
    done = std::make_shared<Queued>(op.desc, rank_, timeout_, shared_from_this(), ticket);
    const bool p2p = op.p2p();
    last_issued_ = std::chrono::steady_clock::now();
    queue_.push_back({std::move(op), done, ticket, last_issued_});
    // A running point-to-point batch takes in later sends and receives.
    if (busy_ && running_p2p_ && p2p) runner_.wake();
    // Only a progress thread in its long sleep needs the futex call: one
    // that polls sees the op within kGrace, by when its waiter has usually
    // run it. (Waking it for every op cost a wake-up, a context switch and
    // a preempted spinner per op: most of a small op's time.)
    wake = sleeping_;
    sleeping_ = false;
  }
  if (wake) cv_.notify_all();
  return Work(std::move(done));
}

thread_local std::vector<HostExecutor::Task> HostExecutor::spare_;

void HostExecutor::pop_batch(std::vector<Task>& batch) {
  batch.push_back(std::move(queue_.front()));
  queue_.pop_front();
  running_p2p_ = batch[0].op.p2p();
  // Point-to-point ops issued back to back progress together, so that an
  // exchange written as send-then-receive on both sides cannot deadlock.
  if (running_p2p_)
    while (!queue_.empty() && queue_.front().op.p2p()) {
      batch.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
}

void HostExecutor::run_until(uint64_t ticket) {
  std::vector<Task> batch = std::move(spare_);
  for (;;) {
    {
      std::lock_guard lk(mu_);
      if (stop_ || busy_ || queue_.empty() || queue_.front().ticket > ticket) break;
      pop_batch(batch);
      busy_ = true;
    }
    execute_and_release(batch);
    const bool reached = batch.back().ticket >= ticket;  // its own op has run
    batch.clear();
    if (reached) break;
  }
  spare_ = std::move(batch);
}

void HostExecutor::loop() {
  std::vector<Task> batch;
  for (;;) {
    {
      std::unique_lock lk(mu_);
      if (stop_) return;
      if (busy_ || queue_.empty()) {
        // Whoever runs an op notifies when it leaves ops queued; a submit
        // notifies only while sleeping_ is set.
        auto now = std::chrono::steady_clock::now();
        if (now - last_issued_ >= kIdle) {
          sleeping_ = true;
          cv_.wait(lk, [&] { return stop_ || !sleeping_ || (!busy_ && !queue_.empty()); });
          sleeping_ = false;
          poll_ = kGrace;  // a new burst of ops
        } else {
          cv_.wait_until(lk, now + poll_);
          poll_ = std::min<std::chrono::microseconds>(2 * poll_, kMaxPoll);
        }
        continue;
      }
      // A fresh op is usually waited for at once, and its waiter runs it
      // (run_until). Leave it to the waiter for a moment: when both threads
      // raced for it, the op ran here half the time and its waiter then had
      // to be woken (tens of microseconds on this kind of VM, twice the
      // op itself): the bimodal small-message time. An op nobody waits for
      // starts kGrace after this thread sees it, which is at once after an
      // idle spell, and within kGrace to kMaxPoll in a burst of ops. (This
      // needs each op's issue time: dating ops by this thread's own looks
      // instead, to save submit a clock read, made an op queued while this
      // thread ran the one before wait kGrace more, between every two
      // buckets of a reducer's overlapped all-reduces.)
      auto grace_end = queue_.front().issued + kGrace;
      if (std::chrono::steady_clock::now() < grace_end) {
        cv_.wait_until(lk, grace_end, [&] { return stop_ || busy_ || queue_.empty(); });
        if (stop_) return;
        if (busy_ || queue_.empty()) continue;
      }
      poll_ = kGrace;  // ops wait for this thread: look often
      pop_batch(batch);
      busy_ = true;
    }
    execute_and_release(batch);
    batch.clear();
  }
}

void HostExecutor::release() {
  bool more;
  {
    std::lock_guard lk(mu_);
    busy_ = false;
    running_p2p_ = false;
    more = !queue_.empty() || stop_;
  }
  // Only the progress thread waits on cv_ (waiters block on their own
  // completion), and it has nothing to do unless ops are queued: waking it
  // for nothing cost every op a futex call and a context switch.
  if (more) cv_.notify_all();
}

void HostExecutor::execute_and_release(std::vector<Task>& batch) {
  const bool traced = batch[0].op.trace;  // (execute may end some spans)
  std::optional<Error> err = execute(batch);
  // Before the executor is released: the next op's run starts after this.
  if (traced)
    for (auto& t : batch) trace::finished(t.op, err);
  release();
  // Ended only now, with the executor free: a woken waiter can run its next
  // op at once, and continuations go to their own thread. Point-to-point ops
  // that finished inside the batch have ended already (first finish wins).
  for (auto& t : batch) t.done->finish(err, dispatch_);
}

bool HostExecutor::claim(const Op& op) {
  if (op.p2p()) return false;  // sends and receives progress in batches
  std::lock_guard lk(mu_);
  if (stop_ || busy_ || !queue_.empty()) return false;
  busy_ = true;
  return true;
}

void HostExecutor::run_claimed(Op& op) {
  std::optional<Error> err;
  if (auto first = failure_->get())
    err = FailureLatch::earlier(*first, op.desc.describe() + " on " + rank_str());
  else
    err = execute_collective(op);
  if (op.trace) trace::finished(op, err);
  release();
  if (err) throw *err;
}

std::optional<Error> HostExecutor::execute_collective(Op& op) {
  try {
    if (op.trace) trace::started(op);
    const bool timed = arrivals_ && arrivals::timed(op.desc);
    const uint64_t arrived = timed ? arrivals::ticks() : 0;
    uint32_t last = op.desc.seq;
    if (op.seen) {
      if (op.deterministic || !runner_.searches_nonfinite(op))
        op.seen->search(rank_, op.in.dtype, op.in.data, 0, op.in.numel);
      else
        op.seen->searched =
            true;  // by the runner, in its reduction (some ranks' parts may be empty)
    }
    if (op.deterministic) {
      // Its steps, one after another on this thread, within the op's deadline.
      const Deadline dl = deadline_after(timeout_);
      last =
          run_deterministic(op, rank_, size_, runner_.runs_alltoall(), runner_.sums_in_rank_order(),
                            scratch_, [&](Op& s) { runner_.run_collective(s, dl); });
    } else {
      runner_.run_collective(op, deadline_after(timeout_));
    }
    if (timed) arrivals_->record(op.desc.seq, arrivals::ticks() - arrived);
    if (inspector_) inspector_->completed(last);
    return std::nullopt;
  } catch (const std::exception& ex) {
    return failure_of(op, ex);
  }
}

Error HostExecutor::failure_of(const Op& op, const std::exception& ex) {
  if (auto* e = dynamic_cast<const Error*>(&ex)) {
    // A collective of its own that passed its deadline (not a peer's
    // failure, not an abort): ask every rank where it is, for the message.
    if (e->code() == ErrorCode::timeout && inspector_ && !op.p2p() && !failure_->failed())
      return fail(inspector_->explain(op.desc, *e));
    return fail(*e);
  }
  return fail(Error(ErrorCode::internal, op.desc.describe() + ": " + ex.what()));
}

std::optional<Error> HostExecutor::execute(std::vector<Task>& batch) {
  if (auto first = failure_->get()) {
    // One error per op: each names itself and the cause.
    for (auto& t : batch) {
      Error e = FailureLatch::earlier(*first, t.op.desc.describe() + " on " + rank_str());
      trace::finished(t.op, e);
      t.done->finish(e, dispatch_);
    }
    return std::nullopt;
  }
  if (!batch[0].op.p2p()) return execute_collective(batch[0].op);
  try {
    if (batch[0].op.trace)  // COLLIE_TRACE: a communicator's ops all have a span, or none
      for (auto& t : batch) trace::started(t.op);
    P2pBatch p;
    for (auto& t : batch) p.ops.push_back(t.op);
    p.finished = [&](size_t i) {
      trace::finished(batch[i].op, std::nullopt);  // (p.ops[i] carries it no further)
      batch[i].done->finish(std::nullopt, dispatch_);
    };
    p.refill = [&] {
      std::lock_guard lk(mu_);
      bool added = false;
      while (!queue_.empty() && queue_.front().op.p2p()) {
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
        trace::started(batch.back().op);
        p.ops.push_back(batch.back().op);
        added = true;
      }
      return added;
    };
    runner_.run_p2p(p, deadline_after(timeout_));
    return std::nullopt;
  } catch (const std::exception& ex) {
    return failure_of(batch[0].op, ex);
  }
}

Error HostExecutor::fail(Error e) {
  // An abort from another thread stopped the run: report its cause.
  if (!failure_->set(e)) e = *failure_->get();
  log::info(std::string("communicator failed: ") + e.what());
  runner_.abort_peers(e);
  return e;
}

void HostExecutor::abort(const Error& e) {
  {
    std::lock_guard lk(mu_);
    if (stop_) return;
    if (busy_) {
      runner_.wake();
      return;
    }
    busy_ = true;
  }
  // Nothing runs: tell the peers now, holding the executor.
  runner_.abort_peers(e);
  {
    std::lock_guard lk(mu_);
    busy_ = false;
  }
  cv_.notify_all();
}

void HostExecutor::shutdown() {
  {
    std::unique_lock lk(mu_);
    if (stop_) return;
    stop_ = true;
    cv_.notify_all();
    cv_.wait(lk, [&] { return !busy_; });
  }
  if (thread_.joinable()) {
    if (thread_.get_id() == std::this_thread::get_id())
      thread_.detach();
    else
      thread_.join();
  }
  std::vector<Task> left;
  {
    std::lock_guard lk(mu_);
    for (; !queue_.empty(); queue_.pop_front()) left.push_back(std::move(queue_.front()));
  }
  for (auto& t : left) {
    Error e(ErrorCode::unavailable, t.op.desc.describe() + " on " + rank_str() +
                                        " never ran: its communicator was destroyed first");
    trace::finished(t.op, e);
    t.done->finish(e, dispatch_);
  }
  runner_.close();
  continuations_->stop();
}

namespace {

class HostBackend final : public Backend {
 public:
  HostBackend(std::string name, RunnerFactory make, RunnerSplitter split,
              std::unique_ptr<HostRunner> runner, const BackendContext& ctx)
      : name_(std::move(name)), make_(make), split_(split), runner_(std::move(runner)) {
    exec_ = HostExecutor::start(*runner_, ctx.failure, ctx.launch.rank, ctx.launch.timeout,
                                ctx.inspector, ctx.launch.world_size, ctx.arrivals);
  }
  // The executor stops before the runner it drives goes.
  ~HostBackend() override { exec_->shutdown(); }

  std::string name() const override { return name_; }
  bool accepts(const Device& d) const override { return d.is_cpu(); }
  Work start(Op op) override { return exec_->submit(std::move(op)); }
  bool claim(const Op& op) override { return exec_->claim(op); }
  bool runs_alltoall() const override { return runner_->runs_alltoall(); }
  void run_claimed(Op& op) override { exec_->run_claimed(op); }
  std::unique_ptr<Backend> split(const SplitPlan& plan) override {
    std::unique_ptr<HostRunner> r;
    if (split_)
      r = split_(*runner_, plan);
    else if (plan.color >= 0)
      r = make_(plan.context);
    if (!r) return nullptr;
    return std::make_unique<HostBackend>(name_, make_, split_, std::move(r), plan.context);
  }
  void abort(const Error& e) override { exec_->abort(e); }
  void shutdown() override { exec_->shutdown(); }
  std::shared_ptr<void> allocate(size_t bytes) override {
    if (auto p = runner_->allocate(bytes)) return p;
    return Backend::allocate(bytes);
  }

 private:
  const std::string name_;
  const RunnerFactory make_;
  const RunnerSplitter split_;
  std::unique_ptr<HostRunner> runner_;
  std::shared_ptr<HostExecutor> exec_;
};

}  // namespace

std::unique_ptr<Backend> make_host_backend(std::string name, RunnerFactory make,
                                           const BackendContext& ctx, RunnerSplitter split) {
  return std::make_unique<HostBackend>(std::move(name), make, split, make(ctx), ctx);
}

}  // namespace collie
