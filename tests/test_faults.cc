// tests/test_faults.cc: failure is an error, never a hang.
//
// Each test forks real rank processes (not threads) that rendezvous through a
// store whose listening socket the test process bound first, like
// collie-run does; one rank misbehaves (dies, stalls, never joins, calls a
// different collective, presents the wrong secret) and every other rank must
// come back with an error whose code and text name the problem and the rank.
// The harness kills any rank still running after a generous limit and
// reports it as hung, so a regression fails instead of blocking the suite.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/config.h"
#include "collie/comm.h"
#include "comm/net/socket.h"
#include "mp_test.h"
#include "reducer/reducer.h"
#include "tiny_mlp.h"

namespace collie {
namespace {

using namespace std::chrono_literals;

struct Outcome {
  bool exited = false;  // false: killed by a signal, or hung and killed
  bool hung = false;
  std::string report;  // "OK ...", or "ERR <code>|<message>"

  bool ok() const { return report.rfind("OK", 0) == 0; }
  std::string code() const {
    if (report.rfind("ERR ", 0) != 0) return "";
    return report.substr(4, report.find('|') - 4);
  }
  std::string message() const {
    auto bar = report.find('|');
    return bar == std::string::npos ? report : report.substr(bar + 1);
  }
};

using RankFn = std::function<std::string(int rank, Options opt)>;

// Each rank's end, as a signal the other ranks can wait for: rank r's
// process alone holds the write end of the pipe whose read end is
// g_exits[r], so reading that to its end returns once r has ended, however
// it ended. (Replaces sleeps that guessed how long a peer would take.)
std::vector<int> g_exits;

void wait_for_exit_of(int r) {
  char c;
  for (;;) {
    const ssize_t k = ::read(g_exits.at(r), &c, 1);
    if (k == 0 || (k < 0 && errno != EINTR)) return;
  }
}

// A rank that stalls on purpose (alive, calling nothing) until the harness
// kills it, which it does once every other rank has ended (`linger`).
[[noreturn]] void stall_until_killed() {
  for (;;) pause();
}

// Runs fn in `n` forked ranks. `skip` ranks are never started. A rank still
// running after `limit` is killed and called hung. `linger` ranks stall on
// purpose (stopped, or asleep past the others' deadline): once every other
// rank has ended they are killed (and called hung) at once, instead of
// after `limit` (a third of this suite's time went to that wait).
std::vector<Outcome> run_ranks(int n, RankFn fn, std::chrono::milliseconds timeout,
                               std::vector<int> skip = {}, std::chrono::seconds limit = 60s,
                               std::vector<int> linger = {}) {
  net::Fd listener = net::listen_tcp("127.0.0.1", 0, "test store");
  int port = net::local_port(listener.get());
  std::vector<pid_t> pids(n, -1);
  std::vector<int> pipes(n, -1);
  std::vector<int> exit_ends(n, -1);
  g_exits.assign(n, -1);
  for (int r = 0; r < n; ++r) {
    int e[2];
    if (pipe(e) != 0) throw std::runtime_error("pipe failed");
    g_exits[r] = e[0];
    exit_ends[r] = e[1];
  }
  for (int r = 0; r < n; ++r) {
    if (std::find(skip.begin(), skip.end(), r) != skip.end()) continue;
    int p[2];
    if (pipe(p) != 0) throw std::runtime_error("pipe failed");
    pid_t pid = fork();
    if (pid == 0) {
      ::close(p[0]);
      for (int q = 0; q < n; ++q)
        if (q != r) ::close(exit_ends[q]);  // only rank q's own end keeps q's pipe open
      if (r == 0) {
        net::set_cloexec(listener.get(), false);
        setenv("COLLIE_STORE_FD", std::to_string(listener.get()).c_str(), 1);
      } else {
        listener.reset();
      }
      Options opt;
      opt.rank = r;
      opt.world_size = n;
      opt.local_rank = r;
      opt.local_world_size = n;
      opt.master_addr = "127.0.0.1";
      opt.master_port = port;
      opt.secret = "test-secret";
      opt.timeout = timeout;
      std::string report;
      try {
        report = "OK " + fn(r, opt);
      } catch (const Error& e) {
        report = "ERR " + std::string(to_string(e.code())) + "|" + e.what();
      } catch (const std::exception& e) {
        report = std::string("ERR other|") + e.what();
      }
      [[maybe_unused]] ssize_t w = ::write(p[1], report.data(), report.size());
      ::close(p[1]);
      _exit(0);
    }
    ::close(p[1]);
    pids[r] = pid;
    pipes[r] = p[0];
  }
  for (int e : exit_ends) ::close(e);
  listener.reset();
  std::vector<Outcome> out(n);
  std::vector<int> status(n, 0);
  std::vector<bool> ended(n);
  for (int r = 0; r < n; ++r) ended[r] = pids[r] < 0;
  auto lingers = [&](int r) { return std::find(linger.begin(), linger.end(), r) != linger.end(); };
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (;;) {
    bool all = true, all_but_lingering = true;
    for (int r = 0; r < n; ++r) {
      if (ended[r]) continue;
      if (waitpid(pids[r], &status[r], WNOHANG) == pids[r]) {
        ended[r] = true;
        continue;
      }
      all = false;
      if (!lingers(r)) all_but_lingering = false;
    }
    if (all) break;
    if (all_but_lingering || std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < n; ++r) {
        if (ended[r]) continue;
        kill(pids[r], SIGKILL);
        waitpid(pids[r], &status[r], 0);
        out[r].hung = true;
        ended[r] = true;
      }
      break;
    }
    std::this_thread::sleep_for(5ms);
  }
  for (int r = 0; r < n; ++r) {
    if (pids[r] < 0) continue;
    out[r].exited = WIFEXITED(status[r]) && !out[r].hung;
    char buf[8192];
    ssize_t k;
    while ((k = ::read(pipes[r], buf, sizeof buf)) > 0) out[r].report.append(buf, k);
    ::close(pipes[r]);
  }
  for (int& e : g_exits) ::close(std::exchange(e, -1));
  return out;
}

std::string describe(const std::vector<Outcome>& v) {
  std::string s;
  for (size_t r = 0; r < v.size(); ++r)
    s += "\n  rank " + std::to_string(r) + (v[r].hung ? " HUNG" : "") + ": " + v[r].report;
  return s;
}

bool contains(const std::string& s, const std::string& needle) {
  return s.find(needle) != std::string::npos;
}

// A rank killed with SIGKILL in the middle of a stream of all-reduces: every
// survivor gets peer_lost naming that rank. Run at 3 and 4 ranks, with large
// (ring) and small (recursive doubling) messages.
// `setup` prepares each rank's launch (and environment) before it connects.
void kill_mid_allreduce(int n, size_t count, const std::function<void(int, Options&)>& setup = {}) {
  const int victim = 1;
  auto out = run_ranks(
      n,
      [&](int rank, Options opt) {
        if (setup) setup(rank, opt);
        auto c = connect(opt);
        std::vector<float> buf(count, 1.0f);
        if (rank == victim) {
          std::thread([] {
            std::this_thread::sleep_for(200ms);
            raise(SIGKILL);
          }).detach();
        }
        for (int it = 0; it < 1000000; ++it)
          c->allreduce(view_of(buf.data(), count), ReduceOp::sum).wait();
        return std::string("finished without noticing");
      },
      30s);
  EXPECT_FALSE(out[victim].exited) << describe(out);
  for (int r = 0; r < n; ++r) {
    if (r == victim) continue;
    EXPECT_FALSE(out[r].hung) << describe(out);
    EXPECT_EQ(out[r].code(), "peer_lost") << describe(out);
    EXPECT_TRUE(contains(out[r].message(), "rank " + std::to_string(victim))) << describe(out);
    EXPECT_TRUE(contains(out[r].message(), "allreduce")) << describe(out);
  }
}

TEST(Faults, RankKilledDuringLargeAllreduceIsReportedByEverySurvivor3) {
  kill_mid_allreduce(3, 1 << 20);
}
TEST(Faults, RankKilledDuringLargeAllreduceIsReportedByEverySurvivor4) {
  kill_mid_allreduce(4, 1 << 20);
}
TEST(Faults, RankKilledDuringSmallAllreduceIsReportedByEverySurvivor4) {
  kill_mid_allreduce(4, 3);
}

// Two hosts of two ranks (told apart by COLLIE_HOSTNAME) on hier, rank 1
// killed in the middle of pipelined all-reduces: its host's partner loses it
// in shared memory, its partner across hosts over TCP, and the fourth rank
// hears of it from them. Each survivor names rank 1 by its number in the
// communicator, not by its number inside a stage.
TEST(Faults, RankKilledDuringHierarchicalAllreduceIsNamedByEverySurvivor) {
  kill_mid_allreduce(4, 1 << 20, [](int rank, Options& opt) {
    setenv("COLLIE_HOSTNAME", rank < 2 ? "host-a" : "host-b", 1);
    setenv("COLLIE_HIER_PIECE", "65536", 1);
    opt.backend = "hier";
    opt.local_rank = rank % 2;
    opt.local_world_size = 2;
  });
}

TEST(Faults, RankThatNeverJoinsIsNamedInARendezvousTimeout) {
  auto out = run_ranks(4,
                       [](int, Options opt) {
                         connect(opt);
                         return std::string("joined");
                       },
                       2s, {2});
  // Rank 0 times out; a rank whose deadline falls a moment later may find the
  // store (which rank 0 serves) gone first: that is peer_lost, still naming
  // the rank that never came.
  EXPECT_EQ(out[0].code(), "timeout") << describe(out);
  for (int r : {0, 1, 3}) {
    EXPECT_FALSE(out[r].hung) << describe(out);
    EXPECT_TRUE(out[r].code() == "timeout" || out[r].code() == "peer_lost") << describe(out);
    EXPECT_TRUE(contains(out[r].message(), "rank 2")) << describe(out);
    EXPECT_TRUE(contains(out[r].message(), "never joined")) << describe(out);
  }
}

// Ranks that disagree about the call: an error on every rank, not a hang and
// not a silently wrong buffer.
void expect_mismatch_everywhere(int n, const std::function<void(Communicator&, int)>& call) {
  auto out = run_ranks(
      n,
      [&](int rank, Options opt) {
        auto c = connect(opt);
        call(*c, rank);
        return std::string("completed");
      },
      20s);
  for (int r = 0; r < n; ++r) {
    EXPECT_FALSE(out[r].hung) << describe(out);
    EXPECT_EQ(out[r].code(), "mismatch") << describe(out);
    EXPECT_TRUE(contains(out[r].message(), "rank 1")) << describe(out);
  }
}

TEST(Faults, DifferentCountsOnOneRankFailEveryRank) {
  for (size_t base : {size_t{5}, size_t{1} << 18})
    expect_mismatch_everywhere(4, [base](Communicator& c, int rank) {
      std::vector<float> buf(base + 1, 1.0f);
      c.allreduce(view_of(buf.data(), rank == 1 ? base + 1 : base), ReduceOp::sum).wait();
    });
}

TEST(Faults, DifferentDtypesFailEveryRank) {
  expect_mismatch_everywhere(3, [](Communicator& c, int rank) {
    std::vector<double> buf(1000, 1.0);
    TensorView v = rank == 1 ? TensorView{buf.data(), DType::i64, 1000, Device::cpu()}
                             : view_of(buf.data(), 1000);
    c.allreduce(v, ReduceOp::sum).wait();
  });
}

TEST(Faults, DifferentCollectivesFailEveryRank) {
  expect_mismatch_everywhere(3, [](Communicator& c, int rank) {
    std::vector<float> buf(64, 1.0f);
    if (rank == 1)
      c.broadcast(view_of(buf.data(), 64), 0).wait();
    else
      c.allreduce(view_of(buf.data(), 64), ReduceOp::sum).wait();
  });
}

// An all-to-all whose blocks on rank 1 are bigger than its peers expect:
// every rank's all-to-all fails with a mismatch naming rank 1, none hangs.
TEST(Faults, AnAlltoallWithDifferentCountsOnOneRankFailsEveryRank) {
  expect_mismatch_everywhere(3, [](Communicator& c, int rank) {
    const size_t block = rank == 1 ? 6 : 5;
    std::vector<float> in(3 * block, 1.0f), out(3 * block);
    c.alltoall(view_of(in.data(), in.size()), view_of(out.data(), out.size())).wait();
  });
}

// An all-to-all on one rank where its peers all-gather: a mismatch naming
// both calls on every rank. Where the backend runs the all-to-all as one
// collective (shm, mpi) its arrival says so at once.
TEST(Faults, AnAlltoallWhereThePeersAllgatherFailsEveryRankNamingIt) {
  auto out = run_ranks(
      3,
      [&](int rank, Options opt) {
        auto c = connect(opt);
        std::vector<float> in(6, 1.0f), out(18);
        if (rank == 1)
          c->alltoall(view_of(in.data(), 6), view_of(out.data(), 6)).wait();
        else
          c->allgather(view_of(in.data(), 6), view_of(out.data(), 18)).wait();
        return std::string("completed");
      },
      20s);
  for (int r = 0; r < 3; ++r) {
    EXPECT_FALSE(out[r].hung) << describe(out);
    EXPECT_EQ(out[r].code(), "mismatch") << describe(out);
    EXPECT_TRUE(contains(out[r].message(), "alltoall")) << describe(out);
    EXPECT_TRUE(contains(out[r].message(), "allgather")) << describe(out);
  }
}

TEST(Faults, StalledRankTimesOutItsPartnerNamingIt) {
  auto out = run_ranks(2,
                       [](int rank, Options opt) {
                         auto c = connect(opt);
                         float x = 1;
                         if (rank == 1) stall_until_killed();  // past the deadline
                         c->allreduce(view_of(&x, 1), ReduceOp::sum).wait();
                         return std::string("done");
                       },
                       3s, {}, 60s, {1});
  EXPECT_FALSE(out[0].hung) << describe(out);
  EXPECT_EQ(out[0].code(), "timeout") << describe(out);
  EXPECT_TRUE(contains(out[0].message(), "rank 1")) << describe(out);
  EXPECT_TRUE(contains(out[0].message(), "COLLIE_TIMEOUT")) << describe(out);
  EXPECT_TRUE(contains(out[0].message(),
                       "rank 1 last completed #0 and has not called #1 (its process is alive)"))
      << describe(out);
}

// The stall inspector: when a collective passes its deadline, every rank's
// error says where each rank is, asked through the store (the data
// connections may be what is stuck). Rank 2 is alive and busy elsewhere.
TEST(Faults, TheStallInspectorNamesWhoIsLateAndWhere) {
  auto out =
      run_ranks(4,
                [](int rank, Options opt) {
                  auto c = connect(opt);
                  std::vector<float> x(1000, 1.0f);
                  c->allreduce(view_of(x.data(), x.size()), ReduceOp::sum).wait();  // #1, everyone
                  if (rank == 2) stall_until_killed();  // alive, not calling #2
                  try {
                    c->allreduce(view_of(x.data(), x.size()), ReduceOp::avg).wait();
                  } catch (const Error&) {
                    // Rank 0 serves the store: a program that exits the moment it
                    // fails takes it from the ranks still asking (they then say the
                    // store could not be reached). It stays until they have ended.
                    if (rank == 0)
                      for (int q : {1, 3}) wait_for_exit_of(q);
                    throw;
                  }
                  return std::string("done");
                },
                2s, {}, 60s, {2});
  for (int r : {0, 1, 3}) {
    EXPECT_FALSE(out[r].hung) << describe(out);
    EXPECT_NE(out[r].code(), "") << describe(out);
    EXPECT_TRUE(contains(out[r].message(), "allreduce #2 (f32 x 1000, avg)")) << describe(out);
    EXPECT_TRUE(contains(out[r].message(), "ranks 0, 1, 3 wait in #2")) << describe(out);
    EXPECT_TRUE(contains(out[r].message(),
                         "rank 2 last completed #1 and has not called #2 (its process is alive)"))
        << describe(out);
  }
}

// A rank that cannot answer (stopped: its process exists but runs nothing)
// is named as such, not mistaken for a live one.
TEST(Faults, TheStallInspectorNamesARankThatDoesNotAnswer) {
  auto out = run_ranks(3,
                       [](int rank, Options opt) {
                         auto c = connect(opt);
                         float x = 1;
                         c->allreduce(view_of(&x, 1), ReduceOp::sum).wait();
                         if (rank == 2) raise(SIGSTOP);  // the harness kills it after the others
                         try {
                           c->allreduce(view_of(&x, 1), ReduceOp::sum).wait();
                         } catch (const Error&) {
                           if (rank == 0) wait_for_exit_of(1);  // it serves the store (above)
                           throw;
                         }
                         return std::string("done");
                       },
                       2s, {}, 12s, {2});
  for (int r : {0, 1}) {
    EXPECT_FALSE(out[r].hung) << describe(out);
    EXPECT_TRUE(contains(out[r].message(), "ranks 0, 1 wait in #2")) << describe(out);
    EXPECT_TRUE(contains(out[r].message(), "rank 2 did not answer within")) << describe(out);
  }
}

// Survivors that carry on: after a rank dies, the others shrink the
// communicator to themselves and go on. Rank 3 is killed; ranks 0..2 wait
// for it briefly, agree without it, and their all-reduce sums the three.
TEST(Faults, SurvivorsShrinkTheCommunicatorAndGoOn) {
  auto out = run_ranks(
      4,
      [](int rank, Options opt) {
        auto c = connect(opt);
        float x = 1;
        // Rank 3 dies once its first all-reduce is done, which may be
        // before a survivor's is: that survivor hears of it in its first
        // (tests/survivor_probe.cc says more), the others in their second.
        bool heard = false;
        try {
          c->allreduce(view_of(&x, 1), ReduceOp::sum).wait();
        } catch (const Error& e) {
          if (rank == 3 || e.code() != ErrorCode::peer_lost) throw;
          heard = true;
        }
        if (rank == 3) raise(SIGKILL);
        if (!heard) try {
            x = 1;
            c->allreduce(view_of(&x, 1), ReduceOp::sum).wait();
            return std::string("the all-reduce ended without rank 3");
          } catch (const Error& e) {
            if (e.code() != ErrorCode::peer_lost) throw;
          }
        auto s = c->shrink({}, 1500ms);  // finds by itself that rank 3 is gone
        std::vector<double> v{static_cast<double>(rank + 1), 0.5};
        s->allreduce(view_of(v.data(), v.size()), ReduceOp::sum).wait();
        // Shrinking a working communicator with an explicit exclusion:
        // ranks 0 and 1 go on without rank 2, which does not take part.
        std::unique_ptr<Communicator> t;
        if (rank < 2) t = s->shrink({2});
        std::string r = std::to_string(s->rank()) + "/" + std::to_string(s->size()) + " " +
                        std::to_string(static_cast<int>(v[0])) + " " + std::to_string(v[1]);
        if (t) r += " then " + std::to_string(t->rank()) + "/" + std::to_string(t->size());
        return r;
      },
      3s);
  EXPECT_TRUE(out[3].report.empty() || !out[3].ok()) << describe(out);
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(out[r].ok()) << describe(out);
    // New ranks in the old order; 1 + 2 + 3 and 3 x 0.5 exactly.
    EXPECT_TRUE(contains(out[r].report, std::to_string(r) + "/3 6 1.500000")) << describe(out);
  }
  EXPECT_TRUE(contains(out[0].report, "then 0/2")) << describe(out);
  EXPECT_TRUE(contains(out[1].report, "then 1/2")) << describe(out);
}

