// tests/test_fake_backend.cc: the front, the reducer, the hooks and the C
// ABI over the `fake` backend (comm/fake/): every rank a thread of this
// process, connected through a memory store, each checking its own results
// against a serial float64 reference. Milliseconds a case, without
// collie-run; the multi-process suites keep what only real processes show
// (sockets, shared memory, signals, launchers).
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <latch>
#include <string>
#include <thread>
#include <vector>

#include "base/config.h"
#include "collie/collie.h"
#include "collie/comm.h"
#include "collie/store.h"
#include "fake_world.h"
#include "hooks/comm_hook.h"
#include "mp_common.h"
#include "reducer/reducer.h"
#include "tiny_mlp.h"

namespace collie {
namespace {

using std::chrono::milliseconds;
using testing::combine;
using testing::exact_value;
using testing::get;
using testing::put;

const std::vector<size_t> kCounts = {0, 1, 7, 97, 4099};
constexpr DType kDTypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32};
constexpr ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::min, ReduceOp::max,
                             ReduceOp::prod};

TEST(FakeBackend, IsNeverAutosChoiceAndSaysSoByName) {
  auto ended = run_world(2, [](Communicator& c) -> std::string {
    return c.backend() == "fake" ? "" : "backend is " + c.backend();
  });
  expect_all_ok(ended, "named");
  // A world of one asked for nothing in particular does not get it.
  Options o;
  o.rank = 0;
  o.world_size = 1;
  EXPECT_NE(connect(o)->backend(), "fake");
}

TEST(FakeBackend, AllreduceEveryDtypeOpAndCountMatchesTheSerialSum) {
  for (int n : {1, 2, 3, 5}) {
    auto ended = run_world(n, [n](Communicator& c) {
      std::string bad;
      uint64_t salt = 0;
      for (DType t : kDTypes)
        for (ReduceOp op : kOps)
          for (size_t count : kCounts) {
            if (op == ReduceOp::avg && t == DType::i32) continue;
            ++salt;
            std::vector<double> mem(count + 1);
            void* p = mem.data();
            for (size_t i = 0; i < count; ++i) put(t, p, i, exact_value(op, c.rank(), i, salt));
            TensorView v{p, t, count, Device::cpu()};
            c.allreduce(v, op, blocking);
            for (size_t i = 0; i < count; ++i) {
              double want = exact_value(op, 0, i, salt);
              for (int q = 1; q < n; ++q) want = combine(op, want, exact_value(op, q, i, salt));
              if (op == ReduceOp::avg) want = testing::rounded(t, want / n);
              if (get(t, p, i) != want) {
                bad += std::string(to_string(t)) + " " + std::string(to_string(op)) + " x" +
                       std::to_string(count) + " element " + std::to_string(i) + "; ";
                break;
              }
            }
          }
      return bad;
    });
    expect_all_ok(ended, std::to_string(n) + " ranks");
  }
}

TEST(FakeBackend, BroadcastAllgatherReduceScatterAlltoallAndP2p) {
  for (int n : {2, 4}) {
    auto ended = run_world(n, [n](Communicator& c) {
      std::string bad;
      const int r = c.rank();
      const size_t k = 5;
      // broadcast from the last rank
      std::vector<float> b(k, static_cast<float>(r));
      c.broadcast(view_of(b.data(), k), n - 1, blocking);
      for (float x : b)
        if (x != n - 1) bad += "broadcast; ";
      // allgather: block q holds q's values
      std::vector<int32_t> mine(k), all(k * n);
      for (size_t i = 0; i < k; ++i) mine[i] = static_cast<int32_t>(100 * r + i);
      c.allgather(view_of(mine.data(), k), view_of(all.data(), all.size()), blocking);
      for (int q = 0; q < n; ++q)
        for (size_t i = 0; i < k; ++i)
          if (all[q * k + i] != static_cast<int32_t>(100 * q + i)) bad += "allgather; ";
      // reduce_scatter of sum: block r of the sum over ranks
      std::vector<double> in(k * n), out(k);
      for (size_t i = 0; i < in.size(); ++i) in[i] = r + 0.5 * static_cast<double>(i);
      c.reduce_scatter(view_of(in.data(), in.size()), view_of(out.data(), k), ReduceOp::sum,
                       blocking);
      for (size_t i = 0; i < k; ++i) {
        double want = 0;
        for (int q = 0; q < n; ++q) want += q + 0.5 * static_cast<double>(r * k + i);
        if (out[i] != want) bad += "reduce_scatter; ";
      }
      // alltoall: rank r sends 1000 r + j to rank j
      std::vector<int64_t> send(k * n), recv(k * n);
      for (int j = 0; j < n; ++j)
        for (size_t i = 0; i < k; ++i) send[j * k + i] = 1000 * r + 10 * j + i;
      c.alltoall(view_of(send.data(), send.size()), view_of(recv.data(), recv.size()), blocking);
      for (int q = 0; q < n; ++q)
        for (size_t i = 0; i < k; ++i)
          if (recv[q * k + i] != static_cast<int64_t>(1000 * q + 10 * r + i)) bad += "alltoall; ";
      // a ring of sends and receives, both in flight at once
      std::vector<float> to(k, static_cast<float>(r)), from(k, -1);
      Work s = c.send(view_of(to.data(), k), (r + 1) % n, 7);
      Work v = c.recv(view_of(from.data(), k), (r + n - 1) % n, 7);
      s.wait();
      v.wait();
      for (float x : from)
        if (x != (r + n - 1) % n) bad += "p2p; ";
      c.barrier(blocking);
      return bad;
    });
    expect_all_ok(ended, std::to_string(n) + " ranks");
  }
}

