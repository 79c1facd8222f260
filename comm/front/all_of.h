// comm/front/all_of.h: the completion of an operation the front runs as
// several (a pairwise all-to-all: a send and a receive per peer).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "collie/work.h"

namespace collie::front {

// The completion of an operation run as several (alltoall: a send and a
// receive per peer): ended when every part has, with the first part's
// error in issue order, prefixed with what the whole is. Waiting waits for
// each part (a host part's waiter may run it itself); a stream waits for
// every part.
class AllOf final : public Completion {
 public:
  static Work make(std::string what, std::vector<Work> parts, std::chrono::milliseconds timeout) {
    auto c = std::make_shared<AllOf>(std::move(what), std::move(parts), timeout);
    c->remaining_.store(c->parts_.size());
    if (c->parts_.empty()) c->finish(std::nullopt);
    std::weak_ptr<AllOf> weak = c;
    for (const Work& p : c->parts_)
      p.completion()->on_complete([weak] {
        if (auto self = weak.lock())
          if (self->remaining_.fetch_sub(1) == 1) self->end();
      });
    return Work(c);
  }
  AllOf(std::string what, std::vector<Work> parts, std::chrono::milliseconds timeout)
      : Completion(what, timeout), what_(std::move(what)), parts_(std::move(parts)) {}

  bool query() override {
    bool all = true;
    for (const Work& p : parts_) all = p.completion()->query() && all;
    if (all) end();
    return all;
  }
  bool wait_until(Clock::time_point deadline) override {
    for (const Work& p : parts_)
      if (!p.completion()->wait_until(deadline)) return false;
    end();
    return true;
  }
  bool wait_for(std::chrono::milliseconds timeout) override {
    return wait_until(Clock::now() + timeout);
  }
  void wait_on(void* stream) override {
    for (const Work& p : parts_) p.completion()->wait_on(stream);
  }
  void abort(const Error& e) override {
    for (const Work& p : parts_) p.completion()->abort(e);
    end();
  }

 private:
  void end() {
    for (const Work& p : parts_)
      if (auto e = p.error()) return finish(Error(e->code(), what_ + ": " + e->what()));
    finish(std::nullopt);
  }
  const std::string what_;
  const std::vector<Work> parts_;
  std::atomic<size_t> remaining_{0};
};

}  // namespace collie::front