// The reducer on a shrunk communicator: 4 ranks train a small MLP, rank 3
// dies at step kDeath, the survivors shrink, build a new reducer and finish.
// Their parameters must equal, bit for bit, those of a 3-rank job (ranks
// 0..2's data) resumed from the 4-rank job's parameters at step kDeath: the
// same arithmetic in the same order.
namespace shrink_training {
constexpr int kSteps = 12, kDeath = 5, kBatch = 8;

const testing::Dataset& data() {
  static const testing::Dataset d = testing::make_dataset(4 * kSteps * kBatch, 7);
  return d;
}

using Params = std::vector<std::vector<float>>;

// Steps [from, to) on `comm`; rank r's data at step k depends on (k, r) only.
void train(Communicator& comm, Params& p, int from, int to, int die_at = -1) {
  Params g;
  for (auto& v : p) g.emplace_back(v.size(), 0.0f);
  std::vector<Parameter> params;
  for (size_t i = 0; i < p.size(); ++i)
    params.push_back({view_of(p[i].data(), p[i].size()), view_of(g[i].data(), g[i].size()), 0});
  Reducer red(comm, params);
  std::vector<const float*> pp;
  std::vector<float*> gp;
  for (size_t i = 0; i < p.size(); ++i) {
    pp.push_back(p[i].data());
    gp.push_back(g[i].data());
  }
  for (int k = from; k < to; ++k) {
    if (k == die_at) raise(SIGKILL);
    for (auto& v : g) std::fill(v.begin(), v.end(), 0.0f);
    red.prepare_for_backward();
    testing::backward<float>(pp, gp, data(), (k * 4 + comm.rank()) * kBatch, kBatch, kBatch, true,
                             [&](size_t i) { red.mark_grad_ready(i); });
    red.finalize_backward();
    for (size_t i = 0; i < p.size(); ++i)
      for (size_t j = 0; j < p[i].size(); ++j) p[i][j] -= 0.1f * g[i][j];
  }
}

std::string bytes_of(const Params& p) {
  std::string s;
  for (auto& v : p) s.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  return s;
}
std::string hex(const std::string& s) {
  static const char* h = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    out.push_back(h[c >> 4]);
    out.push_back(h[c & 15]);
  }
  return out;
}
}  // namespace shrink_training