TEST(FakeBackend, AsyncWorkKeepsIssueOrderAndSplitMakesIndependentWorlds) {
  auto ended = run_world(4, [](Communicator& c) {
    std::string bad;
    const int r = c.rank();
    // Eight all-reduces in flight, waited for in reverse.
    std::vector<std::vector<float>> bufs(8, std::vector<float>(33));
    std::vector<Work> works;
    for (size_t j = 0; j < bufs.size(); ++j) {
      for (auto& x : bufs[j]) x = static_cast<float>(r + j);
      works.push_back(c.allreduce(view_of(bufs[j].data(), 33), ReduceOp::sum));
    }
    for (size_t j = works.size(); j-- > 0;) works[j].wait();
    for (size_t j = 0; j < bufs.size(); ++j)
      if (bufs[j][32] != static_cast<float>(6 + 4 * j)) bad += "async " + std::to_string(j) + "; ";
    // Even and odd ranks: two communicators of two, numbered by key.
    auto half = c.split(r % 2, -r);
    if (!half || half->size() != 2 || half->rank() != (r < 2 ? 1 : 0)) return bad + "split shape";
    float x = static_cast<float>(r);
    half->allreduce(view_of(&x, 1), ReduceOp::max, blocking);
    if (x != (r % 2 == 0 ? 2.f : 3.f)) bad += "split allreduce; ";
    // The parent still works after its child.
    float y = 1;
    c.allreduce(view_of(&y, 1), ReduceOp::sum, blocking);
    if (y != 4) bad += "parent after split; ";
    return bad;
  });
  expect_all_ok(ended, "async and split");
}

TEST(FakeBackend, RanksThatCallDifferentCollectivesAreToldWhoDisagrees) {
  auto ended = run_world(3, [](Communicator& c) -> std::string {
    std::vector<float> v(16, 1.f);
    if (c.rank() == 1)
      c.broadcast(view_of(v.data(), v.size()), 0, blocking);
    else
      c.allreduce(view_of(v.data(), v.size()), ReduceOp::sum, blocking);
    return "returned";
  });
  int named = 0;
  for (size_t r = 0; r < ended.size(); ++r) {
    EXPECT_EQ(ended[r].failures, "") << "rank " << r << " finished a mismatched collective";
    EXPECT_NE(ended[r].error, "") << "rank " << r;
    if (ended[r].error.rfind("mismatch: ", 0) == 0 &&
        ended[r].error.find("rank ") != std::string::npos)
      ++named;
  }
  // The ranks that meet the odd one out say mismatch; the rest may learn
  // only that a peer aborted. Nobody hangs, nobody returns.
  EXPECT_GE(named, 1);
}

TEST(FakeBackend, ARankThatSkipsACollectiveIsNamedAtTheDeadline) {
  // Rank 2 stays (its communicator open) until the others have given up:
  // a rank that closed would be named as lost, not as late.
  std::latch others_done(2);
  auto ended = run_world(
      3,
      [&](Communicator& c) -> std::string {
        float x = 1;
        if (c.rank() == 2) {
          others_done.wait();
          return "";
        }
        struct Done {
          std::latch& l;
          ~Done() { l.count_down(); }
        } done{others_done};
        c.allreduce(view_of(&x, 1), ReduceOp::sum, blocking);
        return "";
      },
      milliseconds(300));
  EXPECT_EQ(ended[2].error, "");
  for (int r : {0, 1}) {
    EXPECT_EQ(ended[r].error.rfind("timeout: ", 0), 0u) << ended[r].error;
    EXPECT_NE(ended[r].error.find("rank 2"), std::string::npos) << ended[r].error;
  }
}

TEST(FakeBackend, AVanishedRankIsNamedAndTheSurvivorsShrinkAndGoOn) {
  // Rank 2 vanishes at its 3rd posted message: in the second all-reduce.
  ScopedEnv vanish("COLLIE_FAKE_VANISH", "2:3");
  auto ended = run_world(4, [](Communicator& c) -> std::string {
    const int r = c.rank();
    std::vector<float> v(64, 1.f);
    try {
      for (int i = 0; i < 4; ++i) c.allreduce(view_of(v.data(), v.size()), ReduceOp::sum, blocking);
      return "rank " + std::to_string(r) + " finished although rank 2 vanished";
    } catch (const Error& e) {
      if (r == 2) {
        if (std::string(e.what()).find("vanished") == std::string::npos)
          return std::string("rank 2's own error: ") + e.what();
        return "";
      }
      if (e.code() != ErrorCode::peer_lost && e.code() != ErrorCode::aborted)
        return std::string("survivor's error: ") + e.what();
    }
    // The survivors: a communicator of three, and an all-reduce on it.
    auto rest = c.shrink({2});
    if (!rest || rest->size() != 3) return "shrink";
    float x = static_cast<float>(r);
    rest->allreduce(view_of(&x, 1), ReduceOp::sum, blocking);
    return x == 0 + 1 + 3 ? "" : "sum over survivors is " + std::to_string(x);
  });
  expect_all_ok(ended, "vanish and shrink");
}

// A process that joins the running job (collie::join) as `rank` of
// `world` by its launch variables, where `where` says (the store, or its
// address and secret): its allreduce of its new rank over the grown
// communicator, or its error.
std::string join_and_sum(const std::function<void(Options&)>& where, int rank, int world,
                         milliseconds timeout, float want) {
  try {
    Options o;
    o.rank = rank;
    o.world_size = world;
    o.backend = "fake";
    o.timeout = timeout;
    where(o);
    auto c = join(o);
    float x = static_cast<float>(c->rank());
    c->allreduce(view_of(&x, 1), ReduceOp::sum, blocking);
    return x == want
               ? "joined as rank " + std::to_string(c->rank()) + " of " + std::to_string(c->size())
               : "sum " + std::to_string(x);
  } catch (const Error& e) {
    return std::string(to_string(e.code())) + ": " + e.what();
  }
}

