// tests/faults_harness.cc: see faults_harness.h.
#include "faults_harness.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <stdexcept>
#include <thread>
#include <utility>

#include "comm/net/socket.h"

namespace collie::faults {

namespace {

// Each rank's end, as a signal the other ranks can wait for: rank r's
// process alone holds the write end of the pipe whose read end is
// g_exits[r], so reading that to its end returns once r has ended, however
// it ended. (Replaces sleeps that guessed how long a peer would take.)
std::vector<int> g_exits;

}  // namespace

void wait_for_exit_of(int r) {
  char c;
  for (;;) {
    const ssize_t k = ::read(g_exits.at(r), &c, 1);
    if (k == 0 || (k < 0 && errno != EINTR)) return;
  }
}

[[noreturn]] void stall_until_killed() {
  for (;;) pause();
}

std::vector<Outcome> run_ranks(int n, RankFn fn, std::chrono::milliseconds timeout,
                               std::vector<int> skip, std::chrono::seconds limit,
                               std::vector<int> linger) {
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

}  // namespace collie::faults
