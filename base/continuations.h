// base/continuations.h: the thread a communicator's continuations
// (Work::then) run on, so that they never run on the thread that moves
// bytes (the host executor's) or watches the device (nccl's watchdog).
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "collie/work.h"

namespace collie {

// One thread that runs continuations in the order their operations ended.
// Started on first use: communicators whose operations nobody chains to
// never start it. Owned by shared_ptrs only: the running thread holds a
// reference to it, so that a continuation that drops the last other one
// (it destroyed its own communicator, and with it the Works that held the
// dispatch) does not free the queue and mutex its loop is still using.
class ContinuationThread : public std::enable_shared_from_this<ContinuationThread> {
 public:
  void post(std::vector<std::function<void()>> fns) {
    {
      std::lock_guard lk(mu_);
      if (!stopped_) {
        for (auto& f : fns) q_.push_back(std::move(f));
        if (!thread_.joinable())
          thread_ = std::thread([self = shared_from_this()] { self->loop(); });
        cv_.notify_one();
        return;
      }
    }
    for (auto& f : fns) f();  // after shutdown: run here
  }

  // Runs what is queued, then ends the thread.
  void stop() {
    std::thread t;
    {
      std::lock_guard lk(mu_);
      stopped_ = true;
      cv_.notify_one();
      t = std::move(thread_);
    }
    if (!t.joinable()) return;
    // A continuation that destroys its own communicator ends up here on the
    // continuation thread: it cannot join itself, and the thread ends on its
    // own once the queue is empty.
    if (t.get_id() == std::this_thread::get_id())
      t.detach();
    else
      t.join();
  }

  // The Dispatch that completions finish through. It shares the thread:
  // completions may still call it after their backend is gone.
  static Dispatch dispatch_to(const std::shared_ptr<ContinuationThread>& c) {
    return [c](std::vector<std::function<void()>> fns) { c->post(std::move(fns)); };
  }

 private:
  void loop() {
    std::unique_lock lk(mu_);
    for (;;) {
      cv_.wait(lk, [&] { return stopped_ || !q_.empty(); });
      if (q_.empty()) return;
      auto fn = std::move(q_.front());
      q_.pop_front();
      lk.unlock();
      fn();
      lk.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> q_;
  bool stopped_ = false;
  std::thread thread_;
};

}  // namespace collie
