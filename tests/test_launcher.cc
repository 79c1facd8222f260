// tests/test_launcher.cc: collie-run as users run it (tests/launcher_harness.h):
// every rank's variables, the store it serves, failures and the exit
// status, the failure summary, signals, output. Restarts and several
// nodes are in test_launcher_restarts.cc.
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

#include "base/topology.h"
#include "comm/net/socket.h"
#include "launcher_harness.h"

namespace {

using namespace launcher_test;

TEST_F(Launcher, EveryRankGetsItsVariablesAndAPrefix) {
  auto r = run({"-n", "3", "sh", "-c",
                "echo $COLLIE_RANK $RANK $WORLD_SIZE $COLLIE_WORLD_SIZE $LOCAL_RANK "
                "$COLLIE_LOCAL_RANK $LOCAL_WORLD_SIZE $COLLIE_LOCAL_WORLD_SIZE $GROUP_RANK "
                "$COLLIE_NODE_RANK $COLLIE_NNODES $MASTER_ADDR $COLLIE_MASTER_ADDR $MASTER_PORT "
                "$COLLIE_MASTER_PORT"});
  ASSERT_EQ(r.status, 0) << r.err;
  std::set<std::string> ranks;
  std::string port;
  for (const auto& l : lines(r.out)) {
    std::istringstream in(l);
    std::string prefix, crank, rank, world, cworld, local, clocal, lworld, clworld, group, cnode,
        cnnodes, addr, caddr, mport, cport;
    in >> prefix >> crank >> rank >> world >> cworld >> local >> clocal >> lworld >> clworld >>
        group >> cnode >> cnnodes >> addr >> caddr >> mport >> cport;
    EXPECT_EQ(prefix, "[" + rank + "]") << l;
    EXPECT_EQ(crank, rank) << l;
    EXPECT_EQ(local, rank) << l;
    EXPECT_EQ(clocal, rank) << l;
    EXPECT_EQ(world, "3") << l;
    EXPECT_EQ(cworld, "3") << l;
    EXPECT_EQ(lworld, "3") << l;
    EXPECT_EQ(clworld, "3") << l;
    EXPECT_EQ(group, "0") << l;
    EXPECT_EQ(cnode, "0") << l;
    EXPECT_EQ(cnnodes, "1") << l;
    EXPECT_EQ(addr, "127.0.0.1") << l;
    EXPECT_EQ(caddr, "127.0.0.1") << l;
    // MASTER_PORT is torch.distributed's (its rank 0 serves a store there),
    // so it must not be collie's.
    EXPECT_NE(mport, cport) << l;
    EXPECT_GT(std::atoi(mport.c_str()), 0) << l;
    EXPECT_GT(std::atoi(cport.c_str()), 0) << l;
    if (port.empty()) port = mport;
    EXPECT_EQ(mport, port) << "every rank must see the same port";
    ranks.insert(rank);
  }
  EXPECT_EQ(ranks, (std::set<std::string>{"0", "1", "2"}));
}

TEST_F(Launcher, JobSecretIsInheritedOrMadeUpPerJob) {
  auto secrets = [](const Result& r) {
    std::set<std::string> s;
    for (const auto& l : lines(r.out)) s.insert(l.substr(l.find(' ') + 1));
    return s;
  };
  const std::vector<std::string> args{"-n", "2", "sh", "-c", "echo $COLLIE_JOB_SECRET"};
  auto a = run(args), b = run(args);
  ASSERT_EQ(a.status, 0) << a.err;
  ASSERT_EQ(secrets(a).size(), 1u) << "every rank of a job shares one secret: " << a.out;
  ASSERT_EQ(secrets(b).size(), 1u) << b.out;
  std::string secret = *secrets(a).begin();
  EXPECT_EQ(secret.size(), 32u) << secret;
  EXPECT_EQ(secret.find_first_not_of("0123456789abcdef"), std::string::npos) << secret;
  EXPECT_NE(secret, *secrets(b).begin()) << "two jobs must not share a made-up secret";

  auto c = run(args, {"COLLIE_JOB_SECRET=given-by-user"});
  EXPECT_EQ(secrets(c), (std::set<std::string>{"given-by-user"})) << c.out << c.err;
}

TEST_F(Launcher, SecondNodeRanksContinueTheNumbering) {
  const std::vector<std::string> args{
      "-n",
      "2",
      "--nnodes",
      "2",
      "--node-rank",
      "1",
      "--master-addr",
      "127.0.0.1",
      "--master-port",
      "12345",
      "sh",
      "-c",
      "echo $RANK $WORLD_SIZE $LOCAL_RANK $GROUP_RANK $COLLIE_NNODES $COLLIE_MASTER_PORT "
      "$MASTER_PORT ${COLLIE_STORE_FD:-nofd}"};
  // Every node's launcher must share one secret; one made up per node could
  // never work, so the launcher refuses instead.
  auto r = run(args);
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(contains(r.err, "COLLIE_JOB_SECRET")) << r.err;

  r = run(args, {"COLLIE_JOB_SECRET=shared"});
  ASSERT_EQ(r.status, 0) << r.err;
  auto out = lines(r.out);
  std::set<std::string> got(out.begin(), out.end());
  EXPECT_EQ(got, (std::set<std::string>{"[2] 2 4 0 1 2 12345 12346 nofd",
                                        "[3] 3 4 1 1 2 12345 12346 nofd"}));
}

TEST_F(Launcher, NodeZeroOfSeveralSaysWhichPortItPicked) {
  auto r = run({"-n", "1", "--nnodes", "2", "sh", "-c", "echo $COLLIE_MASTER_PORT $MASTER_PORT"},
               {"COLLIE_JOB_SECRET=shared"});
  ASSERT_EQ(r.status, 0) << r.err;
  ASSERT_EQ(lines(r.out).size(), 1u) << r.out;
  std::istringstream in(lines(r.out)[0].substr(4));  // after "[0] "
  int port = 0, torch_port = 0;
  in >> port >> torch_port;
  EXPECT_TRUE(contains(r.err, "--master-port " + std::to_string(port))) << r.err;
  EXPECT_EQ(torch_port, port + 1) << "every node computes torch's port from the one given";
}

TEST_F(Launcher, TheLauncherServesTheStoreAndNoRankHoldsASocket) {
  // Every rank counts the sockets it holds and looks for the descriptor the
  // launcher's parent leaked (kLeakedFd); each finds a socket in LISTEN
  // state (0A) on COLLIE_MASTER_PORT that none of them holds: collie-run's.
  static_assert(kLeakedFd == 9);
  const std::string prog = R"sh(
    n=0
    for f in /proc/$$/fd/*; do case $(readlink $f) in socket:*) n=$((n+1));; esac; done
    echo sockets $n launcher-store ${COLLIE_LAUNCHER_STORE:-unset} ${COLLIE_STORE_FD:-nofd}
    [ -e /proc/$$/fd/9 ] && echo leaked
    awk -v p=":$(printf %04X $COLLIE_MASTER_PORT)" \
      '$4 == "0A" && substr($2, length($2) - 4) == p {print "listening on the port"}' \
      /proc/net/tcp /proc/net/tcp6)sh";
  auto r = run({"-n", "3", "sh", "-c", prog});
  ASSERT_EQ(r.status, 0) << r.err;
  auto out = lines(r.out);
  std::multiset<std::string> got(out.begin(), out.end());
  EXPECT_EQ(got, (std::multiset<std::string>{
                     "[0] sockets 0 launcher-store 1 nofd", "[0] listening on the port",
                     "[1] sockets 0 launcher-store 1 nofd", "[1] listening on the port",
                     "[2] sockets 0 launcher-store 1 nofd", "[2] listening on the port"}))
      << r.out << r.err;
}

// A script for `sh -c` in which rank 1 does `fate` (ends) and the other
// ranks print "survived <rank>" only once collie-run has seen rank 1 end:
// rank 1 leaves its pid in $T/pid.1, and a pid that no longer answers
// `kill -0` has been reaped (a zombie still answers).
std::string others_outlive_rank_1(const std::string& fate) {
  return "if [ $RANK = 1 ]; then echo $$ > $T/pid.tmp && mv $T/pid.tmp $T/pid.1; " + fate +
         "; fi; while [ ! -e $T/pid.1 ]; do sleep 0.01; done; "
         "while kill -0 $(cat $T/pid.1) 2>/dev/null; do sleep 0.01; done; echo survived $RANK";
}

// --keep-going: a rank that fails does not stop the others.
TEST_F(Launcher, KeepGoingLetsTheOthersFinishAfterARankIsKilled) {
  auto r = run({"--keep-going", "-n", "3", "sh", "-c", others_outlive_rank_1("kill -9 $$")});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "[0] survived 0")) << r.out;
  EXPECT_TRUE(contains(r.out, "[2] survived 2")) << r.out;
  EXPECT_TRUE(contains(r.err,
                       "rank 1 was killed by signal SIGKILL; --keep-going: the other "
                       "ranks go on"))
      << r.err;
  EXPECT_TRUE(contains(r.err, "rank 1 was lost: was killed by signal SIGKILL")) << r.err;
  EXPECT_TRUE(contains(r.err, "rank 0 finished: exited with status 0")) << r.err;
  EXPECT_FALSE(contains(r.err, "the job failed")) << r.err;
}

TEST_F(Launcher, KeepGoingFailsTheJobWhenARankExitsNonZeroOrNoneFinishes) {
  auto r = run({"--keep-going", "-n", "3", "sh", "-c", others_outlive_rank_1("exit 3")});
  EXPECT_EQ(r.status, 3) << r.err;
  EXPECT_TRUE(contains(r.out, "[0] survived 0")) << r.out;
  EXPECT_TRUE(contains(r.out, "[2] survived 2")) << r.out;
  EXPECT_TRUE(contains(r.err, "rank 1 failed: exited with status 3")) << r.err;
  r = run({"--keep-going", "-n", "2", "sh", "-c", "kill -9 $$"});
  EXPECT_EQ(r.status, 128 + SIGKILL) << r.err;
  r = run({"--keep-going", "--max-restarts", "1", "-n", "2", "true"});
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(contains(r.err, "give one")) << r.err;
}

TEST_F(Launcher, AFailingRankEndsTheJobWithItsStatus) {
  auto r =
      run({"-n", "3", "sh", "-c", "if [ $RANK = 1 ]; then exit 3; fi; sleep 60; echo survived"});
  EXPECT_EQ(r.status, 3);
  EXPECT_FALSE(contains(r.out, "survived")) << r.out;
  EXPECT_TRUE(contains(r.err, "collie-run: rank 1 exited with status 3")) << r.err;
}

TEST_F(Launcher, TheFirstFailureDecidesTheExitStatus) {
  // Rank 2 fails only after rank 0's failure has stopped the job: its
  // status (5) is a consequence, and rank 0's (7) is what the job reports.
  auto r = run({"-n", "3", "sh", "-c",
                "case $RANK in "
                "  0) while [ ! -e $T/ready.2 ]; do sleep 0.01; done; exit 7;; "
                "  2) trap 'exit 5' TERM; touch $T/ready.2;; "
                "esac; sleep 60 & wait; echo survived"});
  EXPECT_EQ(r.status, 7) << r.err;
  EXPECT_FALSE(contains(r.out, "survived")) << r.out;
  EXPECT_TRUE(contains(r.err, "rank 0 exited with status 7")) << r.err;
  EXPECT_FALSE(contains(r.err, "rank 2 exited")) << r.err;
}

// As torchrun's failure summary: the first rank to fail, how it ended, and
// its last lines (ten), even with other ranks' output around them.
TEST_F(Launcher, TheSummaryNamesTheRootCauseAndItsLastLines) {
  auto r = run({"-n", "3", "sh", "-c",
                "if [ $RANK = 1 ]; then for i in $(seq 1 12); do echo \"line $i\"; done; "
                "echo 'the real error' >&2; exit 3; fi; echo \"rank $RANK busy\"; sleep 60"});
  EXPECT_EQ(r.status, 3);
  std::string s = summary(r.err);
  EXPECT_TRUE(contains(s, "root cause: rank 1 (pid ")) << r.err;
  EXPECT_TRUE(contains(s, "the first to fail, exited with status 3")) << s;
  EXPECT_TRUE(contains(s, "[1] the real error")) << s;
  EXPECT_TRUE(contains(s, "[1] line 12")) << s;
  EXPECT_TRUE(contains(s, "[1] line 4")) << s;
  EXPECT_FALSE(contains(s, "[1] line 3\n")) << s;  // the last ten lines only
  EXPECT_TRUE(contains(s, "rank 0, stopped by collie-run")) << s;
  EXPECT_TRUE(contains(s, "rank 2, stopped by collie-run")) << s;
}

// A rank killed by a signal says nothing itself: the summary still shows
// what it printed last.
TEST_F(Launcher, AKilledRanksLastWordsAreInTheSummary) {
  auto r = run({"-n", "2", "sh", "-c",
                "if [ $RANK = 1 ]; then echo 'about to run out of memory' >&2; kill -9 $$; fi; "
                "sleep 60"});
  EXPECT_EQ(r.status, 128 + SIGKILL);
  std::string s = summary(r.err);
  EXPECT_TRUE(contains(s, "root cause: rank 1")) << r.err;
  EXPECT_TRUE(contains(s, "was killed by signal SIGKILL")) << s;
  EXPECT_TRUE(contains(s, "[1] about to run out of memory")) << s;
}

// The other ranks' own errors are kept: a collie rank notices a dead peer a
// moment later and says so (peer_lost, naming it) before it exits; stopping
// it at once used to cut that off.
TEST_F(Launcher, OtherRanksOwnErrorsAreKeptNotCutOff) {
  // Rank 0 speaks once collie-run has seen rank 1 end (others_outlive_rank_1's
  // signal), not after a sleep that hoped to come after it.
  auto r = run({"-n", "3", "sh", "-c",
                "case $RANK in "
                "  1) echo $$ > $T/pid.tmp && mv $T/pid.tmp $T/pid.1; exit 1;; "
                "  0) while [ ! -e $T/pid.1 ]; do sleep 0.01; done; "
                "     while kill -0 $(cat $T/pid.1) 2>/dev/null; do sleep 0.01; done; "
                "     echo 'rank 0: lost rank 1 (its connection closed)' >&2; exit 2;; "
                "esac; sleep 60"});
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_TRUE(contains(r.err, "[0] rank 0: lost rank 1 (its connection closed)")) << r.err;
  std::string s = summary(r.err);
  EXPECT_TRUE(contains(s, "root cause: rank 1")) << s;
  EXPECT_TRUE(contains(s, "rank 0 failed on its own")) << s;
  EXPECT_TRUE(contains(s, "rank 2, stopped by collie-run")) << s;
}

// --log-dir keeps each rank's whole output, both streams, without prefixes.
TEST_F(Launcher, LogDirKeepsEachRanksWholeOutput) {
  auto logs = dir_ / "logs" / "run1";
  auto r = run({"-n", "2", "--log-dir", logs.string(), "sh", "-c",
                "echo \"out of $RANK\"; echo \"err of $RANK\" >&2; printf 'no newline'"});
  EXPECT_EQ(r.status, 0) << r.err;
  for (int q = 0; q < 2; ++q) {
    std::ifstream f(logs / ("rank." + std::to_string(q) + ".log"));
    std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    EXPECT_TRUE(contains(text, "out of " + std::to_string(q) + "\n")) << text;
    EXPECT_TRUE(contains(text, "err of " + std::to_string(q) + "\n")) << text;
    EXPECT_TRUE(contains(text, "no newline")) << text;
    EXPECT_FALSE(contains(text, "[" + std::to_string(q) + "]")) << text;
  }
  EXPECT_TRUE(contains(r.out, "[1] out of 1")) << r.out;  // the console still has it
}

TEST_F(Launcher, ARankIgnoringSigtermIsKilledAfterTheGracePeriod) {
  // Rank 1 fails once rank 0 ignores SIGTERM, so only SIGKILL can end rank 0
  // (an ignored signal stays ignored across exec: `sleep` ignores it too).
  const std::string prog =
      "trap '' TERM; touch $T/ready.$RANK; "
      "if [ $RANK = 1 ]; then while [ ! -e $T/ready.0 ]; do sleep 0.01; done; exit 4; fi; "
      "sleep 60; echo survived";
  auto r = run({"-n", "2", "--grace-seconds", "1", "sh", "-c", prog});
  EXPECT_EQ(r.status, 4);
  EXPECT_FALSE(contains(r.out, "survived")) << r.out;

  reset_dir();
  r = run({"-n", "2", "sh", "-c", prog}, {"COLLIE_RUN_GRACE=0"});
  EXPECT_EQ(r.status, 4);
  EXPECT_FALSE(contains(r.out, "survived")) << r.out;
}

// A stopped rank (SIGSTOP here; a debugger gone, a rank stalled by the
// kernel) holds SIGTERM pending until it is continued: collie-run follows
// SIGTERM with SIGCONT, so it ends by SIGTERM at once, not by SIGKILL after
// the grace period (60 s here; it was 5 s by default, and a stalled rank's
// job ended that long after its error). Rank 1 fails once rank 0's state is
// T in /proc.
TEST_F(Launcher, AStoppedRankEndsBySigtermNotAtTheGracePeriod) {
  const std::string prog =
      "if [ $RANK = 0 ]; then echo $$ > $T/pid.tmp; mv $T/pid.tmp $T/pid; kill -STOP $$; "
      "echo continued; sleep 60; fi; "
      "while [ ! -e $T/pid ]; do sleep 0.01; done; "
      "while ! grep -q ') T ' /proc/$(cat $T/pid)/stat; do sleep 0.01; done; exit 4";
  auto r = run({"-n", "2", "--grace-seconds", "60", "sh", "-c", prog});
  EXPECT_EQ(r.status, 4) << r.err;
  EXPECT_TRUE(contains(r.err, "rank 0, stopped by collie-run: was killed by signal SIGTERM"))
      << r.err;
}

TEST_F(Launcher, ElasticWithoutReplacementsLeftSaysSoNotThatARoundCouldNotStart) {
  // Rank 1 dies at step 2, once the world has formed; its replacement
  // (--max-restarts 1) joins, takes the state and dies too: the job ends
  // with its status, and the summary counts the ranks started again (there
  // is no next round under --elastic to fail to start).
  const char* probe = std::getenv("ELASTIC_PROBE");
  if (!probe) GTEST_SKIP() << "ELASTIC_PROBE is not set";
  auto r = run({"-n", "2", "--elastic", "--max-restarts", "1", probe, "--steps", "1000000",
                "--kill-rank", "1", "--kill-at", "2", "--floats", "16", "--joiners-die", "1"});
  EXPECT_EQ(r.status, 128 + SIGKILL) << r.err;
  EXPECT_TRUE(contains(r.out, "[1] killed at step 2")) << r.out;
  EXPECT_TRUE(contains(r.out, "[1] joiner killed at step")) << r.out;
  EXPECT_TRUE(contains(r.err, "--elastic: starting it again (1 of 1)")) << r.err;
  EXPECT_TRUE(contains(r.err,
                       "collie-run: --elastic: no restarts left: 1 of 1 (1 ranks alone, 0 "
                       "rounds)"))
      << r.err;
  EXPECT_FALSE(contains(r.err, "could not start")) << r.err;
}

TEST_F(Launcher, ElasticStopsAReplacementNoGrowWillTakeAndStartsTheRoundAgain) {
  // Rank 1 dies once the others have done their work, while they are still
  // running: collie-run starts it again to join, but the others end and no
  // grow will take it. It used to wait out its deadline; now, once only
  // replacements run and one has queued untaken, it is stopped and the
  // round starts again (its second life ends well).
  const char* probe = std::getenv("ELASTIC_PROBE");
  if (!probe) GTEST_SKIP() << "ELASTIC_PROBE is not set";
  // --await-replacement: the others end only once the replacement has
  // started, so collie-run sees the loss while they run (without it, it
  // sometimes reaped them first: "lost after every other rank had ended").
  auto r =
      run({"-n", "3", "--elastic", "--max-restarts", "2", probe, "--steps", "5", "--floats", "16",
           "--lost-at-end", "1", "--sync-dir", dir_.string(), "--await-replacement", "1"},
          {"COLLIE_TIMEOUT=60"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "[1] lost as the others finish")) << r.out;
  EXPECT_TRUE(contains(r.err, "--elastic: starting it again (1 of 2)")) << r.err;
  EXPECT_TRUE(contains(r.err,
                       "--elastic: every other rank has ended and rank 1's replacement was "
                       "never taken"))
      << r.err;
  EXPECT_TRUE(contains(r.err, "restarting (attempt 1 of 2)")) << r.err;
  // Once in the first round (before rank 1 is lost) and once in the second.
  size_t done = 0;
  for (const auto& l : lines(r.out)) done += l == "[2] done: 5 steps, model exact, rank 2 of 3";
  EXPECT_EQ(done, 2u) << r.out;
}

TEST_F(Launcher, ElasticSparesTakeALostRanksPlaceAndTheUntakenAreStoppedAtTheEnd) {
  // --spares 1: a spare starts with the ranks and waits in its join. The
  // first spare dies before it joins (not a failure: another starts);
  // rank 1 dies at step 10 and a waiting spare takes its place (another
  // starts again); at the end the spare no grow took is stopped, and the
  // job ends well with every rank's model exact.
  const char* probe = std::getenv("ELASTIC_PROBE");
  if (!probe) GTEST_SKIP() << "ELASTIC_PROBE is not set";
  auto r = run({"-n", "3", "--elastic", "--max-restarts", "3", "--spares", "1", probe, "--steps",
                "40", "--kill-rank", "1", "--kill-at", "10", "--floats", "16", "--spares-die", "1"},
               {"COLLIE_TIMEOUT=60"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "[spare 0.0] spare killed before joining")) << r.out;
  EXPECT_TRUE(contains(r.err,
                       "collie-run: spare 0.0 was killed by signal SIGKILL before a grow "
                       "took it; --elastic: starting another ("))
      << r.err;
  EXPECT_TRUE(contains(r.out, "[1] killed at step 10")) << r.out;
  EXPECT_TRUE(contains(r.err,
                       "collie-run: rank 1 was killed by signal SIGKILL; --elastic: a "
                       "waiting spare takes its place, and another starts ("))
      << r.err;
  EXPECT_TRUE(contains(r.out, "[0] step 10 again with 3 ranks")) << r.out;
  // The spare taken: rank 2 of the grown communicator, its model exact.
  EXPECT_TRUE(contains(r.out, "joined as rank 2 of 3")) << r.out;
  size_t exact = 0;
  for (const auto& l : lines(r.out)) exact += contains(l, "done: 40 steps, model exact");
  EXPECT_EQ(exact, 3u) << r.out;
  EXPECT_FALSE(contains(r.err, "failed")) << r.err;

  // A rank lost as the others finish: the spare that would take its place
  // has no grow to join; the round starts again, as without spares, and
  // the spare started for the loss is given back: M=1 is enough.
  reset_dir();
  r = run({"-n", "3", "--elastic", "--max-restarts", "1", "--spares", "1", probe, "--steps", "5",
           "--floats", "16", "--lost-at-end", "1", "--sync-dir", dir_.string()},
          {"COLLIE_TIMEOUT=60"});
  EXPECT_EQ(r.status, 0) << r.err;
  // Which of the two words depends on whether the others had exited when
  // collie-run reaped rank 1 (they end once it has died).
  EXPECT_TRUE(
      contains(r.err, "--elastic: every other rank has ended and no spare took rank 1's place") ||
      contains(r.err, "--elastic: rank 1 was lost after every other rank had ended"))
      << r.err;
  EXPECT_TRUE(contains(r.err, "restarting (attempt 1 of 1)")) << r.err;
}

TEST_F(Launcher, SparesNeedElastic) {
  auto r = run({"-n", "2", "--spares", "1", "true"});
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "--spares K needs --elastic")) << r.err;
}

TEST_F(Launcher, ElasticStartsTheRoundAgainWhenAReplacementWouldHaveNoOneToJoin) {
  // These ranks never connect, so no world forms: the others would wait
  // for rank 1 in the rendezvous, and a replacement could not join. The
  // round starts again instead (one of --max-restarts), as without
  // --elastic, and then ends well. Rank 0 is still running then (it stays
  // until collie-run stops it).
  auto r =
      run({"-n", "2", "--elastic", "--max-restarts", "1", "sh", "-c",
           "if [ $COLLIE_RESTART_COUNT = 0 ]; then [ $RANK = 1 ] && exit 3; exec sleep 60; fi; "
           "echo life-$COLLIE_RESTART_COUNT join=${COLLIE_JOIN:-0}"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(contains(r.err,
                       "--elastic: rank 1 was lost before every rank was in the job's "
                       "world; starting the round again"))
      << r.err;
  EXPECT_TRUE(contains(r.err, "restarting (attempt 1 of 1)")) << r.err;
  EXPECT_TRUE(contains(r.out, "[0] life-1 join=0")) << r.out;
  EXPECT_TRUE(contains(r.out, "[1] life-1 join=0")) << r.out;

  // A rank lost once every other has ended: no one is left to grow by a
  // replacement (it would wait out its deadline). Rank 1 fails once rank 0
  // has exited (its process a zombie or gone).
  reset_dir();
  r = run({"-n", "2", "--elastic", "--max-restarts", "1", "sh", "-c",
           "if [ $COLLIE_RESTART_COUNT != 0 ]; then echo life-1; exit 0; fi; "
           "if [ $RANK = 0 ]; then echo $$ > $T/pid.tmp; mv $T/pid.tmp $T/pid; exit 0; fi; "
           "while [ ! -e $T/pid ]; do sleep 0.01; done; p=$(cat $T/pid); "
           "while [ -e /proc/$p ] && ! grep -q ') Z ' /proc/$p/stat; do sleep 0.01; done; exit 3"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(contains(r.err,
                       "--elastic: rank 1 was lost after every other rank had ended: no "
                       "one is left for a replacement to join; starting the round again"))
      << r.err;
  EXPECT_TRUE(contains(r.out, "[1] life-1")) << r.out;
}

TEST_F(Launcher, ARankKilledBySignalIsReportedAs128PlusSignal) {
  auto r = run({"-n", "2", "sh", "-c", "if [ $RANK = 0 ]; then kill -9 $$; fi; sleep 60"});
  EXPECT_EQ(r.status, 128 + SIGKILL);
  EXPECT_TRUE(contains(r.err, "rank 0 was killed by signal SIGKILL")) << r.err;
}

TEST_F(Launcher, SignalsAreForwardedToEveryRank) {
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) {
    reset_dir();
    const std::string prog = "trap 'echo got-signal; exit 0' " + std::to_string(sig) +
                             "; touch $T/ready.$RANK; while :; do sleep 0.05; done";
    auto r = run({"-n", "2", "sh", "-c", prog}, {}, [&](pid_t launcher_pid) {
      EXPECT_TRUE(eventually([&] { return all_ready(2); }));
      kill(launcher_pid, sig);
    });
    EXPECT_TRUE(contains(r.out, "[0] got-signal")) << sigabbrev_np(sig) << r.out << r.err;
    EXPECT_TRUE(contains(r.out, "[1] got-signal")) << sigabbrev_np(sig) << r.out << r.err;
    // The job was interrupted, not finished, even though every rank exited 0.
    EXPECT_EQ(r.status, 128 + sig) << sigabbrev_np(sig);
  }
}

TEST_F(Launcher, RanksDoNotOutliveAKilledLauncher) {
  std::vector<pid_t> pids;
  auto r =
      run({"-n", "2", "sh", "-c", "echo $$ > $T/pid.$RANK; touch $T/ready.$RANK; exec sleep 60"},
          {}, [&](pid_t launcher_pid) {
            EXPECT_TRUE(eventually([&] { return all_ready(2); }));
            for (int i = 0; i < 2; ++i) {
              pid_t p = 0;
              std::ifstream(dir_ / ("pid." + std::to_string(i))) >> p;
              pids.push_back(p);
            }
            kill(launcher_pid, SIGKILL);
          });
  EXPECT_EQ(r.status, 128 + SIGKILL);
  auto gone = [](pid_t p) {  // no such process, or a zombie its new parent has yet to reap
    std::ifstream stat("/proc/" + std::to_string(p) + "/stat");
    std::string pid, comm, state;
    return !(stat >> pid >> comm >> state) || state == "Z";
  };
  for (pid_t p : pids) {
    ASSERT_GT(p, 0);
    EXPECT_TRUE(eventually([&] { return gone(p); })) << "rank pid " << p << " outlived collie-run";
  }
}

TEST_F(Launcher, OutputKeepsStreamsAndWholeLines) {
  // Three ranks each write 200 lines of 3000 bytes to stdout at once: every
  // line must come out whole, with its own rank's prefix.
  auto r = run({"-n", "3", "sh", "-c",
                "line=$(printf \"%3000s\" \"\" | tr ' ' $RANK); "
                "i=0; while [ $i -lt 200 ]; do echo $line; i=$((i+1)); done; echo to-stderr >&2"});
  ASSERT_EQ(r.status, 0) << r.err;
  std::map<char, int> count;
  for (const auto& l : lines(r.out)) {
    ASSERT_EQ(l.size(), 4u + 3000u) << l.substr(0, 80);
    char rank = l[1];
    ASSERT_EQ(l.substr(0, 4), std::string("[") + rank + "] ");
    ASSERT_EQ(l.find_first_not_of(rank, 4), std::string::npos) << "a line mixes ranks";
    ++count[rank];
  }
  EXPECT_EQ(count, (std::map<char, int>{{'0', 200}, {'1', 200}, {'2', 200}}));
  auto err_lines = lines(r.err);
  std::multiset<std::string> err(err_lines.begin(), err_lines.end());
  EXPECT_EQ(err, (std::multiset<std::string>{"[0] to-stderr", "[1] to-stderr", "[2] to-stderr"}));
}

TEST_F(Launcher, PartialLastLineIsFlushedWithItsPrefix) {
  auto r = run({"-n", "1", "sh", "-c", "printf 'a\\nb'; printf 'c' >&2"});
  EXPECT_EQ(r.out, "[0] a\n[0] b\n");
  EXPECT_EQ(r.err, "[0] c\n");
}

TEST_F(Launcher, NoPrefixPassesOutputThrough) {
  auto r = run({"-n", "2", "--no-prefix", "sh", "-c", "printf \"r$RANK\"; printf e >&2"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(r.out == "r0r1" || r.out == "r1r0") << r.out;
  EXPECT_EQ(r.err, "ee");
}

// Several ranks on one host share its CPUs: each gets OMP_NUM_THREADS =
// CPUs / ranks (at least 1), which OpenMP and OpenBLAS read, unless the user
// set it (or OPENBLAS_NUM_THREADS).
TEST_F(Launcher, RanksShareTheHostsCpusUnlessTheUserChose) {
  if (std::getenv("OMP_NUM_THREADS") || std::getenv("OPENBLAS_NUM_THREADS"))
    GTEST_SKIP() << "the environment already chooses OMP_NUM_THREADS";
  int want = std::max(1, collie::topology::usable_cpus() / 2);
  auto r = run({"-n", "2", "sh", "-c", "echo t=$OMP_NUM_THREADS"});
  ASSERT_EQ(r.status, 0) << r.err;
  auto got = lines(r.out);
  std::multiset<std::string> all(got.begin(), got.end());
  std::string t = "t=" + std::to_string(want);
  EXPECT_EQ(all, (std::multiset<std::string>{"[0] " + t, "[1] " + t})) << r.out;
  r = run({"-n", "2", "sh", "-c", "echo t=$OMP_NUM_THREADS"}, {"OMP_NUM_THREADS=3"});
  got = lines(r.out);
  all = std::multiset<std::string>(got.begin(), got.end());
  EXPECT_EQ(all, (std::multiset<std::string>{"[0] t=3", "[1] t=3"})) << r.out;
  r = run({"-n", "1", "sh", "-c", "echo t=$OMP_NUM_THREADS"});
  EXPECT_EQ(r.out, "[0] t=\n") << "one rank keeps the whole host";
}

TEST_F(Launcher, AProgramThatCannotRunFailsItsRank) {
  // Whichever rank fails first stops the other, perhaps before it says why.
  auto r = run({"-n", "2", "/nonexistent/program"});
  EXPECT_EQ(r.status, 127);
  const std::string why = ": cannot run '/nonexistent/program': No such file or directory";
  EXPECT_TRUE(contains(r.err, "collie-run: rank 0" + why) ||
              contains(r.err, "collie-run: rank 1" + why))
      << r.err;
  EXPECT_TRUE(contains(r.err, "exited with status 127")) << r.err;
}

TEST_F(Launcher, BadUsageSaysWhatToChange) {
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  const std::vector<Case> cases{
      {{"sh", "-c", "true"}, "-n N is required"},
      {{"-n", "abc", "true"}, "'abc'"},
      {{"-n", "0", "true"}, "-n takes a whole number in 1.."},
      {{"-n", "2"}, "no program given"},
      {{"-n", "2", "--frobnicate", "true"}, "unknown option '--frobnicate'"},
      {{"-n", "2", "--master-port", "http", "true"}, "--master-port takes a whole number"},
      {{"-n", "2", "--nnodes", "2", "--node-rank", "2", "true"},
       "--node-rank 2 must be below --nnodes 2"},
      {{"-n", "2", "--nnodes", "2", "--node-rank", "1", "true"},
       "needs --master-addr and --master-port"},
      {{"-n", "2", "--grace-seconds"}, "--grace-seconds needs a value"},
      {{"-n", "2", "--max-restarts", "-1", "true"}, "--max-restarts takes a whole number in 0.."},
      {{"-n", "2", "--elastic", "true"}, "--elastic needs --max-restarts M"},
  };
  for (const auto& c : cases) {
    auto r = run(c.args);
    EXPECT_EQ(r.status, 2) << c.says;
    EXPECT_TRUE(contains(r.err, c.says)) << r.err;
    EXPECT_TRUE(contains(r.err, "usage: collie-run")) << r.err;
  }
  auto h = run({"--help"});
  EXPECT_EQ(h.status, 0);
  EXPECT_TRUE(contains(h.out, "usage: collie-run")) << h.out;
}

TEST_F(Launcher, BusyMasterPortIsNamed) {
  auto busy = collie::net::listen_tcp("", 0, "squatter");
  std::string port = std::to_string(collie::net::local_port(busy.get()));
  auto r = run({"-n", "1", "--master-port", port, "sh", "-c", "echo ran"});
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out, "") << "no rank may start";
  EXPECT_TRUE(contains(r.err, "collie-run: port " + port +
                                  " is already in use; pass another --master-port or omit it"))
      << r.err;
}

TEST_F(Launcher, TorchDistributedCanServeItsStoreOnMasterPort) {
  // torch.distributed.init_process_group("gloo") under collie-run: its rank 0
  // binds MASTER_PORT while collie's store still listens on its own port.
  // When the two were one port, torch failed with "Address already in use".
  const std::string prog = R"sh(
    if [ "$RANK" = 0 ]; then
      python3 -c 'import os, socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])))
s.listen()
print("bound MASTER_PORT")'
    fi)sh";
  auto r = run({"-n", "2", "sh", "-c", prog});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(lines(r.out), std::vector<std::string>{"[0] bound MASTER_PORT"}) << r.err;
}

}  // namespace
