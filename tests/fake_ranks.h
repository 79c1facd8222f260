// tests/fake_ranks.h: runs a function as every rank of an in-process fake
// network (comm/fake/fake_network.h), one thread per rank, and gathers what
// each rank ended with: the algorithms' tests' driver.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "comm/fake/fake_network.h"

namespace collie::testing {

using fake::FakeNetwork;
using fake::FakeOptions;
using fake::Vanished;

// What one rank's thread ended with.
struct RankResult {
  bool ok = false;
  bool vanished = false;
  std::string error;     // "<code>: <message>" when it threw a collie::Error
  std::string failures;  // what the rank's own checks found wrong ("" when all passed)
};

// Runs fn(rank, transport) on n threads over one network and returns what
// each ended with. fn returns its own check failures ("" when none).
std::vector<RankResult> run_ranks(FakeNetwork& net,
                                  const std::function<std::string(int, Transport&)>& fn);

}  // namespace collie::testing
