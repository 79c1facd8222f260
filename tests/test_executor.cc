// tests/test_executor.cc: the host executor that tcp (and later shm and mpi)
// run operations on, against a fake runner whose collectives wait on gates
// the test opens: issue order, continuations kept off the executor (the
// review's deadlock), shutdown, abort, and point-to-point batching, all
// deterministic and without sockets.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <ctime>
#include <future>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "comm/host_executor.h"

namespace collie {
namespace {

using namespace std::chrono_literals;

class GatedRunner final : public HostRunner {
 public:
  explicit GatedRunner(std::shared_ptr<FailureLatch> latch) : latch_(std::move(latch)) {}

  void run_collective(const Op& op, Deadline deadline) override {
    std::unique_lock lk(mu_);
    ran.push_back(op.desc.seq);
    if (++inside_ > 1) overlapped = true;  // another op is still in here
    struct Leave {
      int& n;
      ~Leave() { --n; }
    } leave{inside_};
    cv_.notify_all();
    cv_.wait_until(lk, deadline, [&] { return open_.count(op.desc.seq) || latch_->failed(); });
    if (latch_->failed()) throw *latch_->get();
    if (!open_.count(op.desc.seq))
      throw Error(ErrorCode::timeout, op.desc.describe() + " timed out in the fake runner");
  }

  void run_p2p(P2pBatch& batch, Deadline deadline) override {
    std::unique_lock lk(mu_);
    batch_sizes.push_back(batch.ops.size());
    in_p2p_ = true;
    cv_.notify_all();
    // Wait for the test to issue one more, then take it in.
    cv_.wait_until(lk, deadline, [&] { return late_issued_; });
    lk.unlock();
    while (batch.refill()) {
    }
    lk.lock();
    batch_sizes.push_back(batch.ops.size());
    for (size_t i = 0; i < batch.ops.size(); ++i) batch.finished(i);
  }

  void abort_peers(const Error&) noexcept override {
    std::lock_guard lk(mu_);
    aborted = true;
  }
  void close() noexcept override {
    std::lock_guard lk(mu_);
    closed = true;
  }
  void wake() noexcept override {
    std::lock_guard lk(mu_);
    ++woken;
    cv_.notify_all();
  }

  void open(uint32_t seq) {
    std::lock_guard lk(mu_);
    open_.insert(seq);
    cv_.notify_all();
  }
  void wait_started(size_t n) {
    std::unique_lock lk(mu_);
    cv_.wait_for(lk, 10s, [&] { return ran.size() >= n; });
  }
  void wait_in_p2p() {
    std::unique_lock lk(mu_);
    cv_.wait_for(lk, 10s, [&] { return in_p2p_; });
  }
  void late_issued() {
    std::lock_guard lk(mu_);
    late_issued_ = true;
    cv_.notify_all();
  }

  std::vector<uint32_t> ran;
  bool overlapped = false;  // an op entered while another was inside
  std::vector<size_t> batch_sizes;
  bool aborted = false, closed = false;
  int woken = 0;

 private:
  std::shared_ptr<FailureLatch> latch_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::set<uint32_t> open_;
  bool in_p2p_ = false, late_issued_ = false;
  int inside_ = 0;  // ops in run_collective now
};

struct Fixture {
  std::shared_ptr<FailureLatch> latch = std::make_shared<FailureLatch>();
  GatedRunner runner{latch};
  std::shared_ptr<HostExecutor> ex = HostExecutor::start(runner, latch, 0, 5s);
  ~Fixture() { ex->shutdown(); }

