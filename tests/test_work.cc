// tests/test_work.cc: collie/work.h, Work's completion: errors, timeouts,
// a waiter woken by a finish that races its sleep, callbacks that run
// exactly once, a device completion polled, and then()'s chaining.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "collie/work.h"
#include "comm/front/front.h"

namespace collie {
namespace {

using namespace std::chrono_literals;

TEST(WorkHandle, CompletionErrorAndTimeout) {
  Work w = Work::pending("op #1", 5s);
  EXPECT_FALSE(w.done());
  std::thread t([w] {
    std::this_thread::sleep_for(20ms);
    w.complete();
  });
  w.wait();
  t.join();
  EXPECT_TRUE(w.done());
  EXPECT_FALSE(w.error());

  Work f = Work::pending("op #2", 5s);
  f.fail(Error(ErrorCode::peer_lost, "rank 3 lost"));
  EXPECT_TRUE(f.done());
  EXPECT_EQ(f.error()->code(), ErrorCode::peer_lost);
  EXPECT_THROW(f.wait(), Error);

  Work slow = Work::pending("op #3", 5s);
  try {
    slow.wait(30ms);
    ADD_FAILURE() << "wait returned";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::timeout);
    EXPECT_NE(std::string(e.what()).find("op #3"), std::string::npos);
  }
  slow.complete();
}

// Waiters sleep on a futex word (Completion::block_until), which a finish
// wakes only when it sees a waiter counted: a waiter that counted itself
// after the finish's look, and then slept, would sleep to its deadline
// (an end seen late is still an end, so only the time shows it). Many
// rounds of two waiters racing one finish; a lost wake-up is a wait of
// seconds, against microseconds.
TEST(WorkHandle, AWaiterIsWokenByAFinishThatRacesItsSleep) {
  constexpr int kRounds = 3000;
  std::vector<Work> works;
  for (int i = 0; i < kRounds; ++i) works.push_back(Work::pending("op #" + std::to_string(i), 60s));
  std::atomic<int> next{0};  // the round the finisher is at
  std::atomic<int> lost{0};
  auto waiter = [&] {
    for (int i = 0; i < kRounds; ++i) {
      while (next.load() < i) {
      }
      auto t0 = std::chrono::steady_clock::now();
      works[static_cast<size_t>(i)].wait(30s);
      if (std::chrono::steady_clock::now() - t0 > 5s) ++lost;
    }
  };
  std::thread a(waiter), b(waiter);
  for (int i = 0; i < kRounds; ++i) {
    next.store(i);
    for (int k = 0; k < (i % 7) * 50; ++k) std::atomic_signal_fence(std::memory_order_seq_cst);
    works[static_cast<size_t>(i)].complete();
  }
  a.join();
  b.join();
  EXPECT_EQ(lost.load(), 0) << "waits woken only by their deadline";
  for (auto& w : works) EXPECT_TRUE(w.done());
}

// finish() claims the end without a lock: a callback registered while
// finish() runs on another thread must run once, neither lost nor twice,
// and of two finish() calls the first wins, with both returning only once
// the end is visible.
TEST(WorkHandle, ACallbackRegisteredWhileTheEndRacesRunsExactlyOnce) {
  constexpr int kRounds = 20000;
  int lost = 0, twice = 0, early = 0, mixed = 0;
  for (int i = 0; i < kRounds; ++i) {
    Work w = Work::pending("op #" + std::to_string(i), 60s);
    std::atomic<int> runs{0};
    std::atomic<bool> go{false};
    std::atomic<int> seen_ended{0};
    auto finisher = [&](std::optional<Error> e) {
      while (!go.load()) {
      }
      w.completion()->finish(std::move(e));
      if (w.done()) ++seen_ended;
    };
    std::thread a(finisher, std::nullopt);
    std::thread b(finisher, Error(ErrorCode::aborted, "the second finish"));
    go.store(true);
    for (int k = 0; k < i % 13; ++k) std::atomic_signal_fence(std::memory_order_seq_cst);
    w.completion()->on_complete([&] { ++runs; });
    a.join();
    b.join();
    if (runs.load() == 0) ++lost;
    if (runs.load() > 1) ++twice;
    if (seen_ended.load() != 2) ++early;
    // The error is the winner's, whole: none, or the second finish's.
    auto e = w.error();
    if (e && std::string(e->what()).find("the second finish") == std::string::npos) ++mixed;
  }
  EXPECT_EQ(lost, 0) << "callbacks never run";
  EXPECT_EQ(twice, 0) << "callbacks run twice";
  EXPECT_EQ(early, 0) << "finish() returned before the end was visible";
  EXPECT_EQ(mixed, 0);
}

// What the NCCL backend will return: a completion that is ended when its
// CUDA event fires (query polls it), makes a stream wait without blocking
// the host, and aborts its communicator when told to. A fake event stands in
// for CUDA here; Work drives it through the Completion interface alone.
class FakeEventCompletion final : public Completion {
 public:
  using Completion::Completion;
  std::atomic<bool> fired{false};
  std::atomic<int> polls{0};
  std::vector<void*> streams;
  bool aborted = false;