TEST(Faults, SurvivorsRebuildTheReducerOnTheShrunkCommunicatorAndFinishExactly) {
  using namespace shrink_training;
  // The reference: 4 ranks to kDeath, then 3 ranks from those parameters.
  auto first = run_ranks(
      4,
      [](int, Options opt) {
        auto c = connect(opt);
        Params p = testing::init_params<float>(3);
        train(*c, p, 0, kDeath);
        return hex(bytes_of(p));
      },
      20s);
  for (auto& o : first) ASSERT_TRUE(o.ok()) << describe(first);
  const std::string at_death = first[0].report.substr(3);
  auto second = run_ranks(
      3,
      [&](int, Options opt) {
        auto c = connect(opt);
        Params p = testing::init_params<float>(3);
        size_t at = 0;
        for (auto& v : p)
          for (auto& x : v) {
            unsigned b[4];
            for (int i = 0; i < 4; ++i) std::sscanf(&at_death[2 * (at + i)], "%2x", &b[i]);
            unsigned char raw[4] = {
                static_cast<unsigned char>(b[0]), static_cast<unsigned char>(b[1]),
                static_cast<unsigned char>(b[2]), static_cast<unsigned char>(b[3])};
            std::memcpy(&x, raw, 4);
            at += 4;
          }
        train(*c, p, kDeath, kSteps);
        return hex(bytes_of(p));
      },
      20s);
  for (auto& o : second) ASSERT_TRUE(o.ok()) << describe(second);

  // The job that loses rank 3 at kDeath and carries on in the same processes.
  auto shrunk = run_ranks(
      4,
      [](int rank, Options opt) {
        auto c = connect(opt);
        Params p = testing::init_params<float>(3);
        try {
          train(*c, p, 0, kSteps, rank == 3 ? kDeath : -1);
          return std::string("finished without noticing rank 3's death");
        } catch (const Error&) {
          if (!c->error()) throw;  // not the communicator's failure
        }
        // Step kDeath failed before its update: the parameters are those of
        // step kDeath on every survivor. Go on from there without rank 3.
        auto s = c->shrink({3});
        train(*s, p, kDeath, kSteps);
        return hex(bytes_of(p));
      },
      20s);
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(shrunk[r].ok()) << describe(shrunk);
    EXPECT_EQ(shrunk[r].report, second[0].report) << "rank " << r;
  }
  EXPECT_NE(second[0].report, first[0].report);  // it trained on
}

