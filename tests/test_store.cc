// tests/test_store.cc: the rendezvous stores. Semantics against known
// answers, then the multi-process parts with real processes: forked clients
// (the server lives in a forked process too, so that the test process stays
// single-threaded when it forks), concurrent adds, compare_set as a lock, a
// blocking get answered by another process, the handshake (checked against
// an HMAC computed here with OpenSSL directly): refused secrets and jobs, a
// secret that never travels, a recorded handshake replayed; strays that
// send garbage or nothing, oversized messages, and a server that dies.
#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "collie/store.h"
#include "comm/net/socket.h"

namespace collie {
namespace {

using namespace std::chrono_literals;

const std::string kSecret = "store-test-secret";
const std::string kJob = "COLLIE_JOB_ID=store-test, 2 ranks";

// A store server in its own process, on a socket bound here first (the way
// collie-run hands one to rank 0), so its port is known before it starts.
struct ServerProcess {
  pid_t pid = -1;
  int port = 0;

  explicit ServerProcess(const std::string& job = kJob) {
    net::Fd listener = net::listen_tcp("127.0.0.1", 0, "test");
    port = net::local_port(listener.get());
    pid = fork();
    if (pid == 0) {
      auto server = TcpStoreServer::start(0, {kSecret, job}, listener.release());
      for (;;) pause();  // until killed
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

// Runs fn in a child process; its exit code is 0 when all its checks held.
pid_t spawn(const std::function<int()>& fn) {
  pid_t pid = fork();
  if (pid == 0) {
    int rc = 98;
    try {
      rc = fn();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child %d: %s\n", getpid(), e.what());
      rc = 99;
    }
    _exit(rc);
  }
  return pid;
}
int join(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
}

std::unique_ptr<TcpStore> client(int port, const std::string& secret = kSecret, Millis timeout = 5s,
                                 const std::string& job = kJob) {
  return TcpStore::connect("127.0.0.1", port, {secret, job}, timeout, "test client");
}

struct Caught {
  bool thrown = false;
  ErrorCode code{};
  std::string msg;
};
Caught error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return {true, e.code(), e.what()};
  }
  return {};
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// A path for a file store, removed before and after the test.
struct TempPath {
  std::filesystem::path path;
  explicit TempPath(const std::string& name)
      : path(std::filesystem::temp_directory_path() /
             ("collie-store-test-" + std::to_string(getpid()) + "-" + name)) {
    std::filesystem::remove(path);
  }
  ~TempPath() { std::filesystem::remove(path); }
  std::string str() const { return path.string(); }
};

// The semantics every store shares, checked on any implementation.
void check_semantics(Store& s) {
  s.set("a", to_bytes("1"));
  EXPECT_EQ(to_string(s.get("a")), "1");
  s.set("a", to_bytes("two"));
  EXPECT_EQ(to_string(s.get("a")), "two");
  EXPECT_EQ(s.add("n", 5), 5);  // missing counts as 0
  EXPECT_EQ(s.add("n", -2), 3);
  EXPECT_EQ(to_string(s.get("n")), "3");
  s.set("m", to_bytes("-7"));
  EXPECT_EQ(s.add("m", 0), -7);
  EXPECT_TRUE(s.check({"a", "n"}));
  EXPECT_FALSE(s.check({"a", "missing"}));
  EXPECT_TRUE(s.check({}));
  s.wait({});
  s.wait({"a", "n"}, 100ms);

  // compare_set: empty expected matches a missing key; a wrong expected
  // leaves the value and returns it; a right one replaces it.
  EXPECT_EQ(to_string(s.compare_set("lock", {}, to_bytes("me"))), "me");
  EXPECT_EQ(to_string(s.compare_set("lock", {}, to_bytes("you"))), "me");
  EXPECT_EQ(to_string(s.compare_set("lock", to_bytes("other"), to_bytes("you"))), "me");
  EXPECT_EQ(to_string(s.compare_set("lock", to_bytes("me"), to_bytes("you"))), "you");
  EXPECT_EQ(to_string(s.get("lock")), "you");
  EXPECT_TRUE(s.remove("lock"));
  EXPECT_FALSE(s.remove("lock"));
  EXPECT_FALSE(s.check({"lock"}));
  EXPECT_EQ(to_string(s.compare_set("lock", to_bytes("me"), to_bytes("you"))), "");
  EXPECT_FALSE(s.check({"lock"}));

  // Empty and binary values survive.
  s.set("empty", {});
  EXPECT_TRUE(s.check({"empty"}));
  EXPECT_TRUE(s.get("empty").empty());
  Bytes bin{0, 255, 10, 0, 13};
  s.set("bin", bin);
  EXPECT_EQ(s.get("bin"), bin);

  Caught e = error_of([&] { s.add("a", 1); });
  EXPECT_EQ(e.code, ErrorCode::invalid_argument) << e.msg;
  EXPECT_TRUE(contains(e.msg, "not an integer")) << e.msg;
  EXPECT_EQ(to_string(s.get("a")), "two");  // a failed add changes nothing

  e = error_of([&] { s.get("never-set", 100ms); });
  EXPECT_EQ(e.code, ErrorCode::timeout) << e.msg;
  EXPECT_TRUE(contains(e.msg, "never-set")) << e.msg;
  s.set("present", to_bytes("x"));
  e = error_of([&] { s.wait({"present", "absent-key"}, 100ms); });
  EXPECT_EQ(e.code, ErrorCode::timeout) << e.msg;
  EXPECT_TRUE(contains(e.msg, "absent-key")) << e.msg;
  EXPECT_FALSE(contains(e.msg, "present")) << "names a key that exists: " << e.msg;
  // The store is still usable after a timeout.
  s.set("after-timeout", to_bytes("ok"));
  EXPECT_EQ(to_string(s.get("after-timeout")), "ok");

  PrefixStore p(std::shared_ptr<Store>(&s, [](Store*) {}), "job7/");
  p.set("x", to_bytes("y"));
  EXPECT_EQ(to_string(s.get("job7/x")), "y");
  EXPECT_EQ(to_string(p.get("x")), "y");
  EXPECT_EQ(p.add("c", 2), 2);
  EXPECT_EQ(s.add("job7/c", 0), 2);
  EXPECT_TRUE(p.check({"x", "c"}));
  EXPECT_FALSE(p.check({"a"}));
  p.wait({"x"});
  EXPECT_EQ(to_string(p.compare_set("x", to_bytes("y"), to_bytes("z"))), "z");
  EXPECT_TRUE(p.remove("x"));
  EXPECT_FALSE(s.check({"job7/x"}));
  e = error_of([&] { p.get("gone", 50ms); });
  EXPECT_EQ(e.code, ErrorCode::timeout) << e.msg;
  EXPECT_TRUE(contains(e.msg, "job7/gone")) << e.msg;
}

// The state letter ('R', 'S', 'T', 'Z', ...) in a /proc stat file (a
// process's or a thread's); 0 when it cannot be read (the process is gone).
char stat_state(const std::string& stat_path) {
  std::ifstream f(stat_path);
  std::string line;
  if (!std::getline(f, line)) return 0;
  const auto close = line.rfind(')');
  return close == std::string::npos || close + 2 >= line.size() ? 0 : line[close + 2];
}

char process_state(pid_t pid) {
  return stat_state("/proc/" + std::to_string(pid) + "/stat");
}

// Another process sets the key a get is waiting for. The order is by
// signals: the reader says on a socket that its get comes next, the test
// waits until the reader sleeps in it (or has ended: a get that did not
// wait fails the reader), and only then starts the writer. (It slept
// 100 ms instead, and passed even when the writer came first.)
void get_waits_for_another_process(const std::function<std::unique_ptr<Store>()>& make) {
  int ready[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, ready), 0);
  pid_t reader = spawn([&] {
    ::close(ready[0]);
    auto s = make();
    if (s->check({"late"})) return 2;  // set already: this run shows nothing
    const char go = 1;
    if (::write(ready[1], &go, 1) != 1) return 3;
    return to_string(s->get("late", 20s)) == "arrived" ? 0 : 1;
  });
  ::close(ready[1]);
  char r = 0;
  net::read_full(ready[0], &r, 1, net::deadline_after(20s), "the reader's signal");
  ::close(ready[0]);
  bool asleep = false;
  for (const auto until = std::chrono::steady_clock::now() + 10s;
       !asleep && std::chrono::steady_clock::now() < until;) {
    const char st = process_state(reader);
    if (st == 0 || st == 'Z') break;  // it ended without waiting
    asleep = st == 'S';
    if (!asleep) std::this_thread::yield();
  }
  EXPECT_TRUE(asleep) << "the reader's get did not wait for the key";
  pid_t writer = spawn([&] {
    auto s = make();
    s->set("late", to_bytes("arrived"));
    return 0;
  });
  EXPECT_EQ(join(writer), 0);
  EXPECT_EQ(join(reader), 0);
}

// 4 processes x 100 adds on one counter.
void concurrent_adds(const std::function<std::unique_ptr<Store>()>& make) {
  std::vector<pid_t> kids;
  for (int k = 0; k < 4; ++k)
    kids.push_back(spawn([&] {
      auto s = make();
      for (int i = 0; i < 100; ++i) s->add("counter", 1);
      return 0;
    }));
  for (pid_t p : kids) EXPECT_EQ(join(p), 0);
  EXPECT_EQ(make()->add("counter", 0), 400);
}

// compare_set as a mutex: each process takes the lock, does a non-atomic
// read-modify-write of "shared", and lets go. Lost updates or two holders at
// once would show.
void compare_set_lock(const std::function<std::unique_ptr<Store>()>& make) {
  constexpr int kProcs = 4, kRounds = 20;
  std::vector<pid_t> kids;
  for (int k = 0; k < kProcs; ++k)
    kids.push_back(spawn([&] {
      auto s = make();
      Bytes me = to_bytes("holder-" + std::to_string(getpid()));
      s->compare_set("shared", {}, to_bytes("0"));
      for (int i = 0; i < kRounds; ++i) {
        while (s->compare_set("lock", {}, me) != me) std::this_thread::sleep_for(1ms);
        if (s->add("holders", 1) != 1) return 2;
        int v = std::stoi(to_string(s->get("shared")));
        s->set("shared", to_bytes(std::to_string(v + 1)));
        if (s->add("holders", -1) != 0) return 3;
        if (!s->remove("lock")) return 4;
      }
      return 0;
    }));
  for (pid_t p : kids) EXPECT_EQ(join(p), 0);
  auto s = make();
  EXPECT_EQ(to_string(s->get("shared")), std::to_string(kProcs * kRounds));
  EXPECT_FALSE(s->check({"lock"}));
}

// ---------------------------------------------------------------- TcpStore

TEST(TcpStore, Semantics) {
  ServerProcess server;
  auto c = client(server.port);
  check_semantics(*c);
  EXPECT_EQ(c->local_address(), "127.0.0.1");
}

TEST(TcpStore, TimeoutNamesTheKeyTheStoreAndTheClient) {
  ServerProcess server;
  auto c = client(server.port);
  Caught e = error_of([&] { c->get("the-missing-key", 50ms); });
  EXPECT_EQ(e.code, ErrorCode::timeout) << e.msg;
  EXPECT_TRUE(contains(e.msg, "the-missing-key")) << e.msg;
  EXPECT_TRUE(contains(e.msg, "127.0.0.1:" + std::to_string(server.port))) << e.msg;
  EXPECT_TRUE(contains(e.msg, "test client")) << e.msg;
}

// Whether every thread of `pid` is in the stopped state ('T' in
// /proc/<pid>/task/<tid>/stat) within 10 s.
bool all_threads_stopped(pid_t pid) {
  namespace fs = std::filesystem;
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  for (int i = 0; i < 1000; ++i) {
    bool all = true;
    for (const auto& t : fs::directory_iterator(tasks))
      if (stat_state(t.path() / "stat") != 'T') all = false;
    if (all) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

// A write with its own deadline gives up at that deadline, not the store's:
// the stall inspector asks through the store when a link may be down, and
// must not wait COLLIE_TIMEOUT for an answer (a stopped server stands in
// for one that cannot be reached). Through a PrefixStore too.
TEST(TcpStore, ASetWithItsOwnDeadlineGivesUpAtItNotTheStores) {
  ServerProcess server;
  std::shared_ptr<Store> c = client(server.port, kSecret, 60s);
  PrefixStore p(client(server.port, kSecret, 60s), "pre/");
  c->set("reachable", to_bytes("yes"), 5s);
  p.set("k", to_bytes("v"), 5s);
  EXPECT_EQ(to_string(c->get("reachable")), "yes");
  EXPECT_EQ(to_string(c->get("pre/k")), "v");
  ASSERT_EQ(kill(server.pid, SIGSTOP), 0);
  // kill() returns before the stop takes: the server's thread, woken by a
  // request, could still answer it. Wait until every thread is stopped.
  ASSERT_TRUE(all_threads_stopped(server.pid)) << "the server did not stop";
  Caught e = error_of([&] { c->set("unanswered", to_bytes("x"), 200ms); });
  EXPECT_EQ(e.code, ErrorCode::timeout) << e.msg;
  EXPECT_TRUE(contains(e.msg, "'unanswered' after 200 ms")) << e.msg;
  e = error_of([&] { p.set("k2", to_bytes("x"), 200ms); });
  EXPECT_EQ(e.code, ErrorCode::timeout) << e.msg;
  EXPECT_TRUE(contains(e.msg, "'pre/k2' after 200 ms")) << e.msg;
  // The next request reconnects (the timed-out one dropped its
  // connection): the stopped store accepts, and never answers the
  // handshake. That is this request's timeout, within its own deadline, and
  // not a store lost for good.
  e = error_of([&] { c->get("reachable", 200ms); });
  EXPECT_EQ(e.code, ErrorCode::timeout) << e.msg;
  EXPECT_TRUE(contains(e.msg, "deadline passed while reconnecting")) << e.msg;
  kill(server.pid, SIGCONT);
  EXPECT_EQ(to_string(c->get("reachable")), "yes");
  EXPECT_EQ(to_string(p.get("k")), "v");
}

TEST(TcpStore, ATimedOutGetLeavesNoStaleAnswerForTheNextRequest) {
  ServerProcess server;
  auto c = client(server.port);
  EXPECT_EQ(error_of([&] { c->get("slow", 50ms); }).code, ErrorCode::timeout);
  // The key arrives after the get gave up: its value must not be taken for
  // the answer to the next request on the same client.
  client(server.port)->set("slow", to_bytes("late"));
  EXPECT_EQ(c->add("next", 1), 1);
  EXPECT_EQ(to_string(c->get("slow")), "late");
}

TEST(TcpStore, GetBlocksUntilAnotherProcessSets) {
  ServerProcess server;
  get_waits_for_another_process([&] { return client(server.port); });
}

TEST(TcpStore, AddsFromFourProcessesAreAtomic) {
  ServerProcess server;
  concurrent_adds([&] { return client(server.port); });
}

TEST(TcpStore, CompareSetWorksAsALockAcrossProcesses) {
  ServerProcess server;
  compare_set_lock([&] { return client(server.port); });
}

TEST(TcpStore, WrongSecretIsRefusedAndOthersKeepWorking) {
  ServerProcess server;
  auto good = client(server.port);
  good->set("k", to_bytes("v"));
  Caught e = error_of([&] { client(server.port, "wrong-secret"); });
  EXPECT_EQ(e.code, ErrorCode::invalid_argument) << e.msg;
  EXPECT_TRUE(contains(e.msg, "the store at 127.0.0.1:" + std::to_string(server.port))) << e.msg;
  EXPECT_TRUE(contains(e.msg, "could not prove that it knows this job's secret")) << e.msg;
  EXPECT_TRUE(contains(e.msg, "COLLIE_JOB_SECRET differs from rank 0's")) << e.msg;
  EXPECT_TRUE(contains(e.msg, "test client")) << e.msg;
  EXPECT_EQ(to_string(good->get("k")), "v");
  EXPECT_EQ(to_string(client(server.port)->get("k")), "v");
}

TEST(TcpStore, ARankOfAnotherJobIsRefusedByName) {
  ServerProcess server("COLLIE_JOB_ID=a, 2 ranks");
  // The same secret (or none: plain torchrun/mpirun variables) and another
  // job: refused, whatever the secret says.
  Caught e = error_of([&] { client(server.port, kSecret, 5s, "COLLIE_JOB_ID=b, 2 ranks"); });
  EXPECT_EQ(e.code, ErrorCode::invalid_argument) << e.msg;
  EXPECT_TRUE(contains(e.msg,
                       "this store serves job 'COLLIE_JOB_ID=a, 2 ranks' and the client is "
                       "of job 'COLLIE_JOB_ID=b, 2 ranks'"))
      << e.msg;
  e = error_of([&] { client(server.port, kSecret, 5s, "COLLIE_JOB_ID=a, 3 ranks"); });
  EXPECT_TRUE(contains(e.msg, "job 'COLLIE_JOB_ID=a, 3 ranks'")) << e.msg;
  EXPECT_EQ(client(server.port, kSecret, 5s, "COLLIE_JOB_ID=a, 2 ranks")->add("n", 1), 1);
}

void put_u32(std::string& s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>(v >> (8 * i)));
}

// A whole message as the wire format in tcp_store.cc spells it: u32 length,
// then the op, then the fields, each u32 length + bytes.
std::string record(uint8_t op, const std::vector<std::string>& fields) {
  std::string rec(1, static_cast<char>(op));
  for (auto& f : fields) {
    put_u32(rec, static_cast<uint32_t>(f.size()));
    rec += f;
  }
  std::string msg;
  put_u32(msg, static_cast<uint32_t>(rec.size()));
  return msg + rec;
}
std::string hello_message(const std::string& magic, const std::string& job,
                          const std::string& nonce) {
  return record(1, {magic, job, nonce});
}

// A reply: the status byte and the fields.
std::pair<int, std::vector<std::string>> read_reply(int fd) {
  std::string r = net::read_blob(fd, 1 << 20, net::deadline_after(5s), "raw client");
  std::vector<std::string> f;
  for (size_t at = 1; at + 4 <= r.size();) {
    uint32_t len = static_cast<uint8_t>(r[at]) | static_cast<uint8_t>(r[at + 1]) << 8 |
                   static_cast<uint8_t>(r[at + 2]) << 16 |
                   static_cast<uint32_t>(static_cast<uint8_t>(r[at + 3])) << 24;
    f.push_back(r.substr(at + 4, len));
    at += 4 + len;
  }
  return {r.empty() ? -1 : static_cast<uint8_t>(r[0]), f};
}

// HMAC-SHA256 as comm/net/auth.h defines the input: each part after its
// u64 little-endian length. Computed here with OpenSSL directly, so that
// the test checks the protocol rather than the library against itself.
std::string hmac(const std::string& key, const std::vector<std::string>& parts) {
  std::string in;
  for (auto& p : parts) {
    for (int i = 0; i < 8; ++i) in.push_back(static_cast<char>((uint64_t{p.size()} >> (8 * i))));
    in += p;
  }
  unsigned char out[32];
  unsigned int n = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(in.data()), in.size(), out, &n);
  return std::string(reinterpret_cast<char*>(out), n);
}

std::string nonce() {
  std::string n(32, '\0');
  RAND_bytes(reinterpret_cast<unsigned char*>(n.data()), 32);
  return n;
}

// The whole handshake by hand on a fresh connection, with `secret`.
struct RawResult {
  bool server_proved = false;  // its MAC is the one this secret gives
  bool accepted = false;       // it said ok to the proof
};
RawResult raw_handshake(int fd, const std::string& secret = kSecret) {
  auto d = net::deadline_after(5s);
  const std::string cn = nonce();
  std::string m = hello_message("collie-store-2", kJob, cn);
  net::write_full(fd, m.data(), m.size(), d, "raw client");
  auto [status, f] = read_reply(fd);
  if (status != 0 || f.size() != 2) return {};
  RawResult r;
  r.server_proved = f[1] == hmac(secret, {"collie-store-2", "server", kJob, cn, f[0]});
  m = record(9, {hmac(secret, {"collie-store-2", "client", kJob, cn, f[0]})});
  net::write_full(fd, m.data(), m.size(), d, "raw client");
  r.accepted = read_reply(fd).first == 0;
  return r;
}

TEST(TcpStore, TheProtocolIsHmacOverBothNonces) {
  ServerProcess server;
  auto fd = net::connect_tcp({"127.0.0.1", server.port}, net::deadline_after(5s), "raw client");
  RawResult r = raw_handshake(fd.get());
  ASSERT_TRUE(r.server_proved && r.accepted);
  std::string m = record(4, {"n", "5"});  // ADD n 5
  net::write_full(fd.get(), m.data(), m.size(), net::deadline_after(5s), "raw client");
  auto [status, f] = read_reply(fd.get());
  EXPECT_EQ(status, 0);
  EXPECT_EQ(f, std::vector<std::string>{"5"});
  auto wrong = net::connect_tcp({"127.0.0.1", server.port}, net::deadline_after(5s), "raw");
  r = raw_handshake(wrong.get(), "not-the-secret");
  EXPECT_FALSE(r.server_proved);
  EXPECT_FALSE(r.accepted);
}

// A client's bytes, relayed to the server and recorded: the secret is not
// among them, and replaying them on a new connection is refused (the
// server's nonce is new, so the recorded proof no longer fits).
TEST(TcpStore, TheSecretNeverTravelsAndARecordedHandshakeReplayedIsRefused) {
  ServerProcess server;
  net::Fd relay = net::listen_tcp("127.0.0.1", 0, "relay");
  const int relay_port = net::local_port(relay.get());
  pid_t child = spawn([&] {
    auto c = client(relay_port);
    c->set("through the relay", to_bytes("yes"));
    return 0;
  });
  auto d = net::deadline_after(10s);
  int in = -1;
  {
    pollfd p{relay.get(), POLLIN, 0};
    ASSERT_EQ(::poll(&p, 1, 10000), 1);
    in = ::accept(relay.get(), nullptr, nullptr);
  }
  net::Fd from_client(in);
  net::Fd to_server = net::connect_tcp({"127.0.0.1", server.port}, d, "relay");
  std::string sent;  // client -> server
  for (bool open = true; open;) {
    pollfd p[2] = {{from_client.get(), POLLIN, 0}, {to_server.get(), POLLIN, 0}};
    ASSERT_GT(::poll(p, 2, 10000), 0) << "the relay stalled";
    char buf[4096];
    for (int i = 0; i < 2; ++i) {
      if (!p[i].revents) continue;
      ssize_t n = ::recv(p[i].fd, buf, sizeof buf, 0);
      if (n <= 0) {
        open = false;
        break;
      }
      if (i == 0) sent.append(buf, static_cast<size_t>(n));
      net::write_full(p[1 - i].fd, buf, static_cast<size_t>(n), d, "relay");
    }
  }
  EXPECT_EQ(join(child), 0);
  EXPECT_EQ(sent.find(kSecret), std::string::npos) << "the secret went over the wire";
  EXPECT_EQ(to_string(client(server.port)->get("through the relay")), "yes");

  // Replay the recorded hello and proof, as they were.
  auto whole = [&](size_t at) { return 4 + static_cast<size_t>(static_cast<uint8_t>(sent[at])); };
  const size_t hello_len = whole(0), proof_len = whole(hello_len);
  ASSERT_GE(sent.size(), hello_len + proof_len);
  auto replay = net::connect_tcp({"127.0.0.1", server.port}, d, "replay");
  net::write_full(replay.get(), sent.data(), hello_len, d, "replay");
  EXPECT_EQ(read_reply(replay.get()).first, 0) << "the hello alone is not refused";
  net::write_full(replay.get(), sent.data() + hello_len, proof_len, d, "replay");
  auto [status, f] = read_reply(replay.get());
  EXPECT_EQ(status, 2) << "a replayed proof must be refused";
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0], "the job secret does not match");
}

// Whether the server closes `fd` (end of stream) before `deadline`.
bool closed_by_server(int fd, net::Deadline deadline) {
  char b;
  Caught e = error_of([&] { net::read_full(fd, &b, 1, deadline, "stray"); });
  return e.thrown && e.code == ErrorCode::peer_lost;
}

TEST(TcpStore, StraysWithGarbageOrHugeLengthsAreDroppedAndOthersServed) {
  ServerProcess server;
  net::Endpoint ep{"127.0.0.1", server.port};
  auto deadline = net::deadline_after(5s);
  auto c = client(server.port);
  EXPECT_EQ(c->add("served", 1), 1);

  auto garbage = net::connect_tcp(ep, deadline, "stray");
  const char junk[] = "GET / HTTP/1.0\r\n\r\n";
  net::write_full(garbage.get(), junk, sizeof junk, deadline, "stray");
  auto silent = net::connect_tcp(ep, deadline, "stray");
  auto huge = net::connect_tcp(ep, deadline, "stray");
  const unsigned char big[4] = {0xff, 0xff, 0xff, 0x7f};  // a 2 GiB record
  net::write_full(huge.get(), big, 4, deadline, "stray");
  auto wrong_magic = net::connect_tcp(ep, deadline, "stray");
  std::string m = hello_message("not-collie", kJob, nonce());
  net::write_full(wrong_magic.get(), m.data(), m.size(), deadline, "stray");
  // A client that passes the handshake and then declares a record far over
  // the cap: the server must drop it without trying to buffer it.
  auto huge_after_hello = net::connect_tcp(ep, deadline, "stray");
  ASSERT_TRUE(raw_handshake(huge_after_hello.get()).accepted) << "the handshake was refused";
  const unsigned char over[4] = {0xf0, 0xff, 0xff, 0xff};
  net::write_full(huge_after_hello.get(), over, 4, deadline, "stray");

  for (int i = 0; i < 50; ++i) EXPECT_EQ(c->add("served", 1), i + 2);
  auto late = client(server.port);
  EXPECT_EQ(late->add("served", 1), 52);
  for (int fd : {garbage.get(), huge.get(), wrong_magic.get(), huge_after_hello.get()})
    EXPECT_TRUE(closed_by_server(fd, net::deadline_after(5s))) << "fd " << fd;
  // The silent one is still connected (it has 10 s to speak) and the server
  // serves everyone else meanwhile.
  EXPECT_EQ(c->add("served", 1), 53);
}

TEST(TcpStore, SilentStrayIsDroppedAfterTheHandshakeTime) {
  ServerProcess server;
  auto silent = net::connect_tcp({"127.0.0.1", server.port}, net::deadline_after(5s), "stray");
  auto c = client(server.port);
  EXPECT_EQ(c->add("served", 1), 1);
  EXPECT_TRUE(closed_by_server(silent.get(), net::deadline_after(30s)));
  EXPECT_EQ(c->add("served", 1), 2);
}

TEST(TcpStore, OversizedKeysAndValuesAreRefusedAndTheLimitItselfWorks) {
  ServerProcess server;
  auto c = client(server.port, kSecret, 30s);
  Caught e = error_of([&] { c->set("big", Bytes((64u << 20) + 1, 7)); });
  EXPECT_EQ(e.code, ErrorCode::invalid_argument) << e.msg;
  EXPECT_TRUE(contains(e.msg, "'big'")) << e.msg;
  e = error_of([&] { c->set(std::string(5000, 'k'), to_bytes("v")); });
  EXPECT_EQ(e.code, ErrorCode::invalid_argument) << e.msg;
  e = error_of([&] { c->get(std::string(5000, 'k'), 50ms); });
  EXPECT_EQ(e.code, ErrorCode::invalid_argument) << e.msg;
  // The client was not disturbed, and a value of exactly the cap round-trips.
  Bytes max(64u << 20);
  for (size_t i = 0; i < max.size(); i += 4096) max[i] = static_cast<uint8_t>(i >> 12);
  c->set("max", max);
  EXPECT_EQ(c->get("max"), max);
  EXPECT_EQ(c->add("small", 1), 1);
}

TEST(TcpStore, ServerDeathIsPeerLostForAParkedGetAndAfter) {
  ServerProcess server;
  // The waiter says through a socket pair, not through the store, that it is
  // about to park its get: a reply in flight when the server dies would be lost.
  int ready[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, ready), 0);
  pid_t waiter = spawn([&] {
    ::close(ready[0]);
    auto c = client(server.port, kSecret, 20s);
    c->set("connected", to_bytes("1"));
    net::write_full(ready[1], "r", 1, net::deadline_after(5s), "ready signal");
    Caught e = error_of([&] { c->get("never", 20s); });
    bool ok = e.code == ErrorCode::peer_lost && contains(e.msg, "lost the connection to") &&
              contains(e.msg, "rank 0 serves it") && contains(e.msg, "test client");
    if (!ok) std::fprintf(stderr, "parked get: %s\n", e.msg.c_str());
    // Every later call says the same, without waiting out its deadline.
    Caught again = error_of([&] { c->set("x", {}); });
    if (again.code != ErrorCode::peer_lost) {
      std::fprintf(stderr, "later call: %s\n", again.msg.c_str());
      ok = false;
    }
    return ok ? 0 : 1;
  });
  ::close(ready[1]);
  char r;
  net::read_full(ready[0], &r, 1, net::deadline_after(20s), "ready signal");
  ::close(ready[0]);
  // The get is parked by now, or about to be: either way the server's death
  // must reach it as peer_lost.
  std::this_thread::sleep_for(20ms);
  server.stop();
  EXPECT_EQ(join(waiter), 0);
}

