// comm/backend.h: the plug-in point for collie's backends.
//
// A backend moves bytes; everything else a communicator does lives once, in
// the front (comm/front/front.cc): argument checks, operation numbering and order,
// the cached first failure, split's bookkeeping, shutdown. A backend is:
//
//  * a registry entry (comm/front/registry.cc): its name, whether this build has
//    it and why not, whether it can serve these ranks, and how to create it
//    from a BackendContext (the resolved launch settings and the rendezvous
//    store, made once by connect() for every backend);
//  * a Backend object: start an operation and return its completion, make
//    the backend of a split-off communicator, abort, shut down.
//
// Backends whose progress is driven by host threads (tcp, and later shm and
// mpi) run their operations on a HostExecutor (comm/host_executor.h), which
// keeps issue order, runs point-to-point batches, lets a waiter run the next
// operation itself, and keeps continuations off the thread that moves bytes.
// A device backend (nccl) returns completions of its own (CUDA events).
//
// Adding one is a folder (comm/<name>/) and a line in comm/front/registry.cc: see
// "How to add a backend" in docs/architecture.md.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "base/arrivals.h"
#include "base/config.h"
#include "base/op.h"
#include "collie/store.h"
#include "collie/work.h"
#include "comm/stall_inspector.h"

namespace collie {

namespace trace {
class Sink;  // base/trace.h
}

// A communicator's first failure: set once, read by the front (which fails
// every later call with it at once) and by the backend (which fails the
// operations already queued, and stops a running one when another thread
// aborts).
class FailureLatch {
 public:
  // The error of an operation (`what`, "allreduce #3 (f32 x 8, sum) on
  // rank 1") that comes after the communicator's first failure `first`.
  static Error earlier(const Error& first, const std::string& what) {
    return Error(first.code(),
                 what + " cannot run: the communicator failed earlier: " + first.what());
  }
  // Records `e` unless a failure is recorded already; returns whether it did.
  bool set(const Error& e);
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  std::optional<Error> get() const;
  // Ranks (in the communicator's numbering) this rank saw die: their
  // connections closed, their processes gone. shrink() leaves them out at
  // once instead of waiting for them.
  void lost(int rank);
  std::vector<int> lost() const;

 private:
  std::atomic<bool> failed_{false};
  mutable std::mutex mu_;
  std::optional<Error> first_;
  std::vector<int> lost_;
};

// How a backend names ranks in its messages. A runner inside a composite
// backend (hier) numbers the ranks it runs over from 0; its messages name
// them as the communicator numbers them.
class RankNames {
 public:
  RankNames() = default;
  // The communicator's number of this one's rank r.
  int operator[](int r) const { return ranks_.empty() ? r : ranks_[static_cast<size_t>(r)]; }
  std::string operator()(int r) const { return "rank " + std::to_string((*this)[r]); }
  // "1, 3" for {1, 3}.
  std::string list(const std::vector<int>& ranks) const;
  // The names of a runner over `members` (ranks of this one), in order.
  RankNames of(const std::vector<int>& members) const;

