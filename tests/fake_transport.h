// tests/fake_transport.h: an in-process network of n ranks that implements
// comm/transport.h, for testing collie's algorithms at any world size in
// milliseconds, without sockets.
//
// It is stricter than TCP on purpose:
//  * rendezvous: a send completes only when the receiver has posted the
//    matching receive (no buffering hides a missing receive);
//  * a send's bytes are read when it is matched, which may be long after it
//    was posted (an algorithm that reuses a buffer too early is caught);
//  * with `shuffle`, completions are reported in a random order and sends
//    late (an algorithm that depends on completion order is caught);
//  * matched messages must agree on size and operation, else both ranks get
//    a mismatch error naming the other;
//  * `vanish_rank` disappears after posting `vanish_after_posts` messages, as
//    a killed process would: every other rank that waits gets peer_lost
//    naming it, and the vanished rank's own thread gets Vanished.
// Each rank runs on its own thread and uses its own endpoint.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/transport.h"

namespace collie::testing {

struct FakeOptions {
  bool shuffle = false;
  uint64_t seed = 1;
  int vanish_rank = -1;
  size_t vanish_after_posts = 0;
};

// Thrown on the vanished rank's own thread.
struct Vanished : std::runtime_error {
  Vanished() : std::runtime_error("this rank vanished") {}
};

class FakeNetwork {
 public:
  FakeNetwork(int n, FakeOptions options = {});
  ~FakeNetwork();
  Transport& endpoint(int rank);
  int size() const;

  struct State;

 private:
  std::shared_ptr<State> s_;
  std::vector<std::unique_ptr<Transport>> endpoints_;
};

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
