// tests/faults_harness.h: the fault suite's harness (tests/test_faults*.cc):
// real rank processes, forked, that rendezvous through a store whose
// listening socket the test process bound first, like collie-run does; each
// reports "OK ..." or its error, and a rank still running after a limit is
// killed and called hung, so a regression fails instead of blocking.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "collie/comm.h"

namespace collie::faults {

using namespace std::chrono_literals;

struct Outcome {
  bool exited = false;  // false: killed by a signal, or hung and killed
  bool hung = false;
  std::string report;  // "OK ...", or "ERR <code>|<message>"

  bool ok() const { return report.rfind("OK", 0) == 0; }
  std::string code() const {
    if (report.rfind("ERR ", 0) != 0) return "";
    return report.substr(4, report.find('|') - 4);
  }
  std::string message() const {
    auto bar = report.find('|');
    return bar == std::string::npos ? report : report.substr(bar + 1);
  }
};

using RankFn = std::function<std::string(int rank, Options opt)>;

// Runs fn in `n` forked ranks. `skip` ranks are never started. A rank still
// running after `limit` is killed and called hung. `linger` ranks stall on
// purpose (stopped, or asleep past the others' deadline): once every other
// rank has ended they are killed (and called hung) at once, instead of
// after `limit` (a third of this suite's time went to that wait).
std::vector<Outcome> run_ranks(int n, RankFn fn, std::chrono::milliseconds timeout,
                               std::vector<int> skip = {}, std::chrono::seconds limit = 60s,
                               std::vector<int> linger = {});

// Inside a rank of run_ranks: returns once rank r's process has ended,
// however it ended (rank r alone holds the write end of a pipe; reading it
// to its end is the signal, in place of sleeps that guessed how long a peer
// would take).
void wait_for_exit_of(int r);

// A rank that stalls on purpose (alive, calling nothing) until the harness
// kills it, which it does once every other rank has ended (`linger`).
[[noreturn]] void stall_until_killed();

// Every rank's outcome, for a failed expectation's message.
std::string describe(const std::vector<Outcome>& v);

bool contains(const std::string& s, const std::string& needle);

}  // namespace collie::faults
