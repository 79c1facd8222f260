// tests/test_faults.cc: failure is an error, never a hang: ranks that die,
// stall, never join, call a different collective or abort.
//
// Each test forks real rank processes (tests/faults_harness.h); one rank
// misbehaves and every other rank must come back with an error whose code
// and text name the problem and the rank. The job set up wrong is in
// test_faults_setup.cc; survivors that shrink and the reducer under
// faults in test_faults_recovery.cc.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "collie/comm.h"
#include "faults_harness.h"
#include "mp_test.h"

namespace collie {
namespace {

using namespace faults;
using namespace std::chrono_literals;

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
  // the rank that never came, as one it had not seen join.
  EXPECT_EQ(out[0].code(), "timeout") << describe(out);
  for (int r : {0, 1, 3}) {
    EXPECT_FALSE(out[r].hung) << describe(out);
    EXPECT_TRUE(out[r].code() == "timeout" || out[r].code() == "peer_lost") << describe(out);
    EXPECT_TRUE(contains(out[r].message(), "rank 2")) << describe(out);
    EXPECT_TRUE(contains(out[r].message(), out[r].code() == "timeout"
                                               ? "rank 2 of 4 never joined"
                                               : "rank 2 of 4 had not joined yet"))
        << describe(out);
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
    // When it was last seen: the end of #1, which it took part in.
    EXPECT_TRUE(contains(out[r].message(), "last seen in #1, which ended on rank "))
        << describe(out);
  }
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

}  // namespace
}  // namespace collie