// A rank's death fails the operations that need it, not one that no longer
// does: rank 2 dies while rank 0 waits for a message from rank 1, which
// comes. That receive completes; the next collective fails naming rank 2. (It used to fail the
// receive: the loop watches every peer's socket, and failed whatever op was running when one
// closed. In a collective the dead rank had finished, that failed the op on the survivors that saw
// the socket close and not on the others, so they disagreed on which step had completed:
// SurvivorsRebuildTheReducer... caught it, under load.)
TEST(Faults, ADeathFailsOnlyTheOpsThatNeedTheDeadRank) {
  auto out = run_ranks(
      3,
      [](int rank, Options opt) -> std::string {
        auto c = connect(opt);
        c->barrier().wait();
        if (rank == 2) raise(SIGKILL);
        float x = 0;
        std::string got;
        if (rank == 1) {
          wait_for_exit_of(2);  // rank 2 is gone
          x = 7;
          c->send(view_of(&x, 1), 0).wait();
          got = "sent";
        } else {
          c->recv(view_of(&x, 1), 1).wait();
          got = "got " + std::to_string(static_cast<int>(x));
        }
        try {
          c->allreduce(view_of(&x, 1), ReduceOp::sum).wait();
          return got + ", then the all-reduce ended without rank 2";
        } catch (const Error& e) {
          return got + ", then " + std::string(to_string(e.code())) + ": " + e.what();
        }
      },
      10s);
  EXPECT_TRUE(contains(out[0].report, "OK got 7, then peer_lost")) << describe(out);
  EXPECT_TRUE(contains(out[1].report, "OK sent, then peer_lost")) << describe(out);
  for (int r : {0, 1}) EXPECT_TRUE(contains(out[r].report, "rank 2")) << describe(out);
}

// A stopped rank's kernel still acknowledges what it is sent, and answers
// the probes into its closed window: the others must not say the network
// to it is down (that is said only of a peer that acknowledges nothing,
// resends included: tests/launch/link_faults.sh takes a link down). 16 Mi
// floats, so that the senders fill its window and probe.
TEST(Faults, AStoppedRankIsNotTakenForANetworkFault) {
  auto out = run_ranks(3,
                       [](int rank, Options opt) {
                         auto c = connect(opt);
                         std::vector<float> x(16 << 20, 1.0f);
                         c->allreduce(view_of(x.data(), 1), ReduceOp::sum).wait();
                         if (rank == 2) raise(SIGSTOP);  // the harness kills it after the others
                         c->allreduce(view_of(x.data(), x.size()), ReduceOp::sum).wait();
                         return std::string("done");
                       },
                       3s, {}, 12s, {2});
  for (int r : {0, 1}) {
    EXPECT_FALSE(out[r].hung) << describe(out);
    EXPECT_EQ(out[r].code(), "timeout") << describe(out);
    EXPECT_TRUE(contains(out[r].message(), "rank 2 did not answer within")) << describe(out);
    EXPECT_FALSE(contains(out[r].message(), "the network to")) << describe(out);
  }
}

