// tests/test_store.cc: the rendezvous stores. Semantics against known
// answers, then the multi-process parts with real processes: forked clients
// (the server lives in a forked process too, so that the test process stays
// single-threaded when it forks), concurrent adds, a blocking get answered by
// another process, refused secrets and strays, a server that dies.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "collie/store.h"
#include "comm/tcp/socket.h"

namespace collie {
namespace {

using namespace std::chrono_literals;

const std::string kSecret = "store-test-secret";

// A store server in its own process, on a port chosen by the kernel.
struct ServerProcess {
  pid_t pid = -1;
  int port = 0;

  ServerProcess() {
    net::Fd listener = net::listen_tcp("127.0.0.1", 0, "test");
    port = net::local_port(listener.get());
    pid = fork();
    if (pid == 0) {
      auto server = TcpStoreServer::start(0, kSecret, listener.release());
      pause();  // until killed
      _exit(0);
    }
  }
  ~ServerProcess() { stop(); }
  void stop() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      pid = -1;
    }
  }
};

// Runs fn in a child process; returns its exit code (0: all expectations met).
pid_t spawn(const std::function<int()>& fn) {
  pid_t pid = fork();
  if (pid == 0) _exit(fn());
  return pid;
}
int join(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
}

std::unique_ptr<TcpStore> client(int port, const std::string& secret = kSecret,
                                 std::chrono::milliseconds timeout = 5s) {
  return TcpStore::connect("127.0.0.1", port, secret, timeout, "test client");
}

std::string error_of(const std::function<void()>& fn, ErrorCode* code = nullptr) {
  try {
    fn();
  } catch (const Error& e) {
    if (code) *code = e.code();
    return e.what();
  }
  return "";
}

// The semantics every store shares, checked on any implementation.
void check_semantics(Store& s) {
  s.set("a", to_bytes("1"));
  EXPECT_EQ(to_string(s.get("a")), "1");
  s.set("a", to_bytes("two"));
  EXPECT_EQ(to_string(s.get("a")), "two");
  EXPECT_EQ(s.add("n", 5), 5);
  EXPECT_EQ(s.add("n", -2), 3);
  EXPECT_TRUE(s.check({"a", "n"}));
  EXPECT_FALSE(s.check({"a", "missing"}));
  // compare_set: empty expected matches a missing key; a wrong expected
  // leaves the value and returns it.
  EXPECT_EQ(to_string(s.compare_set("lock", {}, to_bytes("me"))), "me");
  EXPECT_EQ(to_string(s.compare_set("lock", {}, to_bytes("you"))), "me");
  EXPECT_EQ(to_string(s.compare_set("lock", to_bytes("me"), to_bytes("you"))), "you");
  EXPECT_TRUE(s.remove("lock"));
  EXPECT_FALSE(s.remove("lock"));
  EXPECT_FALSE(s.check({"lock"}));
  ErrorCode code{};
  std::string msg = error_of([&] { s.add("a", 1); }, &code);
  EXPECT_EQ(code, ErrorCode::invalid_argument) << msg;
  msg = error_of([&] { s.get("never-set", 100ms); }, &code);
  EXPECT_EQ(code, ErrorCode::timeout) << msg;
  EXPECT_NE(msg.find("never-set"), std::string::npos) << msg;
  msg = error_of([&] { s.wait({"a", "also-never"}, 100ms); }, &code);
  EXPECT_EQ(code, ErrorCode::timeout);
  EXPECT_NE(msg.find("also-never"), std::string::npos) << msg;
  // Binary values survive.
  Bytes bin{0, 255, 10, 0, 13};
  s.set("bin", bin);
  EXPECT_EQ(s.get("bin"), bin);
  PrefixStore p(std::shared_ptr<Store>(&s, [](Store*) {}), "job7/");
  p.set("x", to_bytes("y"));
  EXPECT_EQ(to_string(s.get("job7/x")), "y");
  EXPECT_TRUE(p.check({"x"}));
  EXPECT_FALSE(p.check({"a"}));
}

TEST(TcpStore, Semantics) {
  ServerProcess server;
  auto c = client(server.port);
  check_semantics(*c);
  // A timed-out request leaves the client usable.
  c->set("after", to_bytes("ok"));
  EXPECT_EQ(to_string(c->get("after")), "ok");
}

TEST(FileStore, Semantics) {
  auto path = std::filesystem::temp_directory_path() / ("collie-fs-" + std::to_string(getpid()));
  std::filesystem::remove(path);
  auto s = make_file_store(path, 5s);
  check_semantics(*s);
  std::filesystem::remove(path);
}