// Threads of one process share one client; the server runs in this process
// on a port of its own choosing. Last among the TCP tests: it makes this
// process multi-threaded for a while, and the others fork.
TEST(TcpStore, ServerInThisProcessServesThreadsSharingOneClient) {
  auto server = TcpStoreServer::start(0, {kSecret, kJob});
  ASSERT_GT(server->port(), 0);
  auto c = client(server->port());
  std::mutex mu;
  std::vector<int64_t> seen;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 100; ++i) {
        int64_t v = c->add("counter", 1);
        std::lock_guard lk(mu);
        seen.push_back(v);
      }
    });
  // Timed-out gets in between reconnect the shared client: no thread may
  // get another's answer.
  threads.emplace_back([&] {
    for (int i = 0; i < 5; ++i)
      EXPECT_EQ(error_of([&] { c->get("never", 20ms); }).code, ErrorCode::timeout);
  });
  for (auto& t : threads) t.join();
  std::sort(seen.begin(), seen.end());
  ASSERT_EQ(seen.size(), 400u);
  for (int64_t i = 0; i < 400; ++i) EXPECT_EQ(seen[i], i + 1);

  server.reset();  // stops its thread and closes every connection
  Caught e = error_of([&] { c->get("anything", 5s); });
  EXPECT_EQ(e.code, ErrorCode::peer_lost) << e.msg;
  EXPECT_TRUE(contains(e.msg, "rank 0 serves it")) << e.msg;
}

