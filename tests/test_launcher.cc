// tests/test_launcher.cc: collie-run as users run it: a real subprocess
// launching small shell programs as ranks, its output and exit status
// captured. COLLIE_RUN names the binary; without it the tests skip.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
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

namespace {

struct Result {
  int status = -1;  // exit code, or 128 + signal
  std::string out, err;
};

std::string launcher() {
  const char* p = std::getenv("COLLIE_RUN");
  return p ? p : "";
}

// The launcher's parent leaks this descriptor to it (many test runners and
// shells do); ranks must not see it.
constexpr int kLeakedFd = 9;

// Runs collie-run with `args` and the extra `env` ("K=V"); `while_running`
// gets the launcher's pid while its output is being collected.
Result run(const std::vector<std::string>& args, const std::vector<std::string>& env = {},
           const std::function<void(pid_t)>& while_running = nullptr) {
  int out[2], err[2];
  EXPECT_EQ(pipe2(out, O_CLOEXEC), 0);
  EXPECT_EQ(pipe2(err, O_CLOEXEC), 0);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], 1);
    dup2(err[1], 2);
    int null = open("/dev/null", O_RDONLY);
    dup2(null, 0);
    dup2(null, kLeakedFd);
    // Start from default dispositions whatever this test was started under:
    // under nohup SIGHUP is ignored, and a shell cannot trap a signal that
    // was ignored when it started, so the ranks never saw the forwarded one.
    for (int sig : {SIGHUP, SIGINT, SIGTERM}) signal(sig, SIG_DFL);
    for (const auto& kv : env) putenv(const_cast<char*>(kv.c_str()));
    std::vector<std::string> all{launcher()};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& s : all) argv.push_back(s.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(126);
  }
  close(out[1]);
  close(err[1]);
  Result r;
  auto drain = [](int fd, std::string& into) {
    char buf[4096];
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0) into.append(buf, static_cast<size_t>(n));
    close(fd);
  };
  std::thread t_out([&] { drain(out[0], r.out); });
  std::thread t_err([&] { drain(err[0], r.err); });
  if (while_running) while_running(pid);
  t_out.join();
  t_err.join();
  int status = 0;
  waitpid(pid, &status, 0);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> v;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) v.push_back(l);
  return v;
}

// Polls `cond` every 10 ms for up to 20 s; a bound on waiting, not a timing assertion.
bool eventually(const std::function<bool()>& cond) {
  for (int i = 0; i < 2000; ++i) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return cond();
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// A port free on this host now (the kernel's pick, given back at once).
int free_port() {
  auto fd = collie::net::listen_tcp("127.0.0.1", 0, "test");
  return collie::net::local_port(fd.get());
}

class Launcher : public ::testing::Test {
 protected:
  void SetUp() override {
    if (launcher().empty()) GTEST_SKIP() << "COLLIE_RUN is not set";
    dir_ = std::filesystem::temp_directory_path() /
           ("collie-launcher-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    // Ranks find it as $T; the launcher passes the environment on.
    setenv("T", dir_.c_str(), 1);
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
    unsetenv("T");
  }
  // Ranks touch $T/ready.$RANK once they are ready for what the test does next.
  bool all_ready(int n) const {
    for (int r = 0; r < n; ++r)
      if (!std::filesystem::exists(dir_ / ("ready." + std::to_string(r)))) return false;
    return true;
  }
  void reset_dir() const {
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }

  std::filesystem::path dir_;
};

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

// The part of stderr from collie-run's failure summary on.
std::string summary(const std::string& err) {
  auto at = err.find("---- the job failed ----");
  return at == std::string::npos ? "" : err.substr(at);
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
  auto r = run({"-n", "3", "sh", "-c",
                "case $RANK in "
                "  1) exit 1;; "
                "  0) sleep 0.3; echo 'rank 0: lost rank 1 (its connection closed)' >&2; exit 2;; "
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

}  // namespace

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