  Work collective(uint32_t seq) {
    Op op;
    op.desc = {OpKind::allreduce, DType::f32, ReduceOp::sum, seq, 0, 1};
    return ex->submit(op);
  }
  Work p2p(uint32_t seq, bool is_send) {
    Op op;
    op.desc = {OpKind::p2p, DType::f32, ReduceOp::sum, seq, 0, 1};
    op.peer = 1;
    op.is_send = is_send;
    return ex->submit(op);
  }
};

// An op's deadline comes from the kernel's tick clock: it must be on
// steady_clock's time line, `timeout` from now, to within a tick or two (a
// clock of another base would be off by seconds or days).
TEST(Executor, AnOpsDeadlineIsTheTimeoutFromNowOnSteadyClock) {
  timespec res{};
  ASSERT_EQ(clock_getres(CLOCK_MONOTONIC_COARSE, &res), 0);
  const auto tick = std::chrono::seconds(res.tv_sec) + std::chrono::nanoseconds(res.tv_nsec);
  for (auto timeout : {0ms, 7ms, 30000ms}) {
    for (int i = 0; i < 1000; ++i) {
      const auto before = std::chrono::steady_clock::now();
      const Deadline d = deadline_after(timeout);
      const auto after = std::chrono::steady_clock::now();
      ASSERT_GE(d, before + timeout - tick) << "timeout " << timeout.count() << " ms";
      ASSERT_LE(d, after + timeout + 2 * tick) << "timeout " << timeout.count() << " ms";
    }
  }
}

// Later ops opened first still wait for the first: the runner sees them
// one at a time (none enters while another is inside), in issue order. No
// sleep: an executor that let an op overtake or overlap would show it in
// the order or the overlap flag. (Not one thread: an op may run on the
// thread that submitted it, where nothing else is queued.)
TEST(Executor, OpsRunOneAtATimeInIssueOrder) {
  Fixture f;
  std::vector<Work> w;
  for (uint32_t k = 1; k <= 4; ++k) w.push_back(f.collective(k));
  for (uint32_t k = 4; k >= 2; --k) f.runner.open(k);  // later ones first: they still wait
  f.runner.wait_started(1);
  EXPECT_FALSE(w[1].done());
  f.runner.open(1);
  for (auto& x : w) x.wait(5s);
  EXPECT_EQ(f.runner.ran, (std::vector<uint32_t>{1, 2, 3, 4}));
  EXPECT_FALSE(f.runner.overlapped);
}

// Ops nobody waits for still run: the progress thread takes them whether a
// submit found it in its long sleep (nothing issued for a while) or polling
// (ops issued a moment ago), and whether the queue was idle or busy.
TEST(Executor, OpsNobodyWaitsForRunAfterIdleAndWhileBusy) {
  Fixture f;
  auto ends_on_its_own = [](const Work& w) {
    for (int i = 0; i < 2000 && !w.done(); ++i) std::this_thread::sleep_for(1ms);
    return w.done();
  };
  for (uint32_t k = 1; k <= 6; ++k) f.runner.open(k);
  Work first = f.collective(1);  // the progress thread has slept since its start
  EXPECT_TRUE(ends_on_its_own(first));
  std::this_thread::sleep_for(30ms);  // long enough for the long sleep again
  Work after_idle = f.collective(2);
  EXPECT_TRUE(ends_on_its_own(after_idle));
  std::vector<Work> burst;  // back to back: the thread polls
  for (uint32_t k = 3; k <= 6; ++k) burst.push_back(f.collective(k));
  for (auto& w : burst) EXPECT_TRUE(ends_on_its_own(w));
  EXPECT_EQ(f.runner.ran, (std::vector<uint32_t>{1, 2, 3, 4, 5, 6}));
}

// A continuation that blocks does not hold up the op behind it: it runs on
// the continuation thread, and the executor is free.
TEST(Executor, ABlockedContinuationDoesNotHoldUpLaterOps) {
  Fixture f;
  Work a = f.collective(1);  // cannot end before its gate opens
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::thread::id cont_thread;
  Work chained = a.then([&, released](const Work&) {
    cont_thread = std::this_thread::get_id();
    released.wait_for(10s);  // bounded: a regression fails instead of hanging
  });
  Work b = f.collective(2);
  f.runner.open(1);
  f.runner.open(2);
  b.wait(5s);
  EXPECT_FALSE(chained.done());
  release.set_value();
  chained.wait(5s);
  EXPECT_NE(cont_thread, std::this_thread::get_id());
}

// The review's reproducer, one level down: a continuation that issues an
// op on the same executor and waits for it.
TEST(Executor, AContinuationThatWaitsForAnotherOpFinishes) {
  Fixture f;
  Work a = f.collective(1);
  Work chained = a.then([&](const Work&) { f.collective(2).wait(5s); });
  f.runner.open(2);
  f.runner.open(1);
  chained.wait(5s);
  EXPECT_EQ(f.runner.ran, (std::vector<uint32_t>{1, 2}));
}

// A continuation that destroys its own communicator drops, with it, the
// last references to the continuation thread it runs on: the thread's loop
// must not go on in freed memory (the queue and mutex it looks at next;
// under ASan the old code was a heap-use-after-free here, and in a Python
// rank, where the garbage collector may close a communicator on any
// thread, a rare SIGABRT). The running thread keeps it until its loop ends.
TEST(Executor, AContinuationThatDropsTheLastReferenceToItsThread) {
  std::atomic<bool> freed{false};
  std::promise<void> gone;
  auto holder = std::make_shared<std::shared_ptr<ContinuationThread>>(
      std::shared_ptr<ContinuationThread>(new ContinuationThread, [&](ContinuationThread* c) {
        delete c;
        freed = true;
        gone.set_value();
      }));
  std::promise<bool> freed_in_continuation;
  ContinuationThread& thread = **holder;
  thread.post({[holder, &freed, &freed_in_continuation] {
    (*holder)->stop();  // on its own thread: detaches
    holder->reset();    // the last reference but the running thread's
    freed_in_continuation.set_value(freed.load());
  }});
  holder.reset();
  auto in_continuation = freed_in_continuation.get_future();
  ASSERT_EQ(in_continuation.wait_for(10s), std::future_status::ready);
  EXPECT_FALSE(in_continuation.get()) << "freed while its loop still ran";
  // Freed once its loop has ended (bounded: a leak fails, not hangs).
  EXPECT_EQ(gone.get_future().wait_for(10s), std::future_status::ready);
}

TEST(Executor, ShutdownFailsQueuedOpsAndLaterSubmitsAtOnce) {
  Fixture f;
  Work a = f.collective(1), b = f.collective(2);
  f.runner.wait_started(1);
  std::thread closer([&] { f.ex->shutdown(); });
  // Until shutdown has begun, seen through the executor itself: a submit
  // then fails at once. (The ones before it queue, and never run either.)
  bool begun = false;
  const auto until = std::chrono::steady_clock::now() + 10s;
  for (uint32_t k = 100; !begun && std::chrono::steady_clock::now() < until; ++k) {
    Work probe = f.collective(k);
    begun = probe.done();
    if (begun)
      EXPECT_NE(std::string(probe.error()->what()).find("destroyed"), std::string::npos);
    else
      std::this_thread::yield();
  }
  EXPECT_TRUE(begun) << "shutdown never began";
  f.runner.open(1);  // shutdown waits for the running op to end
  closer.join();
  a.wait(5s);
  ASSERT_TRUE(b.error());
  EXPECT_EQ(b.error()->code(), ErrorCode::unavailable);
  EXPECT_NE(std::string(b.error()->what()).find("never ran"), std::string::npos);
  Work c = f.collective(3);
  ASSERT_TRUE(c.done());
  EXPECT_NE(std::string(c.error()->what()).find("destroyed"), std::string::npos);
  EXPECT_TRUE(f.runner.closed);
  EXPECT_EQ(f.runner.ran, std::vector<uint32_t>{1});
}

TEST(Executor, AbortStopsTheRunningOpAndFailsTheRestWithItsCause) {
  Fixture f;
  Work a = f.collective(1), b = f.collective(2);
  f.runner.wait_started(1);
  Error stop(ErrorCode::aborted, "stopped by the test");
  f.latch->set(stop);
  f.ex->abort(stop);
  ASSERT_THROW(a.wait(5s), Error);
  EXPECT_EQ(a.error()->code(), ErrorCode::aborted);
  ASSERT_THROW(b.wait(5s), Error);
  EXPECT_NE(std::string(b.error()->what()).find("failed earlier: stopped by the test"),
            std::string::npos);
  EXPECT_GE(f.runner.woken, 1);
  EXPECT_TRUE(f.runner.aborted);
}

TEST(Executor, AbortWhileIdleTellsThePeersAtOnce) {
  Fixture f;
  Error stop(ErrorCode::aborted, "stopped while idle");
  f.latch->set(stop);
  f.ex->abort(stop);
  EXPECT_TRUE(f.runner.aborted);
}

// Sends and receives issued back to back run as one batch; one issued while
// the batch runs wakes it and joins it; each completes.
TEST(Executor, PointToPointOpsBatchAndTakeInLateOnes) {
  Fixture f;
  Work gate = f.collective(1);  // holds the executor while the p2p ops queue up
  f.runner.wait_started(1);
  Work s = f.p2p(1, true), r = f.p2p(1, false);
  f.runner.open(1);
  f.runner.wait_in_p2p();
  Work late = f.p2p(2, true);
  f.runner.late_issued();
  s.wait(5s);
  r.wait(5s);
  late.wait(5s);
  gate.wait(5s);
  EXPECT_EQ(f.runner.batch_sizes, (std::vector<size_t>{2, 3}));
  EXPECT_GE(f.runner.woken, 1);
}

}  // namespace
}  // namespace collie