// --------------------------------------------------------------- FileStore

TEST(FileStore, Semantics) {
  TempPath path("semantics");
  auto s = make_file_store(path.str(), 5s);
  check_semantics(*s);
  // A second handle (another process would do the same) sees it all.
  auto t = make_file_store(path.str(), 5s);
  EXPECT_EQ(to_string(t->get("a")), "two");
  EXPECT_FALSE(t->check({"lock"}));
}

TEST(FileStore, GetBlocksUntilAnotherProcessSets) {
  TempPath path("get");
  get_waits_for_another_process([&] { return make_file_store(path.str(), 20s); });
}

TEST(FileStore, AddsFromFourProcessesAreAtomic) {
  TempPath path("add");
  concurrent_adds([&] { return make_file_store(path.str(), 20s); });
}

TEST(FileStore, CompareSetWorksAsALockAcrossProcesses) {
  TempPath path("lock");
  compare_set_lock([&] { return make_file_store(path.str(), 20s); });
}

TEST(FileStore, AFileThatIsNotAStoreIsRefusedAndLeftAlone) {
  TempPath path("other");
  { std::ofstream(path.path) << "someone's notes\n"; }
  Caught e = error_of([&] { make_file_store(path.str(), 1s); });
  EXPECT_EQ(e.code, ErrorCode::invalid_argument) << e.msg;
  EXPECT_TRUE(contains(e.msg, "not a collie store file")) << e.msg;
  std::ifstream in(path.path);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "someone's notes");
}

TEST(FileStore, ARecordCutShortByADeadWriterIsSkippedThenCutOff) {
  TempPath path("torn");
  auto writer = make_file_store(path.str(), 1s);
  auto reader = make_file_store(path.str(), 1s);
  writer->set("k", to_bytes("v"));
  {
    // The start of a set of "abcde": kind, key length 5, then only 2 bytes.
    std::ofstream out(path.path, std::ios::app | std::ios::binary);
    out.write(
        "s\x05\x00\x00\x00"
        "ab",
        7);
  }
  EXPECT_EQ(to_string(reader->get("k")), "v");
  EXPECT_FALSE(reader->check({"abcde"}));
  EXPECT_EQ(writer->add("n", 1), 1);
  EXPECT_EQ(to_string(reader->get("n")), "1");
  auto fresh = make_file_store(path.str(), 1s);
  EXPECT_EQ(to_string(fresh->get("k")), "v");
  EXPECT_EQ(fresh->add("n", 1), 2);
  EXPECT_EQ(reader->add("n", 1), 3);
  EXPECT_FALSE(fresh->check({"abcde"}));
}

}  // namespace
}  // namespace collie
