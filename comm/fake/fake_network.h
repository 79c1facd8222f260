// comm/fake/fake_network.h: an in-process network of n ranks that
// implements comm/transport.h: what the algorithms' tests run over at any
// world size in milliseconds, without sockets, and what the `fake` backend
// (comm/fake/fake_backend.h) moves a communicator's bytes over.
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
// Each rank runs on its own thread and uses its own endpoint. A backend's
// runner also needs what a real network has: an abort that tells the peers
// (abort), a wake-up from another thread (wake) and a goodbye (close).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "collie/error.h"
#include "comm/transport.h"

namespace collie::fake {

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

  // `rank` ends in `e`: its run in progress (or next) throws it, and its
  // peers' waits end with it, as TCP's abort frames end theirs. Any thread.
  void abort(int rank, const Error& e);
  // Interrupts `rank`'s run in progress: it calls its idle function again
  // (takes in queued ops). Any thread.
  void wake(int rank);
  // `rank` says goodbye: a peer still waiting for it is told it closed.
  void close(int rank);
  // The ranks that vanished or closed.
  std::vector<int> gone() const;

  struct State;

 private:
  std::shared_ptr<State> s_;
  std::vector<std::unique_ptr<Transport>> endpoints_;
};

}  // namespace collie::fake