 private:
  std::vector<int> ranks_;  // empty: the ranks' own numbers
};

class Backend;
class HostRunner;  // comm/host_executor.h

// What a backend is created from.
struct BackendContext {
  config::Launch launch;             // rank, world size, deadline, secret, ...
  std::shared_ptr<Store> store;      // rendezvous, shared by every communicator of the job
  bool store_is_launchers = false;   // `store` is collie-run's (not the caller's, not a file)
  std::shared_ptr<void> keep_alive;  // the store server, when this rank serves it
  // This process serves the store (keep_alive), or may: rank 0 of a job
  // whose store was passed in (PyTorch's TCPStore lives in rank 0 outside
  // torchrun). It alone waits for the others' setups (done_with_store).
  bool serves_store = false;
  std::string key;          // unique per communicator: prefix store keys with it
  std::string listen_host;  // the address this rank's peers reach it on
  std::shared_ptr<FailureLatch> failure;
  config::Env env;  // for the backend's own settings, read through base/config.h
  RankNames names;  // for messages
  // Busy threads beside each rank's runner on this host: hier's stages
  // inside a host run beside each rank's stage across hosts (1). shm's
  // waiters spin only where these fit the CPUs too (Segment::core_free).
  int beside_per_rank = 0;
  // The caller knows this host has more busy threads than CPUs though the
  // ranks of this backend fit them (hier: other hosts' ranks share these
  // cores unseen); the same on every rank. shm's waiters then hand the CPU
  // over as where its own ranks outnumber the CPUs (Segment::crowded).
  bool crowded = false;
  // The busy threads of this host while this backend's ops run: each local
  // rank's runner and the threads beside it. tcp and mpi spin only where
  // these fit the CPUs (config::ranks_fit_cores).
  int busy_threads_on_host() const {
    return busy_threads(launch.local_world_size, beside_per_rank);
  }
  static int busy_threads(int local_world_size, int beside_per_rank) {
    return local_world_size * (1 + (beside_per_rank > 0 ? beside_per_rank : 0));
  }
  // Where every rank is when an op times out (null without a store, or
  // with one rank): the front reports issues, the executor completions.
  std::shared_ptr<StallInspector> inspector;
  // Makes this communicator's kind of backend for another context (shrink):
  // set by connect(); empty where the backend cannot be made again.
  std::function<std::unique_ptr<Backend>(const BackendContext&)> remake;
  // The registry's name of the backend (connect() sets it): what grow tells
  // the processes that join, so that they make the same kind.
  std::string backend_name;
  std::shared_ptr<trace::Sink> trace;  // COLLIE_TRACE's file for this rank, or null
  // How long each host collective ran on this rank (base/arrivals.h): the
  // executor records, Communicator::arrivals compares. Null with one rank
  // or COLLIE_ARRIVALS=0.
  std::shared_ptr<arrivals::Log> arrivals;
};

// Which ranks a split makes, as the front worked it out (every rank of the
// parent calls Backend::split, those with color < 0 too).
struct SplitPlan {
  int color = -1;
  int key = 0;
  std::vector<int> members;  // parent ranks of the new communicator, in new-rank order
  int new_rank = -1;         // this rank's place in `members` (-1 when color < 0)
  BackendContext context;    // for the new communicator: launch.rank/world_size and key set
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // Whether this backend moves tensors on device `d`.
  virtual bool accepts(const Device& d) const = 0;
  // Starts `op`, checked and numbered by the front; ops arrive in issue
  // order. The completion is failed, never thrown, when the op fails.
  virtual Work start(Op op) = 0;
  // The front's blocking calls. claim(op), under the front's lock (op
  // numbered): whether this backend runs `op` on the calling thread now
  // (nothing queued or running), holding itself for it; the front then
  // calls run_claimed(op) outside its lock, which runs it to its end and
  // throws its error. false: the front start()s it and waits.
  virtual bool claim(const Op&) { return false; }
  virtual void run_claimed(Op&) {}
  // The backend of the communicator `plan` describes, or nullptr for a rank
  // that joins none (color < 0). Collective over this communicator.
  virtual std::unique_ptr<Backend> split(const SplitPlan& plan) = 0;
  // Ends what is in flight with `e` (already recorded in the latch) and tells
  // the peers. Any thread; returns without waiting for the running op.
  virtual void abort(const Error& e) = 0;
  // Once, by the owner: ops not started fail, the running one ends, the
  // peers are told goodbye, threads are joined.
  virtual void shutdown() = 0;
  // Host memory this backend moves best (Communicator::allocate). The
  // default: zeroed, 64-byte aligned host memory.
  virtual std::shared_ptr<void> allocate(size_t bytes);
  // The backend that host-memory operations may go to directly, for now:
  // this one, or, for a wrapper that has nothing to add to them yet (the
  // CUDA staging before its first CUDA tensor), the one it wraps. The front
  // asks again after every operation on device memory.
  virtual Backend* host_path() { return this; }
  // Whether an all-to-all of equal blocks in host memory may come as one
  // OpKind::alltoall op; else the front makes it a batch of sends and
  // receives, which every backend runs.
  virtual bool runs_alltoall() const { return false; }
  // Communicator::register_memory: nullptr where there is nothing to do.
  virtual std::shared_ptr<void> register_memory(const TensorView&) { return nullptr; }
};

// Waits until the store holds keys[q] for every rank q whose key is not
// empty (each rank publishes its own). A timeout is an error naming the
// ranks that never joined ("ranks 3, 5 of 6 never joined"), the loss of the
// store one naming those not seen yet ("... had not joined yet"); `timeout`
// is the setting `deadline` came from, for the message.
void wait_for_ranks(Store& store, const std::vector<std::string>& keys,
                    std::chrono::steady_clock::time_point deadline,
                    std::chrono::milliseconds timeout, const std::string& who,
                    const RankNames& names = RankNames());

// One line of the registry.
struct BackendEntry {
  const char* name;
  bool built;
  // Why this build lacks it, and what to do (when !built).
  const char* why_not_built;
  // "" when it can serve these ranks, else why not. May be null: always.
  std::string (*unusable)(const config::Launch& launch);
  std::unique_ptr<Backend> (*create)(const BackendContext& ctx);
  // Whether it rendezvouses through the store (mpi has MPI's own).
  bool needs_store = true;
  // Whether `auto` may pick it (nccl moves CUDA tensors only: not on its own).
  bool automatic = true;
  // A host backend's runner alone, for a backend built of others' (hier of
  // shm's and tcp's): null for the others.
  std::unique_ptr<HostRunner> (*make_runner)(const BackendContext& ctx) = nullptr;
};

// Every backend collie knows of, in the order `auto` prefers them.
const std::vector<BackendEntry>& backend_registry();

// The entry for `requested` ("auto" or a name), or an error that says why
// it cannot be had (unknown, not built, not usable for these ranks).
const BackendEntry& pick_backend(const std::string& requested, const config::Launch& launch);

// The runner of host backend `name` for `ctx`: how a backend built of
// others' (hier) gets them without naming their folders. The registry's
// (comm/front/registry.cc), which alone knows every backend.
std::unique_ptr<HostRunner> make_host_runner(const std::string& name, const BackendContext& ctx);

}  // namespace collie