// Destroying a communicator while rank 0, which serves the store, cannot be
// reached (stopped here; a link down in tests/launch/link_faults.sh): the
// stall inspector's goodbye to its watcher goes through the store, and used
// to wait the store's whole deadline (30 s here) before the destructor
// returned; it waits the inspection's budget at most now.
TEST(Faults, ACommunicatorIsDestroyedPromptlyWhenTheStoreIsOutOfReach) {
  auto out = run_ranks(2,
                       [](int rank, Options opt) {
                         auto c = connect(opt);
                         std::vector<int64_t> pids(2);
                         int64_t me = getpid();
                         c->allgather(view_of(&me, 1), view_of(pids.data(), 2)).wait();
                         if (rank == 0) raise(SIGSTOP);  // the harness kills it after rank 1
                         // Rank 0 stopped (state T in /proc/PID/stat) before the destructor runs.
                         for (int i = 0; i < 2000; ++i) {
                           std::ifstream stat("/proc/" + std::to_string(pids[0]) + "/stat");
                           std::string line;
                           std::getline(stat, line);
                           auto close = line.rfind(')');
                           if (close != std::string::npos && line.compare(close, 3, ") T") == 0)
                             break;
                           std::this_thread::sleep_for(5ms);
                         }
                         c.reset();
                         return std::string("destroyed");
                       },
                       30s, {}, 15s, {0});
  EXPECT_FALSE(out[1].hung) << describe(out);
  EXPECT_TRUE(out[1].ok()) << describe(out);
}

// A rank that finishes early (its communicator destroyed cleanly) while the
// others call one more all-reduce: they are told it left, not left waiting.
TEST(Faults, ARankThatLeavesEarlyIsNamedByTheOthers) {
  auto out = run_ranks(
      3,
      [](int rank, Options opt) {
        auto c = connect(opt);
        std::vector<float> x(1000, 1.0f);
        c->allreduce(view_of(x.data(), x.size()), ReduceOp::sum).wait();
        if (rank == 1) return std::string("left");
        c->allreduce(view_of(x.data(), x.size()), ReduceOp::sum).wait();
        return std::string("finished without noticing");
      },
      20s);
  EXPECT_TRUE(out[1].ok()) << describe(out);
  for (int r : {0, 2}) {
    EXPECT_FALSE(out[r].hung) << describe(out);
    EXPECT_EQ(out[r].code(), "peer_lost") << describe(out);
    EXPECT_TRUE(contains(out[r].message(), "rank 1")) << describe(out);
  }
}

std::vector<std::string> dev_shm_entries() {
  std::vector<std::string> v;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) v.push_back(e->d_name);
    closedir(d);
  }
  std::sort(v.begin(), v.end());
  return v;
}

// Whatever happens to a job (a rank killed mid-operation, the others failing
// with it), nothing it made is left in /dev/shm.
TEST(Faults, NothingIsLeftInDevShmAfterAKilledJob) {
  auto before = dev_shm_entries();
  kill_mid_allreduce(3, 1 << 18);
  kill_mid_allreduce(3, 8);
  EXPECT_EQ(dev_shm_entries(), before);
}

TEST(Faults, AfterAFailureLaterOpsFailAtOnceWithTheCause) {
  auto out = run_ranks(2,
                       [](int rank, Options opt) {
                         auto c = connect(opt);
                         float x = 1;
                         if (rank == 1) stall_until_killed();
                         try {
                           c->allreduce(view_of(&x, 1), ReduceOp::sum).wait();
                         } catch (const Error&) {
                         }
                         c->allreduce(view_of(&x, 1), ReduceOp::sum).wait();
                         return std::string("second op succeeded");
                       },
                       3s, {}, 60s, {1});
  EXPECT_EQ(out[0].code(), "timeout") << describe(out);
  EXPECT_TRUE(contains(out[0].message(), "failed earlier")) << describe(out);
}

// Communicator::abort from another thread: the op this rank is blocked in
// stops at once with code `aborted` and the reason; the peers, blocked in a
// collective that waits for this rank, fail with the same cause instead of
// waiting for their 60 s deadline (the harness calls a rank hung after 20 s);
// every later call fails at once, and error() reports the abort.
TEST(Faults, AbortFromAnotherThreadStopsTheOpAndTellsThePeers) {
  auto out = run_ranks(
      3,
      [](int rank, Options opt) -> std::string {
        auto c = connect(opt);
        float x = 1;
        c->barrier().wait();
        if (rank != 0) {
          c->barrier().wait();  // waits for rank 0, which never comes
          return "the barrier passed without rank 0";
        }
        std::thread stopper([&] {
          std::this_thread::sleep_for(300ms);
          c->abort("the user pressed stop");
        });
        std::optional<Error> first;
        try {
          c->recv(view_of(&x, 1), 1).wait();  // rank 1 never sends
        } catch (const Error& e) {
          first = e;
        }
        stopper.join();
        if (!first) return "the recv returned";
        auto e = c->error();
        if (!e || e->code() != ErrorCode::aborted) return "error() does not report the abort";
        std::string later =
            testing::error_of([&] { c->allreduce(view_of(&x, 1), ReduceOp::sum).wait(); });
        if (!contains(later, "failed earlier")) return "a later op: " + later;
        throw *first;
      },
      60s, {}, 20s);
  for (int r = 0; r < 3; ++r) {
    EXPECT_FALSE(out[r].hung) << describe(out);
    EXPECT_EQ(out[r].code(), "aborted") << describe(out);
    EXPECT_TRUE(contains(out[r].message(), "the user pressed stop")) << describe(out);
  }
  EXPECT_TRUE(contains(out[1].message(), "rank 0 aborted the communicator")) << describe(out);
}

TEST(Faults, WrongSecretIsRefused) {
  auto out = run_ranks(
      2,
      [](int rank, Options opt) {
        if (rank == 1) opt.secret = "not-the-secret";
        connect(opt);
        return std::string("joined");
      },
      2s);
  EXPECT_NE(out[1].code(), "") << describe(out);
  EXPECT_TRUE(contains(out[1].message(), "COLLIE_JOB_SECRET")) << describe(out);
  EXPECT_FALSE(out[0].ok()) << describe(out);
}

// Past a store that checks nothing (a shared file), the mesh's own handshake
// still refuses a rank without the secret: it proves nothing it cannot, and
// the other rank is not joined by it.
TEST(Faults, TheMeshRefusesARankWithoutTheSecretEvenPastTheStore) {
  const std::string path = "/tmp/collie-test-mesh-secret-" + std::to_string(::getpid()) + ".store";
  std::remove(path.c_str());
  auto out = run_ranks(
      2,
      [&](int rank, Options opt) {
        opt.store = std::shared_ptr<Store>(make_file_store(path, 3s));
        opt.backend = "tcp";
        if (rank == 1) opt.secret = "not-the-secret";
        connect(opt);
        return std::string("joined");
      },
      3s);
  std::remove(path.c_str());
  EXPECT_EQ(out[1].code(), "invalid_argument") << describe(out);
  EXPECT_TRUE(contains(out[1].message(), "could not prove that it knows this job's secret"))
      << describe(out);
  EXPECT_FALSE(out[0].ok()) << describe(out);
  EXPECT_TRUE(contains(out[0].message(), "waiting for rank 1 to connect")) << describe(out);
  EXPECT_TRUE(contains(out[0].message(),
                       "refused a connection from 127.0.0.1 claiming to be "
                       "rank 1 that could not prove it knows this job's secret"))
      << describe(out);
}