TEST(TcpStore, GetBlocksUntilAnotherProcessSets) {
  ServerProcess server;
  pid_t reader = spawn([&] {
    auto c = client(server.port);
    return to_string(c->get("late", 10s)) == "arrived" ? 0 : 1;
  });
  std::this_thread::sleep_for(100ms);
  pid_t writer = spawn([&] {
    client(server.port)->set("late", to_bytes("arrived"));
    return 0;
  });
  EXPECT_EQ(join(writer), 0);
  EXPECT_EQ(join(reader), 0);
}

void concurrent_adds(const std::function<std::unique_ptr<Store>()>& make) {
  std::vector<pid_t> kids;
  for (int k = 0; k < 4; ++k)
    kids.push_back(spawn([&] {
      auto s = make();
      for (int i = 0; i < 100; ++i) s->add("counter", 1);
      // compare_set as a lock: exactly one process wins it.
      auto v = s->compare_set("winner", {}, to_bytes(std::to_string(getpid())));
      if (to_string(v) == std::to_string(getpid())) s->add("winners", 1);
      return 0;
    }));
  for (pid_t p : kids) EXPECT_EQ(join(p), 0);
  auto s = make();
  EXPECT_EQ(s->add("counter", 0), 400);
  EXPECT_EQ(s->add("winners", 0), 1);
}

TEST(TcpStore, AddsFromFourProcessesAreAtomic) {
  ServerProcess server;
  concurrent_adds([&] { return std::unique_ptr<Store>(client(server.port)); });
}

TEST(FileStore, AddsFromFourProcessesAreAtomic) {
  auto path = std::filesystem::temp_directory_path() / ("collie-fs-add-" + std::to_string(getpid()));
  std::filesystem::remove(path);
  concurrent_adds([&] { return make_file_store(path, 5s); });
  std::filesystem::remove(path);
}

TEST(TcpStore, WrongSecretIsRefusedAndOthersKeepWorking) {
  ServerProcess server;
  ErrorCode code{};
  std::string msg = error_of([&] { client(server.port, "wrong-secret"); }, &code);
  EXPECT_EQ(code, ErrorCode::invalid_argument) << msg;
  EXPECT_NE(msg.find("COLLIE_JOB_SECRET differs"), std::string::npos) << msg;
  EXPECT_NE(msg.find("test client"), std::string::npos) << msg;
  auto good = client(server.port);
  good->set("k", to_bytes("v"));
  EXPECT_EQ(to_string(good->get("k")), "v");
}

TEST(TcpStore, StraysWithGarbageSilenceOrHugeLengthsDoNotStopService) {
  ServerProcess server;
  net::Endpoint ep{"127.0.0.1", server.port};
  auto deadline = net::deadline_after(5s);
  auto garbage = net::connect_tcp(ep, deadline, "stray");
  const char junk[] = "GET / HTTP/1.0\r\n\r\n";
  net::write_full(garbage.get(), junk, sizeof junk, deadline, "stray");
  auto silent = net::connect_tcp(ep, deadline, "stray");
  auto huge = net::connect_tcp(ep, deadline, "stray");
  const unsigned char big[4] = {0xff, 0xff, 0xff, 0x7f};  // a 2 GiB record
  net::write_full(huge.get(), big, 4, deadline, "stray");

  auto c = client(server.port);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(c->add("served", 1), i + 1);
  // The server drops the garbage and oversized ones: they read end-of-stream.
  for (int fd : {garbage.get(), huge.get()}) {
    char b;
    EXPECT_THROW(net::read_full(fd, &b, 1, net::deadline_after(5s), "stray"), Error);
  }
}

TEST(TcpStore, ServerDeathIsPeerLostForAParkedGet) {
  ServerProcess server;
  pid_t waiter = spawn([&] {
    auto c = client(server.port, kSecret, 20s);
    ErrorCode code{};
    std::string msg = error_of([&] { c->get("never", 20s); }, &code);
    bool ok = code == ErrorCode::peer_lost && msg.find("rank 0") != std::string::npos;
    if (!ok) fprintf(stderr, "got: %s\n", msg.c_str());
    return ok ? 0 : 1;
  });
  std::this_thread::sleep_for(300ms);
  server.stop();
  EXPECT_EQ(join(waiter), 0);
}

}  // namespace
}  // namespace collie
