// base/config.h: the one place collie reads environment variables.
//
// Launch settings (rank, world size, rendezvous address, secret) resolve in
// this order: explicit Options; collie's variables (COLLIE_RANK, ...);
// torchrun's (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT); Open MPI's (OMPI_COMM_WORLD_*); SLURM's (SLURM_PROCID,
// SLURM_NTASKS, SLURM_LOCALID). Tuning knobs (COLLIE_TIMEOUT,
// COLLIE_ALLREDUCE_ALGO, ...) are read here too, so that a test can hand in
// a fake environment.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <optional>
#include <string>

#include "collie/comm.h"

namespace collie::config {

// Returns the value of a variable or nullptr; std::getenv by default.
using Env = std::function<const char*(const char*)>;
Env process_env();

struct Launch {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr;  // empty only when world_size == 1
  int master_port = -1;
  // COLLIE_JOB_SECRET or Options::secret ("" when neither): the key of the
  // handshakes' HMAC, never sent (comm/net/auth.h).
  std::string secret;
  // Who the job is ("TORCHELASTIC_RUN_ID=abc, 4 ranks"): compared in clear
  // at every handshake, so that a rank of another job is refused by name.
  std::string job;
  int store_fd = -1;  // listening socket handed down by collie-run (rank 0)
  // COLLIE_LAUNCHER_STORE=1: the launcher (collie-run on node 0) serves the
  // store at master_addr:master_port for the job's life, and rank 0 is one
  // more client, so the store outlives any rank (rank 0 included).
  bool launcher_store = false;
  // COLLIE_STORE_PREFIX: every key this rank puts in the store goes under
  // it. collie-run sets "round<r>/" when the launchers of several nodes
  // share one store across restarts, so that a round's keys never meet an
  // earlier round's.
  std::string store_prefix;
  std::string store_file;  // COLLIE_STORE_FILE: rendezvous through a shared file instead
  std::string source;      // which launcher's variables were used, for messages
  // Why no rendezvous store can be made ("" when one can): an error only
  // for a backend that needs one (mpi does not).
  std::string no_rendezvous;
  std::chrono::milliseconds timeout{300000};
  // COLLIE_DETERMINISTIC=1 or Options::deterministic: all-reduce and
  // reduce-scatter sum in rank order (comm/deterministic.h).
  bool deterministic = false;
  // COLLIE_ARRIVALS=0: the executor does not time each collective, and
  // Communicator::arrivals compares nothing (base/arrivals.h). On by default.
  bool arrivals = true;
  // COLLIE_JOIN=1: this process replaces a lost rank (collie-run --elastic
  // restarts one so): connect() joins the running job, as collie::join()
  // does, instead of meeting the others at the start.
  bool join = false;
  // COLLIE_SPARE=<id> (with COLLIE_JOIN=1): this process is a warm spare
  // that collie-run --elastic --spares K started ahead of any failure: its
  // join waits for as long as it takes, and writes its queue ticket under
  // collie/spare/<id> so that the launcher can tell whether a grow took it.
  std::string spare;
};

Launch resolve_launch(const Options& options, const Env& env);

// Under collie-run (COLLIE_LAUNCHER_STORE=1), where its store is, as the
// environment says now (a communicator that met its peers through another
// store still reaches collie-run's through this); nullopt elsewhere.
struct LauncherStore {
  std::string addr;
  int port = 0;
  std::string secret, job, prefix;
};
std::optional<LauncherStore> launcher_store(const Env& env);
// The job identity a rank of `world_size` ranks resolves from `env`
// (Launch::job), for a launcher that serves the store.
std::string job_identity(const Env& env, int world_size);
// Under collie-run, the key (under the round's prefix) each rank sets once
// it is in the job's world communicator; collie-run --elastic reads them to
// tell a rank lost after the world formed (replaced alone) from one lost
// before (the round starts again).
inline std::string world_formed_key(int rank) {
  return "collie/world/formed/" + std::to_string(rank);
}

// The queue of processes that join a running job (comm/front/grow.cc), as
// collie-run --elastic reads it: how many queued and how many a grow took,
// each ticket's word from the grow (its place, or "refused ..."), and where
// a spare (COLLIE_SPARE=<id>) writes its ticket, so that the launcher can
// tell whether a grow took it.
inline const std::string kJoinQueued = "collie/join/queued";
inline const std::string kJoinTaken = "collie/join/taken";
inline std::string join_ticket_key(int64_t ticket, const char* what) {
  return "collie/join/" + std::to_string(ticket) + "/" + what;
}
inline std::string spare_key(const std::string& id) {
  return "collie/spare/" + id;
}
// Who has a ticket: the grow that takes it ("grow <key>") or, first, the
// launcher of a spare that ended before any grow took it ("withdrawn ..."),
// each by compare_set on this key, so that exactly one of them wins.
inline std::string join_claim_key(int64_t ticket) {
  return join_ticket_key(ticket, "claim");
}

// The environment with COLLIE_TUNING_FILE's settings under it: a file of
// NAME=value lines (# comments), written by `collie-bench --tune`, whose
// names are the tuning variables below (COLLIE_TCP_LATENCY_US, ...). A
// variable set in the environment wins over the file. An unreadable file,
// a line that is not NAME=value, or a name that is not a tuning variable is
// an error naming the file and the line.
Env tuned(const Env& env);
// The settings of a tuning file read from `in` (`path` names it in errors),
// checked as tuned() checks them.
std::map<std::string, std::string> parse_tuning_file(std::istream& in, const std::string& path);

// COLLIE_YIELD_US's default (-1): how long a waiter on a host with more
// ranks than CPUs polls, handing its CPU over between looks, before it
// sleeps (bench/RESULTS.md, "More ranks than CPUs: the CPU handed over").
inline constexpr int kYieldUs = 1000;

// Settings of the TCP backend's algorithm choice and progress loop (read
// through tuned()).
struct TcpTuning {
  std::string allreduce_algo = "auto";  // auto | ring | rd (recursive doubling)
  double latency_us = 20.0;             // cost model: time per message step
  double bandwidth_gbps = 1.5;          // cost model: per-direction bandwidth
  double reduce_gbps = 8.0;             // cost model: reduction throughput
  size_t chunk_bytes = 512 * 1024;      // ring pipelining granularity
  int spin_us = -1;                     // busy-poll before sleeping; -1: auto
  // COLLIE_YIELD_US, as ShmTuning's: with more ranks than CPUs, poll the
  // sockets, handing the CPU over between looks, this long before sleeping.
  int yield_us = -1;
  int socket_buffer_bytes = 0;  // 0: kernel autotuning
  // COLLIE_TCP_SOCKETS: connections to each peer (NCCL's
  // NCCL_NSOCKS_PERTHREAD). A message of at least 2 x lane_min_bytes is cut
  // into one part per connection, at most, each at least lane_min_bytes.
  int sockets_per_peer = 1;
  size_t lane_min_bytes = 64 * 1024;  // COLLIE_TCP_SOCKET_MIN_BYTES
  // COLLIE_TCP_SPLIT_DIRECTIONS: a message of at least split_min_bytes
  // (COLLIE_TCP_SPLIT_MIN_BYTES) goes on connections that carry its
  // direction only (comm/tcp/tcp_mesh.h).
  bool split_directions = true;
  size_t split_min_bytes = 512 * 1024;
};

TcpTuning tcp_tuning(const Env& env);

// Settings of the shared-memory backend.
// Rank 0's chunk and small sizes are every rank's (they set the segment's
// layout and the algorithm): a rank that sets either to another value is
// refused when the segment is shared.
struct ShmTuning {
  size_t chunk_bytes = 256 * 1024;  // COLLIE_SHM_CHUNK: bytes per rank per round
  size_t small_bytes = 16 * 1024;   // COLLIE_SHM_SMALL: one-step all-reduce up to here
  bool chunk_set = false;           // chunk_bytes was given; else shm_auto_chunk decides
  bool small_set = false;           // small_bytes was given
  // COLLIE_SHM_CMA=0: large collectives go through the segment even where
  // a rank may read its peers' memory directly (process_vm_readv).
  bool cma = true;
  int spin_us = -1;  // COLLIE_SPIN_US: spin before sleeping; -1: auto
  // COLLIE_YIELD_US: with more ranks than CPUs, how long a waiter polls,
  // handing its CPU over (sched_yield) between looks, before it sleeps, as
  // Open MPI's oversubscribed ranks do; -1: kYieldUs; 0: sleep at once
  // (the futex hand-offs alone).
  int yield_us = -1;
};

ShmTuning shm_tuning(const Env& env);

// The shm round per rank when COLLIE_SHM_CHUNK is not set, for ranks whose
// cores have `l2` bytes of L2 each (0: unknown): half of it, a power of two
// from 64 KiB to 4 MiB, so that a round's slices stay in the L2 of the rank
// that reduces them; at most 32 MiB of rounds in the whole segment up to
// 256 ranks (2 per
// rank); 256 KiB when the L2 is unknown.
size_t shm_auto_chunk(size_t l2, int ranks);

// COLLIE_CUDA_CHUNK: the piece in which the host backends stage a CUDA
// tensor's all-reduce and broadcast through pinned host memory (the copy of
// one piece overlaps the transfer of the one before). Default 4 MiB.
size_t cuda_chunk_bytes(const Env& env);

// COLLIE_CUDA_BACKEND: how a host communicator moves CUDA tensors:
// "nccl" (an NCCL communicator beside it, made at the first CUDA tensor),
// "staged" (through pinned host memory), or "auto" (the default: nccl where
// this build has it and the rendezvous has a store, else staged).
std::string cuda_route(const Env& env);

// Settings of the MPI backend.
struct MpiSettings {
  int spin_us = -1;  // COLLIE_SPIN_US: test without pausing this long; -1: auto
  // COLLIE_MPI_CHECK: the cross-rank check of each collective. 1 (the
  // default): through shared memory when every rank of the communicator
  // is on one host, else by MPI messages; 2: by MPI messages always (to
  // compare, and to test that path on one host); 0: no check.
  int check = 1;
  // COLLIE_MPI_ALGORITHMS=0: leave Open MPI's non-blocking all-reduce to pick
  // its own algorithm. Also off when Open MPI's own setting is given
  // (OMPI_MCA_coll_libnbc_iallreduce_algorithm: the user chose).
  bool choose_algorithms = true;
  // Whether Open MPI may use shared memory between ranks of one host: false
  // when the user's btl list (OMPI_MCA_btl, which `mpirun --mca btl ...`
  // sets) leaves out vader and sm.
  bool shared_memory_btl = true;
};

MpiSettings mpi_settings(const Env& env);

// Whether this host's ranks each have a core, so that waits may spin: Open
// MPI's own verdict when mpirun gives one (OMPI_MCA_mpi_oversubscribe),
// else local_world_size against `usable_cpus` (this process's CPUs).
// mpirun binds each rank to one core, so the CPU count alone said
// "oversubscribed" for 2 ranks on 2 cores, and tcp, shm and mpi never spun
// under mpirun.
bool ranks_fit_cores(int local_world_size, int usable_cpus, const Env& env);

// COLLIE_HIER_PIECE: the hierarchical all-reduce runs in pieces of this many
// bytes, the network stage of one beside the shared-memory stages of the
// next and the previous; `unset` where the variable is not set (hier: 1 MiB,
// or on crowded hosts the whole message, one piece).
size_t hier_piece_bytes(const Env& env, size_t unset = size_t{1} << 20);

// COLLIE_BACKEND, when Options::backend is "auto".
std::string backend(const Options& options, const Env& env);

// COLLIE_REDUCER_LOG_EVERY: with COLLIE_DEBUG=INFO, the reducer prints its
// timings every this many iterations (default 100).
int reducer_log_every(const Env& env);

// COLLIE_COMM_HOOK: the reducer's default comm hook spec ("" if unset).
std::string comm_hook(const Env& env);

// COLLIE_CHECK_REPLICAS: the reducer checks that every rank holds the same
// parameters every this many synchronised iterations (0, the default: never).
uint64_t check_replicas(const Env& env);

// COLLIE_CHECK_NONFINITE: 1, the reducer looks for NaN and Inf in each
// gradient before it is averaged, and names the rank and the parameter;
// 0 (default) it does not.
bool check_nonfinite(const Env& env);

// COLLIE_CHECK_ACTION: what a failed check does: error (default; every rank
// throws) or warn (every rank logs a warning and goes on).
bool checks_warn(const Env& env);

// COLLIE_HOSTNAME: the host name that groups ranks by host (host_color, the
// post_local_sgd hook's default subgroup) instead of gethostname(), so that
// ranks on one machine can stand for several hosts ("" if unset).
std::string hostname_override(const Env& env);

// COLLIE_BIND: none (default), core (each local rank on its share of the
// cores) or numa (each local rank on one NUMA node, round robin).
std::string bind(const Env& env);

// COLLIE_DEBUG: WARN (default), INFO, DEBUG.
int log_level(const Env& env);

// COLLIE_TRACE: where each rank writes its timeline ("" if unset: no
// trace). A path with %r (replaced by the rank), else a prefix that gets
// ".rank<N>.json" (a trailing ".json" is dropped first); base/trace.h.
std::string trace(const Env& env);

// What collie-run reads from its own environment.
struct LauncherSettings {
  int grace_seconds = 5;          // COLLIE_RUN_GRACE: SIGTERM to SIGKILL, 0..86400
  std::string job_secret;         // COLLIE_JOB_SECRET ("" when unset)
  bool thread_count_set = false;  // OMP_NUM_THREADS or OPENBLAS_NUM_THREADS is set
  // COLLIE_TIMEOUT, as the ranks read it: bounds how long the launchers of
  // several nodes wait for each other at the end of a round.
  std::chrono::milliseconds timeout{300000};
};
LauncherSettings launcher_settings(const Env& env);

// The fake backend's failure injection (comm/fake/): COLLIE_FAKE_SHUFFLE=SEED
// reports completions in a random order (sends late) drawn from SEED;
// COLLIE_FAKE_VANISH=RANK:POSTS makes rank RANK vanish, as a killed process
// would, when it posts its POSTS-th message.
struct FakeInjection {
  uint64_t shuffle_seed = 0;  // 0: in order
  int vanish_rank = -1;       // -1: nobody
  size_t vanish_after_posts = 0;
};
FakeInjection fake_injection(const Env& env);

}  // namespace collie::config