// Ranks that open different numbers of connections to each peer would cut
// messages differently: the rank that accepts says so, naming the other.
TEST(Faults, DifferentSocketCountsAreNamed) {
  auto out = run_ranks(
      2,
      [](int rank, Options opt) {
        opt.backend = "tcp";
        setenv("COLLIE_TCP_SOCKETS", rank == 1 ? "2" : "1", 1);
        connect(opt);
        return std::string("joined");
      },
      20s);
  for (int r = 0; r < 2; ++r) EXPECT_FALSE(out[r].ok() || out[r].hung) << describe(out);
  EXPECT_EQ(out[0].code(), "invalid_argument") << describe(out);
  // Two sockets per peer, each doubled: one per direction.
  EXPECT_TRUE(contains(out[0].message(), "rank 1 opens 4 connections")) << describe(out);
  EXPECT_TRUE(contains(out[0].message(), "COLLIE_TCP_SOCKETS")) << describe(out);
  EXPECT_TRUE(contains(out[1].message(), "COLLIE_TCP_SOCKETS")) << describe(out);
}

// One connection per direction on one rank, one for both on the other.
TEST(Faults, DifferentDirectionSplitsAreNamed) {
  auto out = run_ranks(
      2,
      [](int rank, Options opt) {
        opt.backend = "tcp";
        setenv("COLLIE_TCP_SOCKETS", "1", 1);
        setenv("COLLIE_TCP_SPLIT_DIRECTIONS", rank == 1 ? "0" : "1", 1);
        connect(opt);
        return std::string("joined");
      },
      20s);
  for (int r = 0; r < 2; ++r) EXPECT_FALSE(out[r].ok() || out[r].hung) << describe(out);
  EXPECT_EQ(out[0].code(), "invalid_argument") << describe(out);
  EXPECT_TRUE(contains(out[0].message(), "rank 1 opens 1 connection to each peer and this rank 2"))
      << describe(out);
  for (int r = 0; r < 2; ++r)
    EXPECT_TRUE(contains(out[r].message(), "COLLIE_TCP_SPLIT_DIRECTIONS")) << describe(out);
}

// Over TCP an all-to-all's block of 512 KiB or more goes on a connection
// that carries its direction only, a smaller one on the connection both
// directions share (comm/tcp/tcp_mesh.h). Blocks of another size on one rank
// than on the other may then be read from another connection than the one
// they came on: still a mismatch naming the other rank on both, at once,
// never a wait for the deadline. Every pair of sizes on either side of the
// cut, on either rank.
TEST(Faults, AnAlltoallWithOtherBlockSizesIsAMismatchWhateverConnectionEachTakes) {
  const size_t small = 1024, large = 256 * 1024, larger = 512 * 1024;  // floats per block
  const std::pair<size_t, size_t> cases[] = {
      {large, small}, {small, large}, {large, larger}, {larger, large}};
  for (auto [mine, theirs] : cases) {
    for (int odd : {0, 1}) {
      auto out = run_ranks(
          2,
          [=](int rank, Options opt) {
            opt.backend = "tcp";
            auto c = connect(opt);
            const size_t block = rank == odd ? mine : theirs;
            std::vector<float> in(2 * block, 1.0f), out(2 * block);
            c->alltoall(view_of(in.data(), in.size()), view_of(out.data(), out.size())).wait();
            return std::string("completed");
          },
          30s);
      SCOPED_TRACE("rank " + std::to_string(odd) + " has blocks of " + std::to_string(mine) +
                   " floats, the other of " + std::to_string(theirs));
      for (int r = 0; r < 2; ++r) {
        EXPECT_FALSE(out[r].hung) << describe(out);
        EXPECT_EQ(out[r].code(), "mismatch") << describe(out);
        EXPECT_TRUE(contains(out[r].message(), "rank " + std::to_string(1 - r))) << describe(out);
      }
    }
  }
}

// The shm round and one-step sizes set the segment's layout and the
// algorithm, so rank 0's are every rank's: set on rank 0 alone they still
// hold everywhere (before, rank 1 built another layout and refused the
// segment).
TEST(Faults, ShmSizesSetOnRankZeroAloneHoldForEveryRank) {
  auto out = run_ranks(
      2,
      [](int rank, Options opt) {
        opt.backend = "shm";
        setenv("COLLIE_SHM_CMA", "0", 1);  // the rounds, whose size rank 0 sets
        if (rank == 0) {
          setenv("COLLIE_SHM_CHUNK", "64K", 1);
          setenv("COLLIE_SHM_SMALL", "0", 1);
        }
        auto c = connect(opt);
        // 8 B (inline, unless COLLIE_SHM_SMALL=0) and 1 MiB (16 rounds of
        // 64 KiB): each element's sum is known exactly.
        std::string got;
        for (size_t count : {size_t{1}, size_t{1} << 17}) {
          std::vector<int64_t> x(count);
          for (size_t i = 0; i < count; ++i) x[i] = (rank + 1) * static_cast<int64_t>(i + 1);
          c->allreduce(view_of(x.data(), count), ReduceOp::sum).wait();
          size_t wrong = 0;
          for (size_t i = 0; i < count; ++i) wrong += x[i] != 3 * static_cast<int64_t>(i + 1);
          got += std::to_string(wrong) + " wrong;";
        }
        return got;
      },
      20s);
  for (int r = 0; r < 2; ++r) EXPECT_EQ(out[r].report, "OK 0 wrong;0 wrong;") << describe(out);
}

