// tests/test_launcher.cc: collie-run as users run it: a real subprocess
// launching small shell programs as ranks. COLLIE_RUN names the binary.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "comm/tcp/socket.h"

namespace {

struct Result {
  int status = -1;  // exit code, or 128 + signal
  std::string out, err;
};

std::string launcher() {
  const char* p = std::getenv("COLLIE_RUN");
  return p ? p : "";
}

// Runs collie-run with `args`; optionally sends `sig` to it once
// `ready()` holds (checked every 10 ms, for at most 20 s).
Result run(const std::vector<std::string>& args, int sig = 0,
           const std::function<bool()>& ready = nullptr) {
  int out[2], err[2];
  EXPECT_EQ(pipe(out), 0);
  EXPECT_EQ(pipe(err), 0);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], 1);
    dup2(err[1], 2);
    close(out[0]);
    close(err[0]);
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
  if (sig) {
    for (int i = 0; i < 2000 && ready && !ready(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    kill(pid, sig);
  }
  Result r;
  auto drain = [](int fd, std::string& into) {
    char buf[4096];
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0) into.append(buf, static_cast<size_t>(n));
    close(fd);
  };
  std::thread t([&] { drain(err[0], r.err); });
  drain(out[0], r.out);
  t.join();
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

class Launcher : public ::testing::Test {
 protected:
  void SetUp() override {
    if (launcher().empty()) GTEST_SKIP() << "COLLIE_RUN is not set";
  }
};

TEST_F(Launcher, EveryRankGetsItsVariablesAndAPrefix) {
  auto r = run({"-n", "3", "sh", "-c",
                "echo \"$COLLIE_RANK $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_PORT "
                "$COLLIE_MASTER_PORT ${#COLLIE_JOB_SECRET}\""});
  ASSERT_EQ(r.status, 0) << r.err;
  std::set<std::string> ranks;
  std::string port;
  for (const auto& l : lines(r.out)) {
    std::istringstream in(l);
    std::string prefix, crank, rank, world, local, local_world, mport, cport, secret_len;
    in >> prefix >> crank >> rank >> world >> local >> local_world >> mport >> cport >> secret_len;
    EXPECT_EQ(prefix, "[" + rank + "]") << l;
    EXPECT_EQ(crank, rank);
    EXPECT_EQ(local, rank);
    EXPECT_EQ(world, "3");
    EXPECT_EQ(local_world, "3");
    EXPECT_EQ(mport, cport);
    EXPECT_NE(mport, "0");
    EXPECT_EQ(secret_len, "32");
    if (port.empty()) port = mport;
    EXPECT_EQ(mport, port) << "every rank must see the same port";
    ranks.insert(rank);
  }
  EXPECT_EQ(ranks, (std::set<std::string>{"0", "1", "2"}));
}

TEST_F(Launcher, SecondNodeRanksContinueTheNumbering) {
  auto r = run({"-n", "2", "--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1",
                "--master-port", "12345", "sh", "-c",
                "echo $RANK $WORLD_SIZE $LOCAL_RANK $GROUP_RANK $MASTER_PORT"});
  // Multi-node jobs need a shared secret; without one the launcher refuses.
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("COLLIE_JOB_SECRET"), std::string::npos) << r.err;
  setenv("COLLIE_JOB_SECRET", "shared", 1);
  r = run({"-n", "2", "--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1",
           "--master-port", "12345", "sh", "-c",
           "echo $RANK $WORLD_SIZE $LOCAL_RANK $GROUP_RANK $MASTER_PORT $COLLIE_JOB_SECRET"});
  unsetenv("COLLIE_JOB_SECRET");
  ASSERT_EQ(r.status, 0) << r.err;
  std::set<std::string> got;
  for (const auto& l : lines(r.out)) got.insert(l);
  EXPECT_EQ(got, (std::set<std::string>{"[2] 2 4 0 1 12345 shared", "[3] 3 4 1 1 12345 shared"}));
}

