// tests/test_launcher_restarts.cc: collie-run's restarts (--max-restarts:
// the whole group again with a fresh rendezvous, the user's secret kept,
// stops that are not restarted) and jobs on several nodes, as users run
// them (tests/launcher_harness.h).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "launcher_harness.h"

namespace {

using namespace launcher_test;

// --max-restarts: torchrun's semantics. Rank 1 fails in the first two rounds;
// rank 0 finishes at once every time, and is started again all the same
// (the whole group restarts, not the failed rank alone). Each round has a
// new store port and secret, and says which round it is.
TEST_F(Launcher, ARestartStartsTheWholeGroupAgainWithAFreshRendezvous) {
  auto logs = dir_ / "logs";
  auto r = run({"-n", "2", "--max-restarts", "3", "--log-dir", logs.string(), "sh", "-c",
                "echo round $COLLIE_RESTART_COUNT $TORCHELASTIC_RESTART_COUNT "
                "$TORCHELASTIC_MAX_RESTARTS $COLLIE_MASTER_PORT $COLLIE_JOB_SECRET "
                "${COLLIE_STORE_FD:-nofd}; "
                "if [ $RANK = 1 ] && [ $COLLIE_RESTART_COUNT -lt 2 ]; then exit 3; fi"});
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  std::map<std::string, std::vector<std::string>> rounds;  // by rank: what each round said
  for (const auto& l : lines(r.out)) rounds[l.substr(0, 3)].push_back(l.substr(4));
  ASSERT_EQ(rounds["[0]"].size(), 3u) << r.out;
  ASSERT_EQ(rounds["[1]"].size(), 3u) << r.out;
  std::set<std::string> ports, secrets;
  for (int k = 0; k < 3; ++k) {
    std::istringstream in0(rounds["[0]"][k]), in1(rounds["[1]"][k]);
    std::string w0, c0, t0, m0, p0, s0, fd0, w1, c1, t1, m1, p1, s1, fd1;
    in0 >> w0 >> c0 >> t0 >> m0 >> p0 >> s0 >> fd0;
    in1 >> w1 >> c1 >> t1 >> m1 >> p1 >> s1 >> fd1;
    EXPECT_EQ(c0, std::to_string(k)) << r.out;
    EXPECT_EQ(c1, std::to_string(k)) << r.out;
    EXPECT_EQ(t0, c0) << "TORCHELASTIC_RESTART_COUNT: " << r.out;
    EXPECT_EQ(m0, "3") << "TORCHELASTIC_MAX_RESTARTS: " << r.out;
    EXPECT_EQ(p0, p1) << "both ranks of a round meet at one store: " << r.out;
    EXPECT_EQ(s0, s1) << r.out;
    EXPECT_EQ(fd0, "nofd") << "collie-run serves each round's store itself: " << r.out;
    EXPECT_EQ(fd1, "nofd") << r.out;
    ports.insert(p0);
    secrets.insert(s0);
  }
  EXPECT_EQ(ports.size(), 3u) << "every round has a store of its own: " << r.out;
  EXPECT_EQ(secrets.size(), 3u) << "every round has a secret of its own: " << r.out;
  EXPECT_TRUE(contains(r.err, "collie-run: rank 1 exited with status 3")) << r.err;
  EXPECT_TRUE(contains(r.err, "restarting (attempt 1 of 3) with a fresh rendezvous")) << r.err;
  EXPECT_TRUE(contains(r.err, "restarting (attempt 2 of 3)")) << r.err;
  EXPECT_FALSE(contains(r.err, "attempt 3 of 3")) << r.err;
  EXPECT_FALSE(contains(r.err, "the job failed")) << r.err;
  // The log keeps every round's output, each restart marked.
  std::ifstream f(logs / "rank.0.log");
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(contains(text, "round 0 0 3")) << text;
  EXPECT_TRUE(contains(text, "---- collie-run: restarting (attempt 2 of 3) ----\nround 2 2 3"))
      << text;
}

// A user's secret is kept across rounds: other tools of the job may know it.
TEST_F(Launcher, ARestartKeepsTheUsersSecret) {
  auto r = run({"-n", "1", "--max-restarts", "1", "sh", "-c",
                "echo $COLLIE_JOB_SECRET; [ $COLLIE_RESTART_COUNT = 1 ]"},
               {"COLLIE_JOB_SECRET=given-by-user"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "[0] given-by-user\n[0] given-by-user\n") << r.err;
}

// When the restarts run out, the job fails as it does without them, with
// the last round's summary, and says so.
TEST_F(Launcher, WhenRestartsRunOutTheJobFailsWithTheSummary) {
  auto r = run({"-n", "2", "--max-restarts", "2", "sh", "-c",
                "if [ $RANK = 1 ]; then echo \"failing in round $COLLIE_RESTART_COUNT\"; exit 3; "
                "fi; sleep 60"});
  EXPECT_EQ(r.status, 3) << r.err;
  EXPECT_TRUE(contains(r.err, "restarting (attempt 1 of 2)")) << r.err;
  EXPECT_TRUE(contains(r.err, "restarting (attempt 2 of 2)")) << r.err;
  EXPECT_FALSE(contains(r.err, "attempt 3 of")) << r.err;
  std::string s = summary(r.err);
  EXPECT_TRUE(contains(s, "root cause: rank 1 (pid ")) << r.err;
  EXPECT_TRUE(contains(s, "[1] failing in round 2")) << s;
  EXPECT_TRUE(contains(s, "after the last restart")) << s;
  EXPECT_TRUE(contains(s, "rank 0, stopped by collie-run")) << s;
  EXPECT_TRUE(contains(s, "no restarts left: 2 of 2 used")) << s;
}

// Without --max-restarts (0) a failure ends the job as it always did.
TEST_F(Launcher, NoRestartsByDefault) {
  auto r = run({"-n", "2", "sh", "-c",
                "echo \"restart count $COLLIE_RESTART_COUNT\"; [ $RANK = 1 ] && exit 3; sleep 60"});
  EXPECT_EQ(r.status, 3) << r.err;
  EXPECT_TRUE(contains(r.out, "[1] restart count 0")) << r.out;
  EXPECT_FALSE(contains(r.err, "restarting")) << r.err;
  EXPECT_FALSE(contains(r.err, "no restarts left")) << r.err;
  EXPECT_TRUE(contains(summary(r.err), "root cause: rank 1")) << r.err;
}

// A stop asked of collie-run is not a failure to restart from.
TEST_F(Launcher, AStopSignalIsNotRestarted) {
  auto r = run({"-n", "2", "--max-restarts", "3", "sh", "-c",
                "touch $T/ready.$RANK; while :; do sleep 0.05; done"},
               {}, [&](pid_t launcher_pid) {
                 EXPECT_TRUE(eventually([&] { return all_ready(2); }));
                 kill(launcher_pid, SIGTERM);
               });
  EXPECT_EQ(r.status, 128 + SIGTERM) << r.err;
  EXPECT_FALSE(contains(r.err, "restarting")) << r.err;
}

// A failure followed by a stop asked of collie-run (rank 0 sends SIGINT once
// the launcher has reaped rank 1): the stop wins, and the summary says why
// no restart came.
TEST_F(Launcher, AStopAfterAFailureIsNotRestartedEither) {
  auto r = run({"-n", "2", "--max-restarts", "3", "--grace-seconds", "1", "sh", "-c",
                "if [ $RANK = 1 ]; then echo $$ > $T/p && mv $T/p $T/pid.1; exit 3; fi; "
                "while [ ! -s $T/pid.1 ]; do sleep 0.01; done; "
                "while kill -0 $(cat $T/pid.1) 2>/dev/null; do sleep 0.01; done; "
                "kill -INT $PPID; sleep 60"});
  EXPECT_EQ(r.status, 3) << r.err;
  EXPECT_FALSE(contains(r.err, "restarting")) << r.err;
  EXPECT_TRUE(contains(summary(r.err), "root cause: rank 1")) << r.err;
  EXPECT_TRUE(contains(summary(r.err),
                       "not restarted: collie-run was told to stop (SIGINT); restarts 0 of 3 used"))
      << r.err;
}

// With the port fixed by the user, the first round's store serves every
// round (it holds the port; a new one could not bind it), each round's keys
// under a prefix of its own. The restart used to fail with "port P is
// already in use", its own store holding it.
TEST_F(Launcher, ARestartOnAFixedPortKeepsTheStoreAndPrefixesTheRound) {
  const std::string port = std::to_string(free_port());
  auto r = run({"-n", "2", "--master-port", port, "--max-restarts", "2", "sh", "-c",
                "echo $COLLIE_RESTART_COUNT $COLLIE_MASTER_PORT $COLLIE_STORE_PREFIX; "
                "if [ $RANK = 1 ] && [ $COLLIE_RESTART_COUNT = 0 ]; then exit 3; fi"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "restarting (attempt 1 of 2)")) << r.err;
  auto out = lines(r.out);
  std::set<std::string> got(out.begin(), out.end());
  EXPECT_EQ(got,
            (std::set<std::string>{"[0] 0 " + port + " round0/", "[1] 0 " + port + " round0/",
                                   "[0] 1 " + port + " round1/", "[1] 1 " + port + " round1/"}))
      << r.out;
}

// Two nodes' launchers on this host, started together on one port with one
// secret; `node1` gets node 1's launcher pid while they run.
std::pair<Result, Result> run_two_nodes(const std::vector<std::string>& args,
                                        const std::function<void(pid_t)>& node1 = nullptr) {
  const std::string port = std::to_string(free_port());
  auto node = [&](int k) {
    std::vector<std::string> a{"--nnodes",      "2",         "--node-rank",   std::to_string(k),
                               "--master-addr", "127.0.0.1", "--master-port", port};
    a.insert(a.end(), args.begin(), args.end());
    return a;
  };
  const std::vector<std::string> env{"COLLIE_JOB_SECRET=two-nodes", "COLLIE_TIMEOUT=5",
                                     "COLLIE_RUN_GRACE=1"};
  Result r0;
  std::thread t([&] { r0 = run(node(0), env); });
  Result r1 = run(node(1), env, node1);
  t.join();
  return {r0, r1};
}

// --max-restarts on several nodes: rank 3 (node 1) fails in the first
// round while node 0's ranks still run; node 0's launcher learns it through
// the store, stops its ranks, and both nodes start every rank again.
TEST_F(Launcher, ARestartOnSeveralNodesStartsEveryNodesRanksAgain) {
  auto [a, b] = run_two_nodes({"-n", "2", "--max-restarts", "2", "sh", "-c",
                               "echo round $COLLIE_RESTART_COUNT $COLLIE_STORE_PREFIX; "
                               "if [ $COLLIE_RESTART_COUNT = 0 ]; then "
                               "  if [ $RANK = 3 ]; then sleep 0.3; exit 3; fi; "
                               "  [ $RANK = 2 ] || exec sleep 60; "
                               "fi"});
  EXPECT_EQ(a.status, 0) << a.err;
  EXPECT_EQ(b.status, 0) << b.err;
  for (const auto& [r, ranks] :
       {std::pair{&a, std::vector{0, 1}}, std::pair{&b, std::vector{2, 3}}})
    for (int rank : ranks)
      for (int round : {0, 1}) {
        const std::string line = "[" + std::to_string(rank) + "] round " + std::to_string(round) +
                                 " round" + std::to_string(round) + "/";
        EXPECT_TRUE(contains(r->out, line)) << line << "\n" << r->out;
      }
  EXPECT_TRUE(contains(a.err, "the job failed on another node: rank 3 on node 1 (pid ")) << a.err;
  EXPECT_TRUE(contains(a.err, "exited with status 3, 0.")) << a.err;
  EXPECT_TRUE(contains(a.err, "s after the start; stopping this node's ranks")) << a.err;
  EXPECT_TRUE(contains(b.err, "collie-run: rank 3 exited with status 3")) << b.err;
  for (const Result* r : {&a, &b}) {
    EXPECT_TRUE(contains(r->err, "the job's first failure: rank 3 on node 1")) << r->err;
    EXPECT_TRUE(
        contains(r->err, "the ranks of all 2 nodes have ended; restarting (attempt 1 of 2)"))
        << r->err;
    EXPECT_FALSE(contains(r->err, "attempt 2 of 2")) << r->err;
  }
}

// When the restarts run out, both nodes fail with the job's root cause:
// node 1 its own rank's status and summary, node 0 the same status and the
// other node's root cause. Node 0's ranks finish at once every round, and
// are started again all the same.
TEST_F(Launcher, WhenRestartsRunOutOnSeveralNodesEveryNodeFailsWithTheRootCause) {
  auto [a, b] = run_two_nodes({"-n", "2", "--max-restarts", "1", "sh", "-c",
                               "echo round $COLLIE_RESTART_COUNT; [ $RANK != 3 ] || exit 3"});
  EXPECT_EQ(a.status, 3) << a.err;
  EXPECT_EQ(b.status, 3) << b.err;
  EXPECT_TRUE(contains(a.out, "[0] round 1")) << a.out;
  EXPECT_TRUE(contains(summary(a.err), "root cause, on another node: rank 3 on node 1 (pid "))
      << a.err;
  EXPECT_TRUE(contains(summary(b.err), "root cause: rank 3 (pid ")) << b.err;
  for (const Result* r : {&a, &b}) {
    EXPECT_TRUE(contains(r->err, "restarting (attempt 1 of 1)")) << r->err;
    EXPECT_TRUE(contains(summary(r->err), "no restarts left: 1 of 1 used")) << r->err;
  }
}

// A stop asked of one node's launcher is no failure to restart from: the
// other node's ranks are stopped too, and neither starts another round.
TEST_F(Launcher, AStopSignalToOneNodeStopsEveryNodeWithoutARestart) {
  auto [a, b] = run_two_nodes(
      {"-n", "1", "--max-restarts", "3", "sh", "-c", "touch $T/ready.$RANK; exec sleep 60"},
      [&](pid_t node1) {
        EXPECT_TRUE(eventually([&] { return all_ready(2); }));
        kill(node1, SIGINT);
      });
  EXPECT_EQ(b.status, 128 + SIGINT) << b.err;
  EXPECT_EQ(a.status, 128 + SIGINT) << a.err;
  EXPECT_TRUE(contains(a.err, "collie-run on node 1 was told to stop (SIGINT)")) << a.err;
  for (const Result* r : {&a, &b}) EXPECT_FALSE(contains(r->err, "restarting")) << r->err;
}

// The same asked of node 0's launcher, which serves the store: it keeps
// serving while the other node ends, so that node hears why (no "lost the
// job's store"), and neither restarts.
TEST_F(Launcher, AStopSignalToNodeZeroStopsEveryNodeWithoutARestart) {
  const std::string port = std::to_string(free_port());
  auto node = [&](int k) {
    return std::vector<std::string>{"--nnodes",
                                    "2",
                                    "--node-rank",
                                    std::to_string(k),
                                    "--master-addr",
                                    "127.0.0.1",
                                    "--master-port",
                                    port,
                                    "-n",
                                    "1",
                                    "--max-restarts",
                                    "3",
                                    "sh",
                                    "-c",
                                    "touch $T/ready.$RANK; exec sleep 60"};
  };
  const std::vector<std::string> env{"COLLIE_JOB_SECRET=two-nodes", "COLLIE_TIMEOUT=5",
                                     "COLLIE_RUN_GRACE=1"};
  Result b;
  std::thread t([&] { b = run(node(1), env); });
  Result a = run(node(0), env, [&](pid_t node0) {
    EXPECT_TRUE(eventually([&] { return all_ready(2); }));
    kill(node0, SIGINT);
  });
  t.join();
  EXPECT_EQ(a.status, 128 + SIGINT) << a.err;
  EXPECT_EQ(b.status, 128 + SIGINT) << b.err;
  EXPECT_TRUE(contains(b.err, "collie-run on node 0 was told to stop (SIGINT)")) << b.err;
  EXPECT_FALSE(contains(b.err, "lost the job's store")) << b.err;
  for (const Result* r : {&a, &b}) EXPECT_FALSE(contains(r->err, "restarting")) << r->err;
}

// A node whose launcher dies (kill -9: its ranks go with it) never ends the
// round: the other node stops waiting for it within the timeout (5 s) plus
// the grace period plus 10 s, names it, and does not restart.
TEST_F(Launcher, ANodeWhoseLauncherDiesIsNamedAndNothingRestarts) {
  auto [a, b] = run_two_nodes({"-n", "1", "--max-restarts", "3", "sh", "-c",
                               "touch $T/ready.$RANK; [ $RANK = 0 ] || exec sleep 60"},
                              [&](pid_t node1) {
                                EXPECT_TRUE(eventually([&] { return all_ready(2); }));
                                kill(node1, SIGKILL);
                              });
  EXPECT_EQ(b.status, 128 + SIGKILL);
  EXPECT_EQ(a.status, 1) << a.err;
  EXPECT_TRUE(contains(a.err, "node(s) 1 did not end round 0 within 16 s")) << a.err;
  EXPECT_FALSE(contains(a.err, "restarting")) << a.err;
}

}  // namespace