std::string join_and_sum(std::shared_ptr<Store> store, int rank, int world, milliseconds timeout,
                         float want) {
  return join_and_sum([&](Options& o) { o.store = store; }, rank, world, timeout, want);
}

// grow(): three ranks take the joiner that queues in the store; the grown
// communicator numbers it after its own and sums over all four. Then the
// four, the joiner among them, grow by two more, numbered in the order
// they came.
TEST(FakeBackend, GrowTakesTheJoinersInTheOrderTheyCame) {
  std::shared_ptr<Store> store = make_memory_store(milliseconds(20000));
  std::string first, second, third;
  std::vector<std::thread> later;  // the second grow's joiners
  // The first joiner, once in, is a member like the others: it takes part
  // in the second grow too.
  std::thread j1([&] {
    try {
      Options o;
      o.rank = 1;
      o.world_size = 3;
      o.backend = "fake";
      o.store = store;
      o.timeout = milliseconds(20000);
      auto g = join(o);
      float x = static_cast<float>(g->rank());
      g->allreduce(view_of(&x, 1), ReduceOp::sum, blocking);
      first = "joined as rank " + std::to_string(g->rank()) + " of " + std::to_string(g->size()) +
              ", sum " + std::to_string(static_cast<int>(x));
      auto g2 = g->grow(2);
      float y = static_cast<float>(g2->rank());
      g2->allreduce(view_of(&y, 1), ReduceOp::sum, blocking);
      first += "; rank " + std::to_string(g2->rank()) + " of " + std::to_string(g2->size()) +
               ", sum " + std::to_string(static_cast<int>(y));
    } catch (const Error& e) {
      first = std::string(to_string(e.code())) + ": " + e.what();
    }
  });
  auto ended = run_world(
      3,
      [&](Communicator& c) -> std::string {
        auto g = c.grow(1);
        if (g->size() != 4 || g->rank() != c.rank()) return "grown: rank of size wrong";
        float x = static_cast<float>(g->rank());
        g->allreduce(view_of(&x, 1), ReduceOp::sum, blocking);
        if (x != 0 + 1 + 2 + 3) return "sum over 4 is " + std::to_string(x);
        // Two more join; the 4 ranks take both.
        if (c.rank() == 0) {  // only rank 0 touches `later`
          later.emplace_back([&] {
            second = join_and_sum(store, 1, 3, milliseconds(20000), 0 + 1 + 2 + 3 + 4 + 5);
          });
          later.emplace_back([&] {
            third = join_and_sum(store, 2, 3, milliseconds(20000), 0 + 1 + 2 + 3 + 4 + 5);
          });
        }
        auto g2 = g->grow(2);
        float y = static_cast<float>(g2->rank());
        g2->allreduce(view_of(&y, 1), ReduceOp::sum, blocking);
        return y == 0 + 1 + 2 + 3 + 4 + 5 ? "" : "sum over 6 is " + std::to_string(y);
      },
      milliseconds(20000), [&](Options& o) { o.store = store; });
  j1.join();
  for (auto& t : later) t.join();
  expect_all_ok(ended, "grow");
  EXPECT_EQ(first, "joined as rank 3 of 4, sum 6; rank 3 of 6, sum 15");
  EXPECT_TRUE((second == "joined as rank 4 of 6" && third == "joined as rank 5 of 6") ||
              (second == "joined as rank 5 of 6" && third == "joined as rank 4 of 6"))
      << second << " / " << third;
}

// A ticket its launcher withdrew (a spare that queued, then ended before
// any grow took it: collie-run claims it first, config::join_claim_key) is
// passed over: the grow takes the next joiner in the queue. And a ticket a
// grow claimed can no longer be withdrawn (the launcher sees it taken).
TEST(FakeBackend, GrowPassesOverATicketItsLauncherWithdrew) {
  std::shared_ptr<Store> store = make_memory_store(milliseconds(20000));
  // Ticket 1: queued, its host written, then withdrawn, as collie-run does
  // for a spare that died waiting.
  ASSERT_EQ(store->add(config::kJoinQueued, 1), 1);
  store->set(config::join_ticket_key(1, "host"), to_bytes(std::string("a-dead-spare")));
  const Bytes withdrawn = to_bytes(std::string("withdrawn: spare 0.0 ended"));
  ASSERT_EQ(store->compare_set(config::join_claim_key(1), {}, withdrawn), withdrawn);
  std::string joiner;
  std::thread j([&] { joiner = join_and_sum(store, 1, 2, milliseconds(20000), 0 + 1 + 2); });
  auto ended = run_world(
      2,
      [&](Communicator& c) -> std::string {
        auto g = c.grow(1);
        float x = static_cast<float>(g->rank());
        g->allreduce(view_of(&x, 1), ReduceOp::sum, blocking);
        return x == 0 + 1 + 2 ? "" : "sum " + std::to_string(x);
      },
      milliseconds(20000), [&](Options& o) { o.store = store; });
  j.join();
  expect_all_ok(ended, "grow past a withdrawn ticket");
  EXPECT_EQ(joiner, "joined as rank 2 of 3");
  // Ticket 2 was the grow's: a launcher's withdrawal now finds it taken.
  const std::string now = to_string(store->compare_set(config::join_claim_key(2), {}, withdrawn));
  EXPECT_EQ(now.rfind("grow ", 0), 0u) << now;
}

