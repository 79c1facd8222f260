// collie/work.h: the handle of an operation in flight.
//
// Every communicator call returns a Work at once; the operation runs on the
// communicator's progress thread (or on the thread that waits for it, when
// nothing is ahead of it: that saves two thread wake-ups per small op).
// A Work is cheap to copy: copies share one state.
//
//   Work w = comm.allreduce(grad, ReduceOp::avg);
//   ... compute ...
//   w.wait();                      // throws collie::Error if the op failed
//
// then() chains: the function runs when this Work completes (on the thread
// that completed it) and the returned Work completes when the function
// returns, or, for a function that itself returns a Work, when that one does.
// Comm hooks are built this way.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "collie/error.h"

namespace collie {

class Work {
 public:
  struct State;

  // An empty handle: already complete, successfully.
  Work();

  bool done() const;
  // Waits until complete, at most `timeout` (by default a little over twice
  // the communicator's timeout, so that the op's own error comes first). Throws the operation's
  // error, or Error{timeout} naming the operation if it is not complete in time.
  void wait() const;
  void wait(std::chrono::milliseconds timeout) const;
  // The error the operation failed with; empty while running or on success.
  std::optional<Error> error() const;
  // What the operation is, for messages: "allreduce #12 (f32 x 1024, sum)".
  std::string description() const;

  Work then(std::function<void(const Work&)> fn) const;
  Work then_work(std::function<Work(const Work&)> fn) const;

  // Makes `stream` wait for this operation. CPU operations are complete when
  // wait() returns, so here it waits on the host; CUDA backends enqueue the
  // wait on the stream without a host sync.
  void wait_on(void* stream) const;

  // For backends: a Work that an executor completes.
  static Work pending(std::string description, std::chrono::milliseconds default_timeout);
  static Work failed(const Error& e);
  void complete() const;
  void fail(const Error& e) const;
  // Set by an executor: lets a waiter run the operation itself when nothing
  // is ahead of it. Returns true when it ran (and so completed) the op.
  void set_inline_runner(std::function<bool()> runner) const;
  // Whether two handles share one operation.
  bool operator==(const Work& other) const { return state_ == other.state_; }

 private:
  explicit Work(std::shared_ptr<State> s) : state_(std::move(s)) {}
  std::shared_ptr<State> state_;
};

// Waits for every one of `works`, even after one has failed (those still
// running may be writing memory the caller is about to reuse), then throws
// the first failure, in order.
void wait_all(const std::vector<Work>& works);

}  // namespace collie
