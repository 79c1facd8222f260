// comm/stall_inspector.h: when a collective passes its deadline, where is
// every rank? The stall inspector asks them through the rendezvous store,
// not through the data connections (which may be what is stuck), and the
// error then names who is late and where: "...: ranks 0, 1, 3 wait in #42;
// rank 2 last completed #41 and has not called #42 (its process is alive)".
//
// Each communicator keeps its progress here: the last collective issued
// (the front) and the last one completed (the executor, the NCCL
// watchdog), relaxed atomics off any lock. A watcher thread per
// communicator parks one wait on the store, on a connection of its own
// (Store::connect_again), for the key that asks this rank; it costs nothing
// until a rank times out. The rank whose op timed out sets every other
// rank's ask key, and waits a short while (a quarter of the timeout, within
// 0.5 to 0.75 s, so that a stalled rank is named within the deadline plus
// a second) for their answers; a watcher answers in milliseconds. A rank
// that answers is alive, whatever it is doing; one that does not is dead,
// stopped, or cut off from the store, and the report says when it was last
// seen: the end of the collective before the one that timed out.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/op.h"
#include "collie/error.h"
#include "collie/store.h"

namespace collie {

// Where one rank is, for a stall report: its last collective issued and
// completed, where known, and what its process is doing.
struct RankPosition {
  bool known = false;
  uint32_t issued = 0, completed = 0;
  std::string process = "alive";  // "... (its process is <process>)"
};

// A stall report's text for collective #n, the ranks grouped where they
// are where they should be: "ranks 0, 1 wait in #6; rank 2 last completed
// #5 and has not called #6 (its process is stopped)". The ranks whose
// position is unknown are named, then `silent_says`. The stall inspector's
// and the mpi backend's (through its shared check area).
std::string describe_positions(uint32_t n, const std::vector<RankPosition>& at,
                               const std::string& silent_says);

class StallInspector {
 public:
  // Starts the watcher of `rank` (of `size`) in the communicator whose
  // store keys begin with `key`. The watcher needs a second connection to
  // the store; without one (a store that cannot make one) this rank does
  // not answer, but it can still ask.
  static std::shared_ptr<StallInspector> start(std::shared_ptr<Store> store, std::string key,
                                               int rank, int size,
                                               std::chrono::milliseconds timeout);
  ~StallInspector();
  StallInspector(const StallInspector&) = delete;
  StallInspector& operator=(const StallInspector&) = delete;

  // The last collective this rank issued, and the last one it completed.
  void issued(uint32_t seq);
  void completed(uint32_t seq);
  uint32_t last_completed() const;

  // `e`, the timeout of collective `desc` on this rank, with where every
  // rank is appended. Waits for the answers up to the inspection's budget;
  // never throws.
  Error explain(const OpDesc& desc, const Error& e);

  // Ends the watcher (once; the destructor does it too).
  void stop();

 private:
  struct Shared;
  StallInspector(std::shared_ptr<Store> store, std::string key, int rank, int size,
                 std::chrono::milliseconds timeout);
  std::string ask_key(int q) const;
  std::string state_key(int q) const;
  std::string report_key() const;
  // How long an inspection waits for answers, and the goodbye to the
  // watcher for the store: a quarter of the timeout, within 0.5 to 0.75 s.
  std::chrono::milliseconds budget() const;

  const std::shared_ptr<Store> store_;
  const std::string key_;
  const int rank_, size_;
  const std::chrono::milliseconds timeout_;
  const std::shared_ptr<Shared> progress_;
  std::thread watcher_;
  bool stopped_ = false;
  std::atomic<bool> unreachable_{false};  // an inspection could not reach the store
};

}  // namespace collie