TEST_F(Launcher, OnlyRankZeroGetsTheListeningStoreSocket) {
  auto r = run({"-n", "2", "sh", "-c",
                "if [ -n \"$COLLIE_STORE_FD\" ]; then "
                "  readlink /proc/self/fd/$COLLIE_STORE_FD | cut -c1-7; "
                "  grep -c \":$(printf '%04X' $MASTER_PORT) 00000000:0000 0A\" /proc/net/tcp /proc/net/tcp6 | "
                "  awk -F: '{s+=$2} END {print \"listening\", s}'; "
                "else echo none; fi"});
  ASSERT_EQ(r.status, 0) << r.err;
  std::multiset<std::string> got;
  for (const auto& l : lines(r.out)) got.insert(l);
  EXPECT_EQ(got, (std::multiset<std::string>{"[0] socket:", "[0] listening 1", "[1] none"}));
}

TEST_F(Launcher, AFailingRankEndsTheJobWithItsStatus) {
  auto r = run({"-n", "3", "--grace-seconds", "2", "sh", "-c",
                "if [ $RANK = 1 ]; then exit 3; fi; sleep 30; echo survived"});
  EXPECT_EQ(r.status, 3);
  EXPECT_EQ(r.out.find("survived"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("rank 1 exited with status 3"), std::string::npos) << r.err;
}

TEST_F(Launcher, ARankKilledBySignalIsReportedAs128PlusSignal) {
  auto r = run({"-n", "2", "sh", "-c", "if [ $RANK = 0 ]; then kill -9 $$; fi; sleep 30"});
  EXPECT_EQ(r.status, 128 + SIGKILL);
  EXPECT_NE(r.err.find("SIGKILL"), std::string::npos) << r.err;
}

TEST_F(Launcher, SigtermIsForwardedToEveryRank) {
  // Each rank marks a file once its handler is in place; the signal goes to
  // the launcher only after both marks exist.
  std::string dir = "/tmp/collie-launcher-" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  auto r = run({"-n", "2", "sh", "-c",
                "trap 'echo got-term; exit 0' TERM; touch " + dir +
                    "/ready.$RANK; while :; do sleep 0.05; done"},
               SIGTERM, [&] {
                 return std::filesystem::exists(dir + "/ready.0") &&
                        std::filesystem::exists(dir + "/ready.1");
               });
  std::filesystem::remove_all(dir);
  EXPECT_NE(r.out.find("[0] got-term"), std::string::npos) << r.out << r.err;
  EXPECT_NE(r.out.find("[1] got-term"), std::string::npos) << r.out << r.err;
}

TEST_F(Launcher, PartialLastLineIsFlushedWithItsPrefix) {
  auto r = run({"-n", "1", "sh", "-c", "printf 'a\\nb'"});
  EXPECT_EQ(r.out, "[0] a\n[0] b\n");
}

TEST_F(Launcher, BadUsageSaysWhatToChange) {
  auto r = run({"sh", "-c", "true"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("-n N is required"), std::string::npos) << r.err;
  r = run({"-n", "abc", "true"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("'abc'"), std::string::npos) << r.err;
  r = run({"-n", "2"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("no program"), std::string::npos) << r.err;
  r = run({"-n", "2", "--nnodes", "2", "--node-rank", "2", "true"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("--node-rank 2 must be below --nnodes 2"), std::string::npos) << r.err;
  r = run({"-n", "1", "/nonexistent/program"});
  EXPECT_EQ(r.status, 127);
  EXPECT_NE(r.err.find("cannot run '/nonexistent/program'"), std::string::npos) << r.err;
}

TEST_F(Launcher, BusyMasterPortIsNamed) {
  auto busy = collie::net::listen_tcp("", 0, "squatter");
  int port = collie::net::local_port(busy.get());
  auto r = run({"-n", "1", "--master-port", std::to_string(port), "true"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("already in use"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(std::to_string(port)), std::string::npos) << r.err;
}

}  // namespace
