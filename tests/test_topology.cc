// tests/test_topology.cc: base/topology.h (the CPUs a process may use, and
// each local rank's share of them under COLLIE_BIND) and base/spin.h (how
// long a waiter busy-polls before it sleeps).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <set>
#include <string>
#include <thread>

#include "base/config.h"
#include "base/spin.h"
#include "base/topology.h"
#include "fake_env.h"

namespace collie {
namespace {

using namespace std::chrono_literals;

using testing::error_of;
using testing::fake;

// Run once as is and once under `taskset -c 0` (tests/meson.build), which
// sets COLLIE_TEST_EXPECT_CPUS=1: the count must follow the process binding.
TEST(Topology, UsableCpusFollowTheProcessBinding) {
  int n = topology::usable_cpus();
  EXPECT_GE(n, 1);
  if (const char* want = std::getenv("COLLIE_TEST_EXPECT_CPUS"))
    EXPECT_EQ(n, std::atoi(want));
  else
    EXPECT_LE(n, static_cast<int>(std::thread::hardware_concurrency()));
}

// COLLIE_BIND=core, in forked processes standing for the local ranks: each
// gets a block of this process's CPUs, the blocks do not overlap while
// there are cores enough, together they cover every CPU, and with more ranks
// than cores every rank still gets one. numa puts each on a node's CPUs.
// (This machine's CPUs are cores: no SMT.)
std::set<int> cpus_of(const std::string& list) {
  std::set<int> out;
  std::stringstream ss(list);
  for (std::string part; std::getline(ss, part, ',');) {
    auto dash = part.find('-');
    int lo = std::stoi(part.substr(0, dash)),
        hi = dash == std::string::npos ? lo : std::stoi(part.substr(dash + 1));
    for (int c = lo; c <= hi; ++c) out.insert(c);
  }
  return out;
}

std::vector<std::set<int>> bound_cpus(const std::string& how, int ranks) {
  std::vector<std::set<int>> out;
  for (int r = 0; r < ranks; ++r) {
    int p[2];
    EXPECT_EQ(pipe(p), 0);
    pid_t pid = fork();
    if (pid == 0) {
      std::string got;
      try {
        got = topology::bind(how, r, ranks);
      } catch (const Error& e) {
        got = std::string("error ") + e.what();
      }
      [[maybe_unused]] ssize_t w = ::write(p[1], got.data(), got.size());
      _exit(0);
    }
    ::close(p[1]);
    std::string got;
    char buf[256];
    for (ssize_t k; (k = ::read(p[0], buf, sizeof buf)) > 0;) got.append(buf, k);
    ::close(p[0]);
    waitpid(pid, nullptr, 0);
    EXPECT_EQ(got.rfind("error", 0), std::string::npos) << got;
    out.push_back(got.rfind("error", 0) == 0 ? std::set<int>{} : cpus_of(got));
  }
  return out;
}

TEST(Topology, BindGivesEachLocalRankItsShareOfTheCores) {
  const std::set<int> all = cpus_of(topology::binding());
  ASSERT_FALSE(all.empty());
  const int cores = static_cast<int>(all.size());
  for (int ranks : {1, 2, cores, cores + 1}) {
    auto sets = bound_cpus("core", ranks);
    std::set<int> covered;
    for (int r = 0; r < ranks; ++r) {
      EXPECT_FALSE(sets[r].empty()) << ranks << " ranks, rank " << r;
      for (int c : sets[r]) EXPECT_TRUE(all.count(c)) << "CPU " << c << " is not this process's";
      if (ranks <= cores) {
        for (int q = 0; q < r; ++q)
          for (int c : sets[r]) EXPECT_FALSE(sets[q].count(c)) << "CPU " << c << " given twice";
      }
      covered.insert(sets[r].begin(), sets[r].end());
    }
    EXPECT_EQ(covered, all) << ranks << " ranks";
  }
  for (const auto& s : bound_cpus("numa", 2)) EXPECT_FALSE(s.empty());
  EXPECT_NE(error_of([] {
              config::bind(fake({{"COLLIE_BIND", "socket"}}));
            }).find("COLLIE_BIND='socket' is not one of none, core, numa"),
            std::string::npos);
}

// The waiters' spin: grows when a sleep was answered about as soon as it
// began (a wake-up lost to a short spin), shrinks back when the peer was
// really late, and stays put when the user fixed it.
TEST(SpinBudget, GrowsOnWakeUpsItCouldHaveSpunThroughAndShrinksOnLatePeers) {
  SpinBudget s(50, true);
  EXPECT_EQ(s.get(), 50us);
  s.slept(70us);  // answered within a spin plus a wake-up
  EXPECT_EQ(s.get(), 100us);
  for (int i = 0; i < 10; ++i) s.slept(20us);
  EXPECT_EQ(s.get(), 400us);  // at most 8x the base
  s.slept(1000us);            // between: a peer a little late; keep
  EXPECT_EQ(s.get(), 400us);
  s.slept(5ms);  // a peer computing: spinning would burn a core
  EXPECT_EQ(s.get(), 200us);
  for (int i = 0; i < 10; ++i) s.slept(50ms);
  EXPECT_EQ(s.get(), 50us);  // never under the base

  SpinBudget fixed(50, false);
  fixed.slept(10us);
  EXPECT_EQ(fixed.get(), 50us);
  SpinBudget none(0, true);  // more ranks than cores: never spin
  none.slept(1us);
  EXPECT_EQ(none.get(), 0us);

  // From COLLIE_SPIN_US: set, fixed; unset, 50 us adapting where cores are free.
  auto set = SpinBudget::from_setting(20, true);
  set.slept(1us);
  EXPECT_EQ(set.get(), 20us);
  auto unset = SpinBudget::from_setting(-1, true);
  EXPECT_EQ(unset.get(), 50us);
  unset.slept(1us);
  EXPECT_EQ(unset.get(), 100us);
  EXPECT_EQ(SpinBudget::from_setting(-1, false).get(), 0us);
}

}  // namespace
}  // namespace collie