  bool query() override {
    ++polls;
    if (fired) finish(std::nullopt);
    return ended();
  }
  bool wait_until(Clock::time_point deadline) override {
    while (!query()) {
      if (Clock::now() >= deadline) return false;
      std::this_thread::sleep_for(1ms);
    }
    return true;
  }
  void wait_on(void* stream) override { streams.push_back(stream); }
  void abort(const Error& e) override {
    aborted = true;
    finish(e);
  }
};

TEST(WorkHandle, ADeviceCompletionIsPolledAndAStreamWaitsWithoutTheHost) {
  auto ev = std::make_shared<FakeEventCompletion>("allreduce #1 on cuda:0", 5s);
  Work w(ev);
  EXPECT_FALSE(w.done());
  EXPECT_GT(ev->polls.load(), 0);
  int stream = 0;
  w.wait_on(&stream);  // enqueued on the stream: returns before the event fires
  ASSERT_EQ(ev->streams.size(), 1u);
  EXPECT_EQ(ev->streams[0], &stream);
  EXPECT_FALSE(ev->ended());
  std::thread fire([ev] {
    std::this_thread::sleep_for(20ms);
    ev->fired = true;
  });
  w.wait();  // polls until the event fires
  fire.join();
  EXPECT_TRUE(w.done());

  auto stuck = std::make_shared<FakeEventCompletion>("allreduce #2 on cuda:0", 5s);
  Work s(stuck);
  Work after = s.then([](const Work& w) {
    if (auto e = w.error()) throw *e;
  });
  EXPECT_THROW(s.wait(30ms), Error);  // the event never fires: a timeout naming it
  stuck->abort(Error(ErrorCode::timeout, "allreduce #2 on cuda:0 timed out"));
  EXPECT_TRUE(stuck->aborted);
  ASSERT_TRUE(after.error().has_value());  // continuations see the abort
  EXPECT_EQ(after.error()->code(), ErrorCode::timeout);
}

TEST(WorkHandle, ThenChainsAndPropagatesErrors) {
  Work a = Work::pending("a", 5s);
  int order = 0, ran_at = -1;
  Work b = a.then([&](const Work&) { ran_at = order++; });
  EXPECT_FALSE(b.done());
  a.complete();
  EXPECT_TRUE(b.done());
  EXPECT_EQ(ran_at, 0);

  Work inner = Work::pending("inner", 5s);
  Work c = Work().then_work([&](const Work&) { return inner; });
  EXPECT_FALSE(c.done());
  inner.fail(Error(ErrorCode::mismatch, "inner failed"));
  EXPECT_TRUE(c.done());
  EXPECT_EQ(c.error()->code(), ErrorCode::mismatch);

  Work d =
      Work().then([](const Work&) { throw Error(ErrorCode::invalid_argument, "hook said no"); });
  EXPECT_EQ(d.error()->code(), ErrorCode::invalid_argument);
}

// What a continuation captures is released before its Work completes: the
// reducer's continuations hold bucket memory whose allocator may be the
// engine's (Python's), and a release that came after the waiter went on ran
// on collie's thread while Python was shutting down (a std::terminate).
TEST(WorkHandle, ThenReleasesWhatItCapturedBeforeTheWaiterGoesOn) {
  std::atomic<bool> released{false};
  struct SlowRelease {
    explicit SlowRelease(std::atomic<bool>* f) : flag(f) {}
    std::atomic<bool>* flag;
    ~SlowRelease() {
      std::this_thread::sleep_for(50ms);
      flag->store(true);
    }
  };
  for (bool chained_work : {false, true}) {
    released = false;
    Work a = Work::pending("a", 5s);
    auto keep = std::make_shared<SlowRelease>(&released);
    Work b = chained_work ? a.then_work([keep](const Work&) { return Work(); })
                          : a.then([keep](const Work&) {});
    keep.reset();
    std::thread completer([&] { a.complete(); });
    b.wait();
    EXPECT_TRUE(released.load()) << (chained_work ? "then_work" : "then");
    completer.join();
  }
}

}  // namespace
}  // namespace collie
