#include "collie/work.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <ctime>
#include <optional>
#include <thread>
#include <utility>

namespace collie {

Completion::Completion(std::string description, std::chrono::milliseconds default_timeout)
    : description_(std::move(description)), default_timeout_(default_timeout) {}

Completion::~Completion() = default;

bool Completion::query() {
  return ended();
}

bool Completion::wait_until(Clock::time_point deadline) {
  return block_until(deadline);
}

bool Completion::wait_for(std::chrono::milliseconds timeout) {
  return ended() || wait_until(Clock::now() + timeout);
}

void Completion::wait_on(void* /*stream*/) {
  // Nothing runs on a stream for a host operation: the stream may go on once
  // the host has seen the end.
  if (!wait_for(default_timeout_))
    throw Error(ErrorCode::timeout, description() + " did not complete within " +
                                        std::to_string(default_timeout_.count()) + " ms");
}

void Completion::abort(const Error& e) {
  finish(e);
}

void Completion::finish(std::optional<Error> e, const Dispatch& dispatch) {
  if (claimed_.exchange(1, std::memory_order_acq_rel) != 0) {
    // A later call returns once the end it lost to is visible, as it did
    // when both took a lock (a few instructions away).
    for (int i = 0; !done_.load(std::memory_order_acquire); ++i)
      if (i >= 1000) std::this_thread::yield();  // the winner was preempted
    return;
  }
  error_ = std::move(e);
  // seq_cst, then the waiter count and the callback flag: a waiter counts
  // itself (block_until), and on_complete() raises the flag, before looking
  // at done_, so one of the two sees the other.
  done_.store(1, std::memory_order_seq_cst);
  if (waiters_.load(std::memory_order_seq_cst) != 0)
    syscall(SYS_futex, &done_, FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
  if (!has_callbacks_.load(std::memory_order_seq_cst)) return;
  std::vector<std::function<void()>> cbs;
  {
    std::lock_guard lk(mu_);
    cbs.swap(callbacks_);
  }
  if (cbs.empty()) return;
  if (dispatch) {
    dispatch(std::move(cbs));
    return;
  }
  for (auto& cb : cbs) cb();
}

bool Completion::ended() const {
  return done_.load(std::memory_order_acquire);
}

std::optional<Error> Completion::error() const {
  // error_ is written before done_ and never after it.
  if (!done_.load(std::memory_order_acquire)) return std::nullopt;
  return error_;
}

void Completion::on_complete(std::function<void()> fn) {
  if (done_.load(std::memory_order_acquire)) {
    fn();
    return;
  }
  std::unique_lock lk(mu_);
  callbacks_.push_back(std::move(fn));
  has_callbacks_.store(1, std::memory_order_seq_cst);
  if (!done_.load(std::memory_order_seq_cst)) return;
  // The end came meanwhile, and its finish() may have looked at the flag
  // before it was raised: whichever takes the callbacks runs them, once.
  std::vector<std::function<void()>> cbs;
  cbs.swap(callbacks_);
  lk.unlock();
  for (auto& cb : cbs) cb();
}

bool Completion::block_until(Clock::time_point deadline) {
  if (done_.load(std::memory_order_acquire)) return true;
  waiters_.fetch_add(1, std::memory_order_seq_cst);
  bool ended = false;
  for (;;) {
    if (done_.load(std::memory_order_seq_cst)) {
      ended = true;
      break;
    }
    const auto now = Clock::now();
    if (now >= deadline) break;
    // FUTEX_WAIT's timeout is relative, on CLOCK_MONOTONIC (steady_clock's
    // clock); an hour at most, then look again (a far deadline overflows).
    const auto nap = std::min<Clock::duration>(deadline - now, std::chrono::hours(1));
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(nap).count();
    timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
    syscall(SYS_futex, &done_, FUTEX_WAIT_PRIVATE, 0, &ts, nullptr, 0);
  }
  waiters_.fetch_sub(1, std::memory_order_relaxed);
  return ended;
}

namespace {

std::shared_ptr<Completion> done_completion(std::optional<Error> e) {
  auto c = std::make_shared<Completion>(e ? std::string(e->what()) : std::string("no-op"),
                                        std::chrono::milliseconds(0));
  c->finish(std::move(e));
  return c;
}

// Runs a then() callback; returns what it threw. `body` (with the callback
// it owns) is gone when this returns.
std::optional<Error> run_guarded(std::function<void()> body) {
  std::optional<Error> err;
  try {
    std::exchange(body, nullptr)();
  } catch (const Error& e) {
    err = e;
  } catch (const std::exception& e) {
    err = Error(ErrorCode::internal, std::string("callback in then() threw: ") + e.what());
  }
  return err;
}

}  // namespace

Work::Work() : c_(done_completion(std::nullopt)) {}

Work::Work(std::shared_ptr<Completion> completion) : c_(std::move(completion)) {}

Work Work::pending(std::string description, std::chrono::milliseconds default_timeout) {
  return Work(std::make_shared<Completion>(std::move(description), default_timeout));
}

Work Work::failed(const Error& e) {
  return Work(done_completion(e));
}

bool Work::done() const {
  return c_->query();
}

void Work::wait() const {
  wait(c_->default_timeout());
}

void Work::wait(std::chrono::milliseconds timeout) const {
  if (!c_->wait_for(timeout))
    throw Error(ErrorCode::timeout, c_->description() + " did not complete within " +
                                        std::to_string(timeout.count()) + " ms");
  if (auto e = c_->error()) throw *e;
}

std::optional<Error> Work::error() const {
  return c_->error();
}

std::string Work::description() const {
  return c_->description();
}

void Work::complete() const {
  c_->finish(std::nullopt);
}
void Work::fail(const Error& e) const {
  c_->finish(e);
}

// The function (and all it captured) is destroyed before `result`
// completes: a waiter may free what the captures point to, or end the
// program, as soon as it sees the result, and a release that ran later on
// the completing thread would race it (bucket memory from an engine's
// allocator, released on collie's thread while Python shut down).
Work Work::then(std::function<void(const Work&)> fn) const {
  Work result = pending(description() + " -> then", c_->default_timeout());
  Work self = *this;
  c_->on_complete([self, result, fn = std::move(fn)]() mutable {
    std::optional<Error> err = run_guarded([&, f = std::exchange(fn, nullptr)] { f(self); });
    if (err)
      result.fail(*err);
    else
      result.complete();
  });
  return result;
}

Work Work::then_work(std::function<Work(const Work&)> fn) const {
  Work result = pending(description() + " -> then", c_->default_timeout());
  Work self = *this;
  c_->on_complete([self, result, fn = std::move(fn)]() mutable {
    Work inner;
    std::optional<Error> err =
        run_guarded([&, f = std::exchange(fn, nullptr)] { inner = f(self); });
    if (err) return result.fail(*err);
    inner.c_->on_complete([inner, result] {
      if (auto e = inner.error())
        result.fail(*e);
      else
        result.complete();
    });
  });
  return result;
}

void Work::wait_on(void* stream) const {
  c_->wait_on(stream);
  if (auto e = c_->error()) throw *e;
}

void wait_all(const std::vector<Work>& works) {
  std::optional<Error> first;
  for (const Work& w : works) {
    try {
      w.wait();
    } catch (const Error& e) {
      if (!first) first = e;
    }
  }
  if (first) throw *first;
}

}  // namespace collie
