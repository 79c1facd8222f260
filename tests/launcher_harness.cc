// tests/launcher_harness.cc: see launcher_harness.h.
#include "launcher_harness.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <sstream>
#include <thread>

#include "comm/net/socket.h"

namespace launcher_test {

std::string launcher() {
  const char* p = std::getenv("COLLIE_RUN");
  return p ? p : "";
}

Result run(const std::vector<std::string>& args, const std::vector<std::string>& env,
           const std::function<void(pid_t)>& while_running) {
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

int free_port() {
  auto fd = collie::net::listen_tcp("127.0.0.1", 0, "test");
  return collie::net::local_port(fd.get());
}

std::string summary(const std::string& err) {
  auto at = err.find("---- the job failed ----");
  return at == std::string::npos ? "" : err.substr(at);
}

}  // namespace launcher_test
