#include "collie/work.h"

#include <condition_variable>
#include <mutex>
#include <vector>

namespace collie {

struct Work::State {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::optional<Error> error;
  std::string description;
  std::chrono::milliseconds default_timeout{300000};
  std::vector<std::function<void()>> callbacks;
  std::function<bool()> inline_runner;

  // Runs `fn` when the state completes: now, on this thread, if it already has.
  void on_complete(std::function<void()> fn) {
    std::unique_lock lk(mu);
    if (!done) {
      callbacks.push_back(std::move(fn));
      return;
    }
    lk.unlock();
    fn();
  }

  void finish(std::optional<Error> e) {
    std::vector<std::function<void()>> cbs;
    {
      std::lock_guard lk(mu);
      if (done) return;
      done = true;
      error = std::move(e);
      cbs.swap(callbacks);
      inline_runner = nullptr;
    }
    cv.notify_all();
    for (auto& cb : cbs) cb();
  }
};

Work::Work() : state_(std::make_shared<State>()) {
  state_->done = true;
}

Work Work::pending(std::string description, std::chrono::milliseconds default_timeout) {
  auto s = std::make_shared<State>();
  s->description = std::move(description);
  s->default_timeout = default_timeout;
  return Work(std::move(s));
}

Work Work::failed(const Error& e) {
  auto s = std::make_shared<State>();
  s->done = true;
  s->error = e;
  return Work(std::move(s));
}

bool Work::done() const {
  std::lock_guard lk(state_->mu);
  return state_->done;
}

void Work::wait() const {
  wait(state_->default_timeout);
}

void Work::wait(std::chrono::milliseconds timeout) const {
  State& s = *state_;
  std::function<bool()> runner;
  {
    std::lock_guard lk(s.mu);
    runner = s.inline_runner;
  }
  // Running the op here, when it is next in line, saves handing it to the
  // progress thread and being woken again when it is done.
  if (runner) runner();
  std::unique_lock lk(s.mu);
  if (!s.cv.wait_for(lk, timeout, [&] { return s.done; }))
    throw Error(ErrorCode::timeout, s.description + " did not complete within " +
                                        std::to_string(timeout.count()) + " ms");
  if (s.error) throw *s.error;
}

std::optional<Error> Work::error() const {
  std::lock_guard lk(state_->mu);
  return state_->error;
}

std::string Work::description() const {
  std::lock_guard lk(state_->mu);
  return state_->description;
}

void Work::complete() const {
  state_->finish(std::nullopt);
}
void Work::fail(const Error& e) const {
  state_->finish(e);
}

void Work::set_inline_runner(std::function<bool()> runner) const {
  std::lock_guard lk(state_->mu);
  if (!state_->done) state_->inline_runner = std::move(runner);
}

namespace {
void run_guarded(const Work& result, const std::function<void()>& body) {
  try {
    body();
  } catch (const Error& e) {
    result.fail(e);
  } catch (const std::exception& e) {
    result.fail(Error(ErrorCode::internal, std::string("callback in then() threw: ") + e.what()));
  }
}
}  // namespace

Work Work::then(std::function<void(const Work&)> fn) const {
  Work result = pending(description() + " -> then", state_->default_timeout);
  Work self = *this;
  state_->on_complete([self, result, fn = std::move(fn)] {
    run_guarded(result, [&] {
      fn(self);
      result.complete();
    });
  });
  return result;
}

Work Work::then_work(std::function<Work(const Work&)> fn) const {
  Work result = pending(description() + " -> then", state_->default_timeout);
  Work self = *this;
  state_->on_complete([self, result, fn = std::move(fn)] {
    run_guarded(result, [&] {
      Work inner = fn(self);
      inner.state_->on_complete([inner, result] {
        auto e = inner.error();
        if (e)
          result.fail(*e);
        else
          result.complete();
      });
    });
  });
  return result;
}

void Work::wait_on(void* /*stream*/) const {
  wait();
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