// Bad grows: no joiner comes (every rank's timeout says how many came, and
// a joiner that comes later is refused by name); joiners < 1; two joiners
// for one place (the second is not taken, and says so at its deadline).
TEST(FakeBackend, AGrowWithoutItsJoinersFailsByName) {
  std::shared_ptr<Store> store = make_memory_store(milliseconds(20000));
  auto ended = run_world(
      2,
      [&](Communicator& c) -> std::string {
        try {
          c.grow(0);
          return "grow(0) went on";
        } catch (const Error& e) {
          if (e.code() != ErrorCode::invalid_argument ||
              std::string(e.what()).find("joiners is 0, not 1 or more") == std::string::npos)
            return std::string("grow(0): ") + e.what();
        }
        try {
          c.grow(1, milliseconds(300));
          return "grew without a joiner";
        } catch (const Error& e) {
          if (e.code() != ErrorCode::timeout ||
              std::string(e.what()).find("0 of the 1 joining processes came within 0.3 s") ==
                  std::string::npos)
            return std::string("grow(1): ") + e.what();
        }
        // Two for one place: the first is taken, the other is not.
        return "";
      },
      milliseconds(20000), [&](Options& o) { o.store = store; });
  expect_all_ok(ended, "bad grows");
  // The place the failed grow took is refused to whoever comes for it.
  EXPECT_NE(join_and_sum(store, 1, 2, milliseconds(2000), 0)
                .find("join: refused by the ranks' grow: grow on rank 0: 0 of the 1"),
            std::string::npos);

  std::string a, b;
  std::thread ja([&] { a = join_and_sum(store, 0, 2, milliseconds(1500), 0 + 1 + 2); });
  std::thread jb([&] { b = join_and_sum(store, 1, 2, milliseconds(1500), 0 + 1 + 2); });
  auto grown = run_world(
      2,
      [&](Communicator& c) -> std::string {
        auto g = c.grow(1);
        float x = static_cast<float>(g->rank());
        g->allreduce(view_of(&x, 1), ReduceOp::sum, blocking);
        return x == 0 + 1 + 2 ? "" : "sum " + std::to_string(x);
      },
      milliseconds(20000), [&](Options& o) { o.store = store; });
  ja.join();
  jb.join();
  expect_all_ok(grown, "one of two joiners");
  const std::string taken = "joined as rank 2 of 3",
                    left = "timeout: join: no communicator of the job grew by this process within";
  EXPECT_TRUE((a == taken && b.rfind(left, 0) == 0) || (b == taken && a.rfind(left, 0) == 0))
      << a << " / " << b;
}

// A replacement that comes with another job's secret (a process of
// another job, or one started with a stale secret) is refused by the job's
// store by name, and so never takes a place: the grow that is waiting
// takes the next joiner, which has the job's own secret.
TEST(FakeBackend, AReplacementWithAnotherJobsSecretIsRefusedByName) {
  const std::string secret = "this-jobs-secret";
  const std::string job = config::job_identity(config::process_env(), 2);
  auto server = TcpStoreServer::start(0, {secret, job});
  const int port = server->port();
  // One client per rank, as processes have (a client serves one request
  // at a time).
  auto own_store = [&](Options& o) {
    o.store = TcpStore::connect("127.0.0.1", port, {secret, job}, milliseconds(5000),
                                "rank " + std::to_string(o.rank));
  };
  // As collie-run tells its ranks: its store outlives them, so a
  // replacement may join through it.
  ScopedEnv launcher_store("COLLIE_LAUNCHER_STORE", "1");
  auto joiner = [&](const std::string& its_secret) {
    return join_and_sum(
        [&](Options& o) {
          o.master_addr = "127.0.0.1";
          o.master_port = port;
          o.secret = its_secret;
        },
        1, 2, milliseconds(20000), 0 + 1 + 2);
  };
  std::string stranger, own;
  std::thread js([&] { stranger = joiner("another-jobs-secret"); });
  std::thread jo([&] {
    js.join();  // the stranger has been answered before the job's own comes
    own = joiner(secret);
  });
  auto grown = run_world(
      2,
      [&](Communicator& c) -> std::string {
        auto g = c.grow(1);
        float x = static_cast<float>(g->rank());
        g->allreduce(view_of(&x, 1), ReduceOp::sum, blocking);
        return x == 0 + 1 + 2 ? "" : "sum " + std::to_string(x);
      },
      milliseconds(20000), own_store);
  jo.join();
  expect_all_ok(grown, "grow past a stranger");
  EXPECT_NE(stranger.find("could not prove that it knows this job's secret"), std::string::npos)
      << stranger;
  EXPECT_EQ(own, "joined as rank 2 of 3");
}

TEST(FakeBackend, AbortFromAnotherThreadEndsABlockedWaitOnEveryRank) {
  // Ranks 0 and 1 wait in an all-reduce that rank 2 never joins (it stays
  // until they are done); a thread of rank 0 aborts, and both waits end
  // with its reason, well before the 20 s deadline.
  std::latch others_done(2);
  auto ended = run_world(3, [&](Communicator& c) -> std::string {
    float x = 1;
    if (c.rank() == 2) {
      others_done.wait();
      return "";
    }
    std::thread aborter;
    if (c.rank() == 0) aborter = std::thread([&c] { c.abort("the program gave up"); });
    std::string got;
    try {
      c.allreduce(view_of(&x, 1), ReduceOp::sum, blocking);
    } catch (const Error& e) {
      got = e.what();
    }
    if (aborter.joinable()) aborter.join();
    others_done.count_down();
    if (got.find("the program gave up") == std::string::npos) return "error: '" + got + "'";
    // Every later call fails at once with the first failure.
    try {
      c.barrier(blocking);
      return "barrier after abort returned";
    } catch (const Error& e) {
      return std::string(e.what()).find("gave up") == std::string::npos ? e.what() : "";
    }
  });
  expect_all_ok(ended, "abort");
}

TEST(FakeBackend, CompletionsOutOfOrderStillGiveExactResults) {
  ScopedEnv shuffle("COLLIE_FAKE_SHUFFLE", "12345");
  auto ended = run_world(5, [](Communicator& c) {
    std::string bad;
    for (size_t count : {size_t(1), size_t(1000), size_t(100003)}) {
      std::vector<int32_t> v(count);
      for (size_t i = 0; i < count; ++i) v[i] = static_cast<int32_t>(c.rank() * 7 + i % 11);
      c.allreduce(view_of(v.data(), count), ReduceOp::sum, blocking);
      for (size_t i = 0; i < count; ++i)
        if (v[i] != static_cast<int32_t>(70 + 5 * (i % 11))) {
          bad += "x" + std::to_string(count) + "; ";
          break;
        }
    }
    return bad;
  });
  expect_all_ok(ended, "shuffled");
}