// Large all-reduces read peers' memory directly (process_vm_readv) only
// when every rank may: one rank with COLLIE_SHM_CMA=0 puts every rank on
// the segment's rounds (were the ranks to choose apart, they would wait on
// each other for ever or read a buffer nobody described). Which one ran is
// read back from COLLIE_TRACE; the sums are known exactly either way.
TEST(Faults, ShmReadsPeersDirectlyOnlyWhenEveryRankMay) {
  {
    // Whether this machine lets a process read another's memory at all
    // (Yama's ptrace_scope, a container's seccomp profile may not): a child
    // reads a word of its parent, as one rank reads another.
    static volatile int64_t word = 42;
    pid_t child = fork();
    if (child == 0) {
      int64_t seen = 0;
      iovec local{&seen, sizeof seen}, remote{const_cast<int64_t*>(&word), sizeof seen};
      _exit(process_vm_readv(getppid(), &local, 1, &remote, 1, 0) == sizeof seen && seen == 42 ? 0
                                                                                               : 1);
    }
    int status = 0;
    waitpid(child, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
      GTEST_SKIP() << "process_vm_readv between processes is not allowed here (Yama or seccomp)";
  }
  char dir[] = "/tmp/collie-direct-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  for (int one_off = 0; one_off < 2; ++one_off) {
    const std::string trace = std::string(dir) + "/t" + std::to_string(one_off) + ".%r.json";
    auto out = run_ranks(
        3,
        [&](int rank, Options opt) {
          opt.backend = "shm";
          setenv("COLLIE_TRACE", trace.c_str(), 1);
          setenv("COLLIE_SHM_CHUNK", "1M", 1);  // a broadcast of 1 MiB reads directly
          if (one_off && rank == 1) setenv("COLLIE_SHM_CMA", "0", 1);
          auto c = connect(opt);
          const int n = 3;
          const size_t count = (size_t{1} << 20) / sizeof(int64_t) + 3;  // slices of unequal size
          const auto mark = [](size_t i, int r) {
            return static_cast<int64_t>(i * 7 + r * 1000003);
          };
          size_t wrong = 0;
          // Every buffer is overwritten as soon as its op returns: a rank
          // that left while a peer still read its memory would show as
          // wrong numbers on that peer.
          for (int round = 0; round < 3; ++round) {
            std::vector<int64_t> x(count), y(count);
            for (size_t i = 0; i < count; ++i) x[i] = mark(i, rank);
            c->allreduce(view_of(x.data(), count), view_of(y.data(), count), ReduceOp::sum).wait();
            for (size_t i = 0; i < count; ++i)
              wrong += y[i] != mark(i, 0) + mark(i, 1) + mark(i, 2);
            std::fill(x.begin(), x.end(), -1);
            std::fill(y.begin(), y.end(), -1);
            for (size_t i = 0; i < count; ++i) x[i] = mark(i, rank);
            c->allreduce(view_of(x.data(), count), ReduceOp::sum).wait();  // in place
            for (size_t i = 0; i < count; ++i)
              wrong += x[i] != mark(i, 0) + mark(i, 1) + mark(i, 2);
            std::fill(x.begin(), x.end(), -1);
            // Broadcast from rank 1, all-gather, reduce-scatter: the same
            // choice, each against its known answer.
            for (size_t i = 0; i < count; ++i) x[i] = rank == 1 ? mark(i, 1) : -5;
            c->broadcast(view_of(x.data(), count), 1).wait();
            for (size_t i = 0; i < count; ++i) wrong += x[i] != mark(i, 1);
            std::fill(x.begin(), x.end(), -1);
            std::vector<int64_t> all(n * count);
            for (size_t i = 0; i < count; ++i) x[i] = mark(i, rank);
            c->allgather(view_of(x.data(), count), view_of(all.data(), n * count)).wait();
            std::fill(x.begin(), x.end(), -1);
            for (size_t i = 0; i < n * count; ++i)
              wrong += all[i] != mark(i % count, static_cast<int>(i / count));
            for (size_t i = 0; i < n * count; ++i) all[i] = mark(i, rank);
            c->reduce_scatter(view_of(all.data(), n * count), view_of(y.data(), count),
                              ReduceOp::sum)
                .wait();
            std::fill(all.begin(), all.end(), -1);
            for (size_t i = 0; i < count; ++i) {
              const size_t at = rank * count + i;
              wrong += y[i] != mark(at, 0) + mark(at, 1) + mark(at, 2);
            }
            // A ring of sends, each handed over by address where the
            // receiver may read it: the send returns once it has.
            for (size_t i = 0; i < count; ++i) x[i] = mark(i, rank);
            Work sent = c->send(view_of(x.data(), count), (rank + 1) % n, round);
            Work got = c->recv(view_of(y.data(), count), (rank + n - 1) % n, round);
            sent.wait();
            std::fill(x.begin(), x.end(), -1);
            got.wait();
            for (size_t i = 0; i < count; ++i) wrong += y[i] != mark(i, (rank + n - 1) % n);
          }
          c.reset();  // writes the trace
          std::ifstream f(std::string(dir) + "/t" + std::to_string(one_off) + "." +
                          std::to_string(rank) + ".json");
          std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
          const bool direct = text.find("\"algorithm\":\"direct\"") != std::string::npos;
          const bool rounds = text.find("\"algorithm\":\"rounds\"") != std::string::npos;
          return std::to_string(wrong) + " wrong, " + (direct ? "direct " : "") +
                 (rounds ? "rounds" : "");
        },
        30s);
    const std::string want = one_off ? "OK 0 wrong, rounds" : "OK 0 wrong, direct ";
    for (int r = 0; r < 3; ++r) EXPECT_EQ(out[r].report, want) << one_off << describe(out);
  }
  std::filesystem::remove_all(dir);
}

// Set differently on two ranks, they are refused by name (before, 0 and 32
// gave one layout, and the ranks ran different algorithms for 8 B). Every
// rank hears the reason at once, not a rendezvous timeout, the rank that
// did not set it too, and rank 0 (which serves the store here) stays until
// the others have read it.
TEST(Faults, DifferentShmSizesAreNamed) {
  auto out = run_ranks(
      3,
      [](int rank, Options opt) {
        opt.backend = "shm";
        if (rank != 1) setenv("COLLIE_SHM_SMALL", rank == 0 ? "0" : "32", 1);
        auto c = connect(opt);
        int64_t x = rank + 1;
        c->allreduce(view_of(&x, 1), ReduceOp::sum).wait();
        return std::to_string(x);
      },
      20s);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(out[r].code(), "mismatch") << describe(out);
    EXPECT_TRUE(contains(out[r].message(), "COLLIE_SHM_SMALL=32, rank 0 has 0")) << describe(out);
  }
  for (int r = 0; r < 2; ++r)
    EXPECT_TRUE(contains(out[r].message(), "rank 2 could not share the segment")) << describe(out);
}

// Rank 0 cannot make the segment (here: a file size limit below its size):
// the others get its reason, not a rendezvous timeout.
TEST(Faults, ASegmentRankZeroCannotMakeIsNamedOnEveryRank) {
  auto out = run_ranks(
      3,
      [](int rank, Options opt) {
        opt.backend = "shm";
        if (rank == 0) {
          signal(SIGXFSZ, SIG_IGN);
          rlimit small{64 * 1024, 64 * 1024};
          setrlimit(RLIMIT_FSIZE, &small);
        }
        connect(opt);
        return std::string("joined");
      },
      20s);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(out[r].code(), "unavailable") << describe(out);
    EXPECT_TRUE(contains(out[r].message(), "sizing the shared segment")) << describe(out);
  }
  for (int r = 1; r < 3; ++r)
    EXPECT_TRUE(contains(out[r].message(), "rank 0 could not share the segment")) << describe(out);
}

