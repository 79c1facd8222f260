// tests/fake_world.h: an n-rank world of the `fake` backend (comm/fake/) in
// this process, each rank a thread, for tests of what sits above the
// communicator (the front, the reducer, the hooks, the C ABI) in
// milliseconds without collie-run: through the C++ API (run_world) or the
// C ABI (run_c_world).
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "collie/collie.h"
#include "collie/comm.h"
#include "collie/store.h"

namespace collie {

using std::chrono::milliseconds;

// What each rank's function returned ("" when its checks passed) or the
// collie::Error it threw ("<code>: <message>").
struct Ended {
  std::string failures;
  std::string error;
};

// Runs fn(comm) as every rank of an n-rank fake communicator, each on its
// own thread. `timeout` is the communicator's; `tweak`, when given, changes
// each rank's Options before it connects.
inline std::vector<Ended> run_world(int n, const std::function<std::string(Communicator&)>& fn,
                                    milliseconds timeout = milliseconds(20000),
                                    const std::function<void(Options&)>& tweak = {}) {
  std::shared_ptr<Store> store = make_memory_store(timeout);
  std::vector<Ended> out(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        Options o;
        o.rank = r;
        o.world_size = n;
        o.backend = "fake";
        o.store = store;
        o.timeout = timeout;
        if (tweak) tweak(o);
        auto comm = connect(o);
        out[r].failures = fn(*comm);
      } catch (const Error& e) {
        out[r].error = std::string(to_string(e.code())) + ": " + e.what();
      }
    });
  for (auto& t : threads) t.join();
  return out;
}

// An environment variable set for one test (the fake backend's failure
// injection is read from the process's environment), before any rank starts.
struct ScopedEnv {
  ScopedEnv(const char* name, const char* value) : name_(name) { ::setenv(name, value, 1); }
  ~ScopedEnv() { ::unsetenv(name_); }
  const char* name_;
};

// The same world through the C ABI: fn(comm, rank) runs as every rank of an
// n-rank fake communicator connected by collie_comm_connect, which takes its
// store from the environment (a file store here, named after `what`). It
// returns each rank's failures ("" when its checks passed; a failed connect
// is one). `tweak`, when given, changes each rank's options first.
inline std::vector<std::string> run_c_world(
    int n, const std::string& what, const std::function<std::string(collie_comm*, int)>& fn,
    const std::function<void(collie_comm_options&)>& tweak = {}) {
  const std::string path = ::testing::TempDir() + what + "_" + std::to_string(::getpid());
  std::filesystem::remove(path);
  ScopedEnv file("COLLIE_STORE_FILE", path.c_str());
  std::vector<std::string> bad(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      collie_comm_options o;
      collie_comm_options_init(&o);
      o.rank = r;
      o.world_size = n;
      o.local_world_size = n;
      o.backend = "fake";
      o.timeout_seconds = 20;
      if (tweak) tweak(o);
      collie_comm* comm = nullptr;
      if (collie_comm_connect(&o, &comm) != COLLIE_OK) {
        bad[r] = std::string("connect: ") + collie_last_error();
        return;
      }
      bad[r] = fn(comm, r);
      collie_comm_destroy(comm);
    });
  for (auto& t : threads) t.join();
  std::filesystem::remove(path);
  return bad;
}

// Every rank ended without an error and with its checks passed.
inline void expect_all_ok(const std::vector<Ended>& ended, const std::string& what) {
  for (size_t r = 0; r < ended.size(); ++r) {
    EXPECT_EQ(ended[r].error, "") << what << ", rank " << r;
    EXPECT_EQ(ended[r].failures, "") << what << ", rank " << r;
  }
}

}  // namespace collie
