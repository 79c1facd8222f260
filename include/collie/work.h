// collie/work.h: the handle of an operation in flight, and the completion
// interface behind it.
//
// Every communicator call returns a Work at once. A Work is cheap to copy:
// copies share one Completion, which is what the backend that runs the
// operation hands back:
//
//   Work w = comm.allreduce(grad, ReduceOp::avg);
//   ... compute ...
//   w.wait();                      // throws collie::Error if the op failed
//
// then() chains: the function runs once this Work completes and the returned
// Work completes when the function returns (or, for then_work, when the Work
// the function returns does). Comm hooks are built this way. Continuations of
// a communicator's operations run on that communicator's continuation
// thread, never on the thread that moves its bytes: they may compute, issue
// more operations and wait for them without holding communication up. They
// should not wait for another continuation's result (both would be queued on
// the one continuation thread).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "collie/error.h"

namespace collie {

// Runs continuations somewhere other than the calling thread.
using Dispatch = std::function<void(std::vector<std::function<void()>>)>;

// How an operation in flight ends. The base class is a host completion that
// whoever runs the operation ends with finish(); a backend derives from it
// where "ended" is something to poll (a CUDA event), where a waiter can run
// the operation itself (the host executor), or where a stream can wait
// without the host (NCCL). The virtual functions are the interface: query,
// wait with a deadline (or a timeout), make a stream wait, abort.
class Completion {
 public:
  using Clock = std::chrono::steady_clock;

  Completion(std::string description, std::chrono::milliseconds default_timeout);
  virtual ~Completion();
  Completion(const Completion&) = delete;
  Completion& operator=(const Completion&) = delete;

  // Whether the operation has ended, without blocking. A device completion
  // polls its event here and finishes itself when it has.
  virtual bool query();
  // Blocks until the operation has ended or `deadline` passes; returns
  // whether it ended.
  virtual bool wait_until(Clock::time_point deadline);
  // The same with a timeout: an operation that has ended by the time this
  // is called reads no clock. A backend whose waiter runs the operation
  // itself (the host executor) does so when `timeout` is at least the
  // operation's own deadline, counting it from the end of that run; a
  // shorter wait runs nothing and ends at `timeout`.
  virtual bool wait_for(std::chrono::milliseconds timeout);
  // Makes `stream` (a cudaStream_t) wait for the operation. A host
  // operation has no stream work: this waits for it on the host.
  virtual void wait_on(void* stream);
  // Ends the operation with `e` if it has not ended. A device operation
  // cannot be cancelled on its own: its completion aborts the communicator.
  virtual void abort(const Error& e);

  // Records the end (the first call wins), wakes waiters and runs the
  // continuations: on this thread, or through `dispatch` when given.
  void finish(std::optional<Error> e, const Dispatch& dispatch = {});
  // Whether finish() has been called (no polling).
  bool ended() const;
  std::optional<Error> error() const;
  // What the operation is, for messages: the description given, else
  // describe() (a subclass may format it only when asked).
  std::string description() const { return description_.empty() ? describe() : description_; }
  std::chrono::milliseconds default_timeout() const { return default_timeout_; }
  // Runs fn once the operation has ended: now, on this thread, if it has.
  void on_complete(std::function<void()> fn);

 protected:
  virtual std::string describe() const { return "an operation"; }
  // Waits for finish() (asleep on done_), at most until `deadline`.
  bool block_until(Clock::time_point deadline);

 private:
  // Guards callbacks_. Waiters sleep on done_ (a futex word), not on a
  // condition variable: one was built, notified and destroyed for every
  // operation, waited for or not.
  mutable std::mutex mu_;
  // 1 once finish() has claimed the end: the first call wins (one
  // exchange; a lock and an unlock cost every small op twice that).
  std::atomic<uint32_t> claimed_{0};
  // 1 once ended: set once, after error_, by the finish() that claimed the
  // end; ended(), error() and a wait after the end take no lock.
  std::atomic<uint32_t> done_{0};
  std::atomic<uint32_t> waiters_{0};        // threads in block_until
  std::atomic<uint32_t> has_callbacks_{0};  // on_complete() queued one
  std::optional<Error> error_;
  std::vector<std::function<void()>> callbacks_;
  const std::string description_;
  const std::chrono::milliseconds default_timeout_;
};

class Work {
 public:
  // An empty handle: already complete, successfully.
  Work();
  explicit Work(std::shared_ptr<Completion> completion);

  bool done() const;
  // Waits until complete, at most `timeout` (by default a little over twice
  // the communicator's timeout, so that the op's own error comes first). On
  // a host backend the waiting thread first runs the queued ops up to its
  // own, each within the communicator's timeout, and the `timeout` counts
  // from then.
  // Throws the operation's error, or Error{timeout} naming the operation if
  // it is not complete in time.
  void wait() const;
  void wait(std::chrono::milliseconds timeout) const;
  // The error the operation failed with; empty while running or on success.
  std::optional<Error> error() const;
  // What the operation is, for messages: "allreduce #12 (f32 x 1024, sum)".
  std::string description() const;

  Work then(std::function<void(const Work&)> fn) const;
  Work then_work(std::function<Work(const Work&)> fn) const;

  // Makes `stream` wait for this operation: a stream wait for device
  // operations, a host wait for host ones.
  void wait_on(void* stream) const;

  // A Work that the caller ends with complete() or fail() (hooks, tests).
  static Work pending(std::string description, std::chrono::milliseconds default_timeout);
  static Work failed(const Error& e);
  void complete() const;
  void fail(const Error& e) const;

  const std::shared_ptr<Completion>& completion() const { return c_; }
  // Whether two handles share one operation.
  bool operator==(const Work& other) const { return c_ == other.c_; }

 private:
  std::shared_ptr<Completion> c_;
};

// Waits for every one of `works`, even after one has failed (those still
// running may be writing memory the caller is about to reuse), then throws
// the first failure, in order.
void wait_all(const std::vector<Work>& works);

}  // namespace collie