TEST(Faults, StrayClientsOnTheStorePortDoNotDisturbTheJob) {
  // The strays connect before the ranks start: one sends garbage, one sends
  // nothing and stays connected through the whole job.
  auto out = run_ranks(
      3,
      [&](int rank, Options opt) {
        if (rank == 1) {
          // Connect two strays to the store port before joining ourselves.
          auto ep = net::Endpoint{"127.0.0.1", opt.master_port};
          auto garbage = net::connect_tcp(ep, net::deadline_after(5s), "stray");
          const char junk[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n\xff\xff\xff\xff\x7f";
          net::write_full(garbage.get(), junk, sizeof junk, net::deadline_after(5s), "stray");
          auto silent = net::connect_tcp(ep, net::deadline_after(5s), "stray");
          auto c = connect(opt);
          int64_t x = rank + 1;
          c->allreduce(view_of(&x, 1), ReduceOp::sum).wait();
          return std::to_string(x);
        }
        auto c = connect(opt);
        int64_t x = rank + 1;
        c->allreduce(view_of(&x, 1), ReduceOp::sum).wait();
        return std::to_string(x);
      },
      20s);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(out[r].report, "OK 6") << describe(out);
}

TEST(Faults, PortAlreadyInUseSaysWhatToChange) {
  net::Fd busy = net::listen_tcp("", 0, "squatter");
  int port = net::local_port(busy.get());
  Options opt;
  opt.rank = 0;
  opt.world_size = 2;
  opt.master_addr = "127.0.0.1";
  opt.master_port = port;
  opt.timeout = 2s;
  try {
    connect(opt);
    ADD_FAILURE() << "connect succeeded on a busy port";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_TRUE(contains(e.what(), "already in use")) << e.what();
    EXPECT_TRUE(contains(e.what(), std::to_string(port))) << e.what();
  }
}

TEST(Faults, BadLaunchVariablesSayWhatToChange) {
  auto out = run_ranks(
      1,
      [](int, Options) {
        setenv("WORLD_SIZE", "abc", 1);
        setenv("RANK", "0", 1);
        connect();
        return std::string("connected");
      },
      2s);
  EXPECT_EQ(out[0].code(), "invalid_argument") << describe(out);
  EXPECT_TRUE(contains(out[0].message(), "WORLD_SIZE='abc'")) << describe(out);

  out = run_ranks(
      1,
      [](int, Options) {
        setenv("WORLD_SIZE", "4", 1);
        setenv("RANK", "4", 1);
        connect();
        return std::string("connected");
      },
      2s);
  EXPECT_EQ(out[0].code(), "invalid_argument") << describe(out);
  EXPECT_TRUE(contains(out[0].message(), "RANK=4 is not below WORLD_SIZE=4")) << describe(out);
}

// Ranks that build the reducer over different models, or with different
// bucket sizes, are told so at construction, on every rank.
TEST(Faults, ReducerOverDifferentModelsOrBucketsIsRefusedOnEveryRank) {
  for (bool shapes : {true, false}) {
    auto out = run_ranks(
        3,
        [&](int rank, Options opt) {
          auto c = connect(opt);
          std::vector<float> a(100), ga(100), b(50), gb(50), d(30), gd(30);
          size_t nd = shapes && rank == 2 ? 29 : 30;
          ReducerOptions ro;
          // Reverse order d, b, a: d fills the 64-byte first bucket; with
          // 4096-byte buckets b and a share one, with 128-byte ones they do not.
          ro.first_bucket_bytes = 64;
          ro.bucket_bytes = !shapes && rank == 2 ? 128 : 4096;
          Reducer red(*c,
                      {{view_of(a.data(), 100), view_of(ga.data(), 100)},
                       {view_of(b.data(), 50), view_of(gb.data(), 50)},
                       {view_of(d.data(), nd), view_of(gd.data(), nd)}},
                      ro);
          return std::string("constructed");
        },
        20s);
    for (int r = 0; r < 3; ++r) {
      EXPECT_EQ(out[r].code(), "mismatch") << describe(out);
      EXPECT_TRUE(contains(out[r].message(), "rank 2")) << describe(out);
      EXPECT_TRUE(contains(out[r].message(), shapes ? "shapes or dtypes" : "bucket sizes"))
          << describe(out);
    }
  }
}

// A rank killed while the reducer runs PowerSGD (two chained all-reduces per
// bucket, issued from completions): every survivor's finalize reports the
// lost rank instead of hanging in the chain.
TEST(Faults, RankKilledDuringPowerSgdTrainingIsReportedByEverySurvivor) {
  if (!testing::have_powersgd()) GTEST_SKIP() << "built without BLAS: no PowerSGD";
  const int victim = 1;
  auto out = run_ranks(
      3,
      [&](int rank, Options opt) {
        auto c = connect(opt);
        const size_t rows = 256, cols = 512;
        std::vector<float> w(rows * cols), gw(rows * cols), b(rows), gb(rows);
        ReducerOptions ro;
        ro.comm_hook = "powersgd:start_iter=2";
        Reducer red(*c,
                    {{view_of(w.data(), w.size()), view_of(gw.data(), gw.size()), rows},
                     {view_of(b.data(), b.size()), view_of(gb.data(), gb.size()), 0}},
                    ro);
        if (rank == victim) {
          std::thread([] {
            std::this_thread::sleep_for(300ms);
            raise(SIGKILL);
          }).detach();
        }
        for (int it = 0; it < 1000000; ++it) {
          for (size_t i = 0; i < gw.size(); ++i) gw[i] = static_cast<float>((i + it) % 7);
          red.prepare_for_backward();
          red.mark_grad_ready(1);
          red.mark_grad_ready(0);
          red.finalize_backward();
        }
        return std::string("finished without noticing");
      },
      10s);
  EXPECT_FALSE(out[victim].exited) << describe(out);
  for (int r = 0; r < 3; ++r) {
    if (r == victim) continue;
    EXPECT_FALSE(out[r].hung) << describe(out);
    EXPECT_EQ(out[r].code(), "peer_lost") << describe(out);
    EXPECT_TRUE(contains(out[r].message(), "rank " + std::to_string(victim))) << describe(out);
  }
}

// A hook that never completes: finalize fails at the deadline, naming what
// it waited for, on every rank; nothing hangs (the reducer's destructor
// gives up on it too).
class NeverCompletes final : public CommHook {
 public:
  std::string name() const override { return "never_completes"; }
  Work run(Communicator& c, GradBucket& b) override {
    return Work::pending("never_completes on bucket " + std::to_string(b.index) + " (rank " +
                             std::to_string(c.rank()) + ")",
                         c.timeout() * 2);
  }
};

TEST(Faults, AHookThatNeverCompletesTimesOutNamingIt) {
  auto out = run_ranks(
      2,
      [&](int, Options opt) {
        auto c = connect(opt);
        std::vector<float> w(64), gw(64);
        ReducerOptions ro;
        ro.hook = std::make_shared<NeverCompletes>();
        Reducer red(*c, {{view_of(w.data(), w.size()), view_of(gw.data(), gw.size())}}, ro);
        red.prepare_for_backward();
        red.mark_grad_ready(0);
        red.finalize_backward();
        return std::string("finalize returned");
      },
      1s, {}, 30s);
  for (int r = 0; r < 2; ++r) {
    EXPECT_FALSE(out[r].hung) << describe(out);
    EXPECT_EQ(out[r].code(), "timeout") << describe(out);
    EXPECT_TRUE(contains(out[r].message(), "never_completes on bucket 0")) << describe(out);
  }
}

}  // namespace
}  // namespace collie