TEST(FakeBackend, ARankInAnotherProcessIsToldItCannotJoin) {
  // A store shared with a child process: the child, rank 1, finds rank 0's
  // network named by another process.
  const std::string path = ::testing::TempDir() + "fake_join_" + std::to_string(::getpid());
  std::filesystem::remove(path);
  std::shared_ptr<Store> store = make_file_store(path, milliseconds(20000));
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(pipe_fds[0]);
    std::string msg = "joined";
    try {
      Options o;
      o.rank = 1;
      o.world_size = 2;
      o.backend = "fake";
      o.store = make_file_store(path, milliseconds(20000));
      connect(o);
    } catch (const Error& e) {
      msg = e.what();
    }
    (void)!::write(pipe_fds[1], msg.data(), msg.size());
    ::_exit(0);
  }
  ::close(pipe_fds[1]);
  std::thread rank0([&] {
    try {
      Options o;
      o.rank = 0;
      o.world_size = 2;
      o.backend = "fake";
      o.store = store;
      o.timeout = milliseconds(500);
      connect(o)->barrier(blocking);
    } catch (const Error&) {
    }
  });
  std::string msg;
  char buf[512];
  for (ssize_t got; (got = ::read(pipe_fds[0], buf, sizeof buf)) > 0;) msg.append(buf, got);
  ::close(pipe_fds[0]);
  rank0.join();
  int status = 0;
  ::waitpid(child, &status, 0);
  std::filesystem::remove(path);
  EXPECT_NE(msg.find("every rank of a fake communicator must be a thread of one process"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;
}

TEST(FakeBackend, BadFailureInjectionIsRefusedByName) {
  ScopedEnv vanish("COLLIE_FAKE_VANISH", "2");
  auto ended = run_world(1, [](Communicator&) -> std::string { return "connected"; });
  EXPECT_NE(ended[0].error.find("COLLIE_FAKE_VANISH='2' is not RANK:POSTS"), std::string::npos)
      << ended[0].error;
}

// The reducer: data-parallel training of tests/tiny_mlp.h equals serial
// float64 training on the whole batch, for every option combination.
constexpr int kPerRank = 8, kSteps = 4;
constexpr double kLr = 0.05;

// kSteps steps on the first `total` samples for each total in turn (a
// world that grows trains on more samples a step).
std::vector<std::vector<double>> serial_reference(std::initializer_list<int> totals) {
  auto p = testing::init_params<double>(7);
  for (int total : totals) {
    auto data = testing::make_dataset(total, 11);
    for (int step = 0; step < kSteps; ++step) {
      std::vector<std::vector<double>> g;
      for (auto& v : p) g.emplace_back(v.size(), 0.0);
      std::vector<const double*> pp;
      std::vector<double*> gp;
      for (size_t i = 0; i < p.size(); ++i) {
        pp.push_back(p[i].data());
        gp.push_back(g[i].data());
      }
      testing::backward<double>(pp, gp, data, 0, total, total, true, [](size_t) {});
      for (size_t i = 0; i < p.size(); ++i)
        for (size_t k = 0; k < p[i].size(); ++k) p[i][k] -= kLr * g[i][k];
    }
  }
  return p;
}

// The largest distance of `params` from `ref`, relative where |ref| > 1.
double worst_distance(const std::vector<std::vector<float>>& params,
                      const std::vector<std::vector<double>>& ref) {
  double worst = 0;
  for (size_t i = 0; i < params.size(); ++i)
    for (size_t k = 0; k < params[i].size(); ++k)
      worst =
          std::max(worst, std::abs(params[i][k] - ref[i][k]) / std::max(1.0, std::abs(ref[i][k])));
  return worst;
}

// Trains on this rank's shard; returns the largest relative distance from
// the reference.
double train(Communicator& c, const ReducerOptions& opt_in, bool no_sync) {
  const int r = c.rank(), total = kPerRank * c.size();
  auto params = testing::init_params<float>(r == 0 ? 7 : 1000 + r);  // rank 0's win
  auto data = testing::make_dataset(total, 11);
  std::vector<std::vector<float>> grads;
  for (auto& v : params) grads.emplace_back(v.size(), 0.0f);
  std::vector<Parameter> ps;
  for (size_t i = 0; i < params.size(); ++i)
    ps.push_back(
        {view_of(params[i].data(), params[i].size()), view_of(grads[i].data(), grads[i].size())});
  ReducerOptions opt = opt_in;
  opt.first_bucket_bytes = 16;
  opt.bucket_bytes = 32;
  Reducer red(c, ps, opt);
  const int micro = no_sync ? 4 : 1;
  for (int step = 0; step < kSteps; ++step) {
    std::vector<float*> g;
    for (size_t i = 0; i < params.size(); ++i) {
      TensorView v = red.grad_view(i);
      std::memset(v.data, 0, v.nbytes());
      g.push_back(static_cast<float*>(v.data));
    }
    std::vector<const float*> pp;
    for (auto& v : params) pp.push_back(v.data());
    for (int m = 0; m < micro; ++m) {
      red.set_no_sync(m + 1 < micro);
      red.prepare_for_backward(std::vector<bool>(params.size(), true));
      const int count = kPerRank / micro;
      testing::backward<float>(pp, g, data, r * kPerRank + m * count, count, kPerRank, true,
                               [&](size_t i) { red.mark_grad_ready(i); });
      red.finalize_backward();
    }
    for (size_t i = 0; i < params.size(); ++i) {
      const float* gv = static_cast<const float*>(red.grad_view(i).data);
      for (size_t k = 0; k < params[i].size(); ++k) params[i][k] -= static_cast<float>(kLr) * gv[k];
    }
  }
  return worst_distance(params, serial_reference({total}));
}

TEST(FakeBackend, ReducerTrainsAsSerialFloat64DoesInEveryMode) {
  for (int mode = 0; mode < 8; ++mode) {
    ReducerOptions opt;
    opt.gradient_as_bucket_view = mode & 1;
    opt.static_graph = mode & 2;
    const bool no_sync = mode & 4;
    auto ended = run_world(3, [&](Communicator& c) {
      const double worst = train(c, opt, no_sync);
      return worst <= 1e-5 ? "" : "off the reference by " + std::to_string(worst);
    });
    expect_all_ok(ended, "mode " + std::to_string(mode));
  }
}

// A rank replaced in memory: 3 ranks train kSteps steps with the reducer,
// grow by a joiner, hand it their reducer's state (Reducer::handoff_state)
// and rank 0's parameters (the new reducer's construction), and train
// kSteps more as 4. The result equals serial float64 training on the 3
// ranks' samples, then on the 4 ranks' samples.
TEST(FakeBackend, TheReducerReformsInMemoryAfterAGrow) {
  auto steps = [](Reducer& red, std::vector<std::vector<float>>& params, int r, int n) {
    const int total = kPerRank * n;
    auto data = testing::make_dataset(total, 11);
    for (int step = 0; step < kSteps; ++step) {
      std::vector<float*> g;
      for (size_t i = 0; i < params.size(); ++i) {
        TensorView v = red.grad_view(i);
        std::memset(v.data, 0, v.nbytes());
        g.push_back(static_cast<float*>(v.data));
      }
      std::vector<const float*> pp;
      for (auto& v : params) pp.push_back(v.data());
      red.prepare_for_backward(std::vector<bool>(params.size(), true));
      testing::backward<float>(pp, g, data, r * kPerRank, kPerRank, kPerRank, true,
                               [&](size_t i) { red.mark_grad_ready(i); });
      red.finalize_backward();
      for (size_t i = 0; i < params.size(); ++i) {
        const float* gv = static_cast<const float*>(red.grad_view(i).data);
        for (size_t k = 0; k < params[i].size(); ++k)
          params[i][k] -= static_cast<float>(kLr) * gv[k];
      }
    }
  };
  auto parameters = [](std::vector<std::vector<float>>& params) {
    std::vector<Parameter> ps;
    for (auto& v : params) ps.push_back({view_of(v.data(), v.size()), {}});
    return ps;
  };
  ReducerOptions opt;
  opt.gradient_as_bucket_view = true;
  opt.first_bucket_bytes = 16;
  opt.bucket_bytes = 32;
  // Serial float64: kSteps on 3 ranks' samples, then kSteps on 4 ranks'.
  const auto ref = serial_reference({kPerRank * 3, kPerRank * 4});
  auto off = [&](const std::vector<std::vector<float>>& params) {
    const double worst = worst_distance(params, ref);
    return worst <= 1e-5 ? std::string() : "off the reference by " + std::to_string(worst);
  };

  std::shared_ptr<Store> store = make_memory_store(milliseconds(20000));
  std::string joined;
  std::thread joiner([&] {
    try {
      Options o;
      o.rank = 1;
      o.world_size = 3;
      o.backend = "fake";
      o.store = store;
      o.timeout = milliseconds(20000);
      auto g = join(o);
      auto params = testing::init_params<float>(999);  // not the model: rank 0's comes
      Bytes st = Reducer::handoff_state(*g, nullptr);
      Reducer red(*g, parameters(params), opt);
      red.load_state(st);
      if (red.iterations() != kSteps) {
        joined = "iterations " + std::to_string(red.iterations());
        return;
      }
      steps(red, params, g->rank(), g->size());
      joined = off(params);
    } catch (const Error& e) {
      joined = std::string(to_string(e.code())) + ": " + e.what();
    }
  });
  auto ended = run_world(
      3,
      [&](Communicator& c) -> std::string {
        auto params = testing::init_params<float>(c.rank() == 0 ? 7 : 1000 + c.rank());
        auto red = std::make_unique<Reducer>(c, parameters(params), opt);
        steps(*red, params, c.rank(), c.size());
        auto g = c.grow(1);
        Bytes st = Reducer::handoff_state(*g, red.get());
        red = std::make_unique<Reducer>(*g, parameters(params), opt);
        red->load_state(st);
        steps(*red, params, g->rank(), g->size());
        return off(params);
      },
      milliseconds(20000), [&](Options& o) { o.store = store; });
  joiner.join();
  expect_all_ok(ended, "survivors");
  EXPECT_EQ(joined, "");
}

// Survivors whose reducers finished different iterations (they failed in
// different collectives) all go on from rank 0's state: here rank 2's
// reducer, on a communicator of its own, did one iteration where the
// others' did kSteps; after the handoff every new reducer is at kSteps.
TEST(FakeBackend, SurvivorsThatFinishedDifferentStepsGoOnFromRankZeros) {
  auto ended = run_world(3, [](Communicator& c) -> std::string {
    auto params = testing::init_params<float>(7);
    std::vector<Parameter> ps;
    for (auto& v : params) ps.push_back({view_of(v.data(), v.size()), {}});
    ReducerOptions opt;
    opt.gradient_as_bucket_view = true;
    auto solo = c.split(c.rank(), 0);  // each rank alone
    auto iterate = [&](Reducer& red, int times) {
      for (int k = 0; k < times; ++k) {
        red.prepare_for_backward(std::vector<bool>(ps.size(), true));
        for (size_t i = 0; i < ps.size(); ++i) red.mark_grad_ready(i);
        red.finalize_backward();
      }
    };
    Reducer red(*solo, ps, opt);
    iterate(red, c.rank() == 2 ? 1 : kSteps);
    Bytes st = Reducer::handoff_state(c, &red);
    Reducer next(c, ps, opt);
    next.load_state(st);
    return next.iterations() == kSteps
               ? ""
               : "iterations after the handoff: " + std::to_string(next.iterations());
  });
  expect_all_ok(ended, "different steps");
}

// A grow while an op of the old communicator is in flight neither waits
// for it nor disturbs it: rank 0 starts an all-reduce before the grow, the
// others after it; it completes with the right sum, and the grown
// communicator works beside it.
TEST(FakeBackend, AGrowLeavesTheOpsInFlightAlone) {
  std::shared_ptr<Store> store = make_memory_store(milliseconds(20000));
  std::string joiner;
  std::thread j([&] { joiner = join_and_sum(store, 0, 2, milliseconds(20000), 0 + 1 + 2); });
  auto ended = run_world(
      2,
      [&](Communicator& c) -> std::string {
        float x = 1, y = 0;
        Work w;
        if (c.rank() == 0) w = c.allreduce(view_of(&x, 1), ReduceOp::sum);
        auto g = c.grow(1);
        if (c.rank() != 0) w = c.allreduce(view_of(&x, 1), ReduceOp::sum);
        y = static_cast<float>(g->rank());
        g->allreduce(view_of(&y, 1), ReduceOp::sum, blocking);
        w.wait();
        if (x != 2) return "the old communicator's sum is " + std::to_string(x);
        return y == 0 + 1 + 2 ? "" : "the grown communicator's sum is " + std::to_string(y);
      },
      milliseconds(20000), [&](Options& o) { o.store = store; });
  j.join();
  expect_all_ok(ended, "in flight");
  EXPECT_EQ(joiner, "joined as rank 2 of 3");
}

// A joiner with another model is refused by name where the reducer is
// built on the grown communicator, on every rank.
TEST(FakeBackend, AJoinerWithAnotherModelIsRefusedByName) {
  std::shared_ptr<Store> store = make_memory_store(milliseconds(20000));
  auto build = [](Communicator& g, size_t extra) {
    std::vector<std::vector<float>> params{std::vector<float>(8 + extra), std::vector<float>(3)};
    std::vector<Parameter> ps;
    for (auto& v : params) ps.push_back({view_of(v.data(), v.size()), {}});
    try {
      Reducer red(g, ps, ReducerOptions{});
      return std::string("built");
    } catch (const Error& e) {
      return std::string(to_string(e.code())) + ": " + e.what();
    }
  };
  std::string joiner;
  std::thread j([&] {
    Options o;
    o.rank = 0;
    o.world_size = 2;
    o.backend = "fake";
    o.store = store;
    o.timeout = milliseconds(20000);
    auto g = join(o);
    joiner = build(*g, 1);  // 9 floats where the others have 8
  });
  auto ended = run_world(
      2,
      [&](Communicator& c) -> std::string {
        auto g = c.grow(1);
        const std::string got = build(*g, 0);
        return got.rfind("mismatch: ", 0) == 0 && got.find("rank 2") != std::string::npos ? ""
                                                                                          : got;
      },
      milliseconds(20000), [&](Options& o) { o.store = store; });
  j.join();
  expect_all_ok(ended, "another model");
  EXPECT_EQ(joiner.rfind("mismatch: ", 0), 0u) << joiner;
}

TEST(FakeBackend, CompressionHooksStayWithinTheirPrecision) {
  // fp16 and bf16 halve the bytes; the result stays within the narrow
  // type's rounding of the reference (11 and 8 significant bits).
  for (auto [spec, tol] :
       {std::pair<const char*, double>{"allreduce", 1e-5}, {"fp16", 3e-3}, {"bf16", 2e-2}}) {
    auto ended = run_world(3, [&](Communicator& c) {
      ReducerOptions opt;
      opt.hook = make_comm_hook(spec);
      const double worst = train(c, opt, false);
      return worst <= tol ? "" : std::string(spec) + " off by " + std::to_string(worst);
    });
    expect_all_ok(ended, spec);
  }
}

TEST(FakeBackend, TheCAbiConnectsAndReducesOverIt) {
  const auto bad = run_c_world(3, "fake_c_abi", [](collie_comm* comm, int r) -> std::string {
    const char* name = nullptr;
    collie_comm_backend(comm, &name);
    double v[3] = {1.0 * r, 2.0 * r, 3.0 * r};
    collie_tensor t{};
    t.data = v;
    t.numel = 3;
    t.dtype = COLLIE_F64;
    if (collie_comm_allreduce(comm, t, t, COLLIE_SUM, nullptr) != COLLIE_OK)
      return std::string("allreduce: ") + collie_last_error();
    if (v[0] != 3 || v[1] != 6 || v[2] != 9 || std::string(name) != "fake")
      return "wrong sum or backend";
    return "";
  });
  for (size_t r = 0; r < bad.size(); ++r) EXPECT_EQ(bad[r], "") << "rank " << r;
}

// A joiner through the C ABI, on a thread of its own: joins the fake world
// of 2 (collie_comm_join), writes `then`'s account of the grown
// communicator (or the join's error) to `out`, and destroys it.
std::thread c_join_then(std::string& out, std::function<std::string(collie_comm*)> then) {
  return std::thread([&out, then = std::move(then)] {
    collie_comm_options o;
    collie_comm_options_init(&o);
    o.rank = 1;
    o.world_size = 2;
    o.backend = "fake";
    o.timeout_seconds = 20;
    collie_comm* g = nullptr;
    if (collie_comm_join(&o, &g) != COLLIE_OK) {
      out = std::string("join: ") + collie_last_error();
      return;
    }
    out = then(g);
    collie_comm_destroy(g);
  });
}

// collie_comm_grow and collie_comm_join: two ranks grow by a joiner and
// sum their new ranks over the three; only the joiner's communicator says
// it joined (collie_comm_joined: what makes collie.torch take a hand-over).
TEST(FakeBackend, TheCAbiGrowsByAJoiner) {
  auto sum_ranks = [](collie_comm* comm) -> std::string {
    int r = -1, n = 0, joined = -1;
    collie_comm_rank(comm, &r);
    collie_comm_size(comm, &n);
    if (collie_comm_joined(comm, &joined) != COLLIE_OK) return "joined: failed";
    double v = r;
    collie_tensor t{};
    t.data = &v;
    t.numel = 1;
    t.dtype = COLLIE_F64;
    if (collie_comm_allreduce(comm, t, t, COLLIE_SUM, nullptr) != COLLIE_OK)
      return std::string("allreduce: ") + collie_last_error();
    return "rank " + std::to_string(r) + " of " + std::to_string(n) + ", sum " +
           std::to_string(static_cast<int>(v)) + (joined ? ", joined" : "");
  };
  std::string joiner;
  const auto bad = run_c_world(2, "fake_c_grow", [&](collie_comm* comm, int r) -> std::string {
    int was_joined = -1;
    collie_comm_joined(comm, &was_joined);
    if (was_joined != 0) return "a launched rank's communicator says it joined";
    std::thread j;
    if (r == 0) j = c_join_then(joiner, sum_ranks);
    collie_comm* g = nullptr;
    std::string got = collie_comm_grow(comm, 1, 0, &g) == COLLIE_OK
                          ? sum_ranks(g)
                          : std::string("grow: ") + collie_last_error();
    if (g) collie_comm_destroy(g);
    if (j.joinable()) j.join();
    const std::string want = "rank " + std::to_string(r) + " of 3, sum 3";
    return got == want ? "" : got;
  });
  for (size_t r = 0; r < bad.size(); ++r) EXPECT_EQ(bad[r], "") << "rank " << r;
  EXPECT_EQ(joiner, "rank 2 of 3, sum 3, joined");
}

// collie_reducer_handoff_state: two ranks train two steps with reducers,
// grow by a joiner and hand the reducer's state over; every rank's new
// reducer loads it (two iterations done, on the joiner too) and the third
// step averages over the three.
TEST(FakeBackend, TheCAbiHandsTheReducersStateToAJoiner) {
  // One step of a reducer over a parameter of 4 doubles whose gradient is
  // (rank + 1) everywhere: the average over n ranks is (n + 1) / 2.
  struct Model {
    double w[4] = {0, 0, 0, 0}, g[4] = {0, 0, 0, 0};
    collie_reducer* red = nullptr;
    std::string make(collie_comm* comm) {
      collie_tensor p{}, gr{};
      p.data = w;
      gr.data = g;
      p.numel = gr.numel = 4;
      p.dtype = gr.dtype = COLLIE_F64;
      collie_reducer_options o;
      collie_reducer_options_init(&o);
      return collie_reducer_create(comm, &p, &gr, 1, &o, &red) == COLLIE_OK
                 ? ""
                 : std::string("create: ") + collie_last_error();
    }
    std::string step(int rank, double want) {
      for (double& x : g) x = rank + 1;
      if (collie_reducer_prepare(red, nullptr, 0) != COLLIE_OK ||
          collie_reducer_mark_ready(red, 0) != COLLIE_OK ||
          collie_reducer_finalize(red) != COLLIE_OK)
        return std::string("step: ") + collie_last_error();
      return g[0] == want ? ""
                          : "average " + std::to_string(g[0]) + ", want " + std::to_string(want);
    }
  };
  // The grown communicator's half, for every rank: the hand-over, a new
  // reducer loading it, and a step over the three.
  auto go_on = [](collie_comm* g, Model& m, collie_reducer* mine) -> std::string {
    void* state = nullptr;
    size_t bytes = 0;
    if (collie_reducer_handoff_state(g, mine, 0, &state, &bytes) != COLLIE_OK)
      return std::string("handoff: ") + collie_last_error();
    if (mine) collie_reducer_destroy(mine);
    m.red = nullptr;
    std::string bad = m.make(g);
    if (bad.empty() && collie_reducer_load_state(m.red, state, bytes) != COLLIE_OK)
      bad = std::string("load: ") + collie_last_error();
    collie_free(state);
    uint64_t done = 0;
    if (bad.empty()) collie_reducer_iterations(m.red, &done);
    if (bad.empty() && done != 2) bad = "iterations after the hand-over: " + std::to_string(done);
    int r = -1;
    collie_comm_rank(g, &r);
    if (bad.empty()) bad = m.step(r, (1.0 + 2.0 + 3.0) / 3);
    collie_reducer_destroy(m.red);
    return bad;
  };
  std::string joiner = "never ran";
  const auto bad = run_c_world(2, "fake_c_handoff", [&](collie_comm* comm, int r) -> std::string {
    Model m;
    std::string got = m.make(comm);
    for (int i = 0; i < 2 && got.empty(); ++i) got = m.step(r, (1.0 + 2.0) / 2);
    if (!got.empty()) return got;
    std::thread j;
    if (r == 0)
      j = c_join_then(joiner, [&](collie_comm* g) {
        Model mine;
        return go_on(g, mine, nullptr);
      });
    collie_comm* g = nullptr;
    got = collie_comm_grow(comm, 1, 0, &g) == COLLIE_OK
              ? go_on(g, m, m.red)
              : std::string("grow: ") + collie_last_error();
    if (g) collie_comm_destroy(g);
    if (j.joinable()) j.join();
    return got;
  });
  for (size_t r = 0; r < bad.size(); ++r) EXPECT_EQ(bad[r], "") << "rank " << r;
  EXPECT_EQ(joiner, "");
}

}  // namespace
}  // namespace collie
