// comm/front/communicator.cc: connect(): resolve the launch settings, make the
// rendezvous store (once, whichever backend runs), pick the backend from the
// registry and put the communicator front over it.
#include <unistd.h>

#include <atomic>
#include <climits>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "base/config.h"
#include "base/log.h"
#include "base/topology.h"
#include "base/trace.h"
#include "collie/comm.h"
#include "comm/backend.h"
#include "comm/cuda/staged_backend.h"
#include "comm/front/context.h"
#include "comm/front/front.h"
#include "comm/front/grow.h"

namespace collie {

namespace {

// Rank 0's store server, one per process and port. A program may connect,
// destroy and connect again (a second DDP from Python does): a peer's second
// connect can reach rank 0 before rank 0 has destroyed its first
// communicator, so the server outlives communicators and each connect keys
// its rendezvous apart (connect() numbers them). The listening socket
// collie-run hands down (COLLIE_STORE_FD) is adopted once only.
std::shared_ptr<TcpStoreServer> store_server(int port, const config::Launch& launch) {
  static std::mutex mu;
  static std::shared_ptr<TcpStoreServer> serving;
  // The COLLIE_STORE_FD socket a server adopted (and closes when it goes):
  // the variable may outlive the connect that gave it, and a later connect
  // must not adopt the same socket twice. Another number, or the same number
  // once that server has gone, is a socket of its own (Python's bootstrap
  // through PyTorch's store binds a new one for each communicator).
  static int adopted_fd = -1;
  static std::weak_ptr<TcpStoreServer> adopted_by;
  std::lock_guard<std::mutex> lock(mu);
  int fd = launch.store_fd;
  if (fd >= 0 && fd == adopted_fd && !adopted_by.expired()) fd = -1;
  if (serving && fd < 0 && (port <= 0 || serving->port() == port)) return serving;
  serving = TcpStoreServer::start(port < 0 ? 0 : port, {launch.secret, launch.job}, fd);
  if (fd >= 0) {
    adopted_fd = fd;
    adopted_by = serving;
  }
  return serving;
}

// The store every rank rendezvous through, and the address this rank's
// peers reach it on.
void make_rendezvous(const Options& options, BackendContext& ctx) {
  const config::Launch& launch = ctx.launch;
  std::string who = "rank " + std::to_string(launch.rank);
  if (options.store || !launch.store_file.empty()) {
    ctx.store = options.store
                    ? options.store
                    : std::shared_ptr<Store>(make_file_store(launch.store_file, launch.timeout));
    ctx.serves_store = options.store && launch.rank == 0;
    // Peers find this rank by the address it publishes: loopback when every
    // rank is on this host, else this host's name.
    if (launch.local_world_size < launch.world_size) {
      char host[256] = {0};
      gethostname(host, sizeof host - 1);
      ctx.listen_host = host;
    } else {
      ctx.listen_host = "127.0.0.1";
    }
  } else if (launch.world_size > 1) {
    if (!launch.no_rendezvous.empty())
      throw Error(ErrorCode::invalid_argument, launch.no_rendezvous);
    std::shared_ptr<TcpStoreServer> server;
    int port = launch.master_port;
    // Under collie-run the launcher serves the store, and rank 0 is one
    // more client: the store outlives any rank.
    if (launch.rank == 0 && !launch.launcher_store) server = store_server(port, launch);
    if (server) port = server->port();
    auto client =
        TcpStore::connect(launch.master_addr, port, {launch.secret, launch.job}, launch.timeout,
                          who, launch.launcher_store ? "collie-run on node 0" : "rank 0");
    ctx.listen_host = client->local_address();
    ctx.store = std::move(client);
    ctx.keep_alive = server;
    ctx.serves_store = server != nullptr;
    ctx.store_is_launchers = launch.launcher_store;
  }
  if (ctx.store && !options.store && !launch.store_prefix.empty())
    ctx.store = std::make_shared<PrefixStore>(ctx.store, launch.store_prefix);
}

// Which of this rank's job-wide connects through this store this one is
// (0, 1, ...): every rank makes the same sequence of them, and the k-th
// keys its rendezvous apart from the earlier ones, whose keys may still sit
// in the store (a file store, rank 0's kept server). Counted per rank and
// per store (the caller's Store object, the file, or the address), so that
// ranks that are threads of one process (the fake backend's) agree on it as
// ranks in processes of their own do.
int connect_number(const Options& options, const config::Launch& launch) {
  static std::mutex mu;
  static std::map<std::weak_ptr<Store>, std::map<int, int>, std::owner_less<std::weak_ptr<Store>>>
      by_store;
  static std::map<std::string, std::map<int, int>> by_address;
  std::lock_guard lk(mu);
  if (options.store) return by_store[options.store][launch.rank]++;
  const std::string where = !launch.store_file.empty()
                                ? "file " + launch.store_file
                                : launch.master_addr + ":" + std::to_string(launch.master_port);
  return by_address[where][launch.rank]++;
}

// The backend `entry` makes for `ctx`. A host backend takes CUDA tensors
// too, staged through pinned memory, where this build has CUDA (the device
// is touched only when one comes). Where NCCL is built, they go to an NCCL
// communicator made beside it.
std::unique_ptr<Backend> made_backend(const BackendEntry& entry, const BackendContext& ctx) {
  std::unique_ptr<Backend> backend = entry.create(ctx);
  if (backend->accepts(Device::cpu()))
    if (auto api = cuda::device_api()) {
      cuda::DeviceFactory nccl;
      for (const BackendEntry& e : backend_registry())
        if (std::string_view(e.name) == "nccl" && e.built) nccl = e.create;
      backend = cuda::make_staged(std::move(backend), std::move(api), ctx, std::move(nccl));
    }
  return backend;
}

std::unique_ptr<Backend> make_backend(const BackendEntry& entry, const BackendContext& ctx) {
  std::unique_ptr<Backend> backend;
  try {
    backend = made_backend(entry, ctx);
  } catch (const Error& e) {
    done_with_store(ctx, &e);
    throw;
  }
  done_with_store(ctx, nullptr);
  return backend;
}

// COLLIE_TRACE: puts this rank's trace on rank 0's clock, so that the files
// of ranks on several hosts line up as they are. NTP's estimate (RFC 5905,
// section 8, with rank 0 answering at once): rank r sends its time t1, rank
// 0 answers with its own t2, and r, receiving at t3, takes t2 - (t1 + t3)
// / 2, from the round trip with the smallest t3 - t1, whose half bounds
// the error. Rank 0 answers each rank in turn. Only the first job-wide
// communicator of a process measures (the later ones find the clock
// started), on every rank alike.
//
// COLLIE_TRACE may be set on some ranks only: a pair measures only when
// both trace, which each learns from the other's word in the store
// (trace_clock_key: every rank writes "1" or "0" before its backend
// starts, so the word is there to be read, never waited for in vain).
std::string trace_clock_key(const std::string& comm_key, int rank) {
  return comm_key + "/trace-clock/" + std::to_string(rank);
}

void say_whether_tracing(const BackendContext& ctx) {
  if (ctx.store && ctx.launch.world_size > 1)
    ctx.store->set(trace_clock_key(ctx.key, ctx.launch.rank),
                   to_bytes(ctx.trace && !ctx.trace->clock_started() ? "1" : "0"));
}

void align_trace_clock(Communicator& comm, trace::Sink& sink, const BackendContext& ctx) {
  constexpr int kRounds = 8;
  trace::Nanos offset = 0, best_rtt = 0;
  std::string how = "rank 0: the ranks that trace are on its clock";
  auto traces = [&](int r) {
    return to_string(ctx.store->get(trace_clock_key(ctx.key, r))) == "1";
  };
  if (!ctx.store) {
    sink.start_clock(0, 0,
                     "not measured (each host's own clock): this backend has no store through "
                     "which the ranks could agree to measure");
    return;
  }
  if (comm.rank() != 0 && !traces(0)) {
    sink.start_clock(0, 0, "not measured (this host's own clock): rank 0 writes no trace");
    return;
  }
  {
    trace::Sink::Mute mute(sink);  // the measurement is no part of the job's timeline
    int64_t t = 0;
    const TensorView v = view_of(&t, 1);
    try {
      if (comm.rank() == 0) {
        for (int r = 1; r < comm.size(); ++r) {
          if (!traces(r)) continue;
          for (int k = 0; k < kRounds; ++k) {
            comm.recv(v, r).wait();
            t = trace::now();
            comm.send(v, r).wait();
          }
        }
      } else {
        best_rtt = INT64_MAX;
        for (int k = 0; k < kRounds; ++k) {
          const trace::Nanos t1 = trace::now();
          t = t1;
          comm.send(v, 0).wait();
          comm.recv(v, 0).wait();
          const trace::Nanos t3 = trace::now();
          if (t3 - t1 < best_rtt) {
            best_rtt = t3 - t1;
            offset = t - t1 - (t3 - t1) / 2;
          }
        }
        how = "against rank 0, the fastest of " + std::to_string(kRounds) + " round trips";
      }
    } catch (const Error& e) {
      // A backend that takes no host memory (nccl) refuses the messages on
      // every rank alike; anything else (a peer lost) is connect()'s failure.
      if (e.code() != ErrorCode::invalid_argument) throw;
      offset = best_rtt = 0;
      how = std::string("not measured (each host's own clock): ") + e.what();
    }
  }
  sink.start_clock(offset, best_rtt, how);
}

}  // namespace

std::vector<std::string> available_backends() {
  std::vector<std::string> v;
  for (const auto& b : backend_registry())
    if (b.built) v.push_back(b.name);
  return v;
}

namespace {

// join(): the launch and the store as connect() makes them, then a place
// in a communicator that grows by this process (comm/front/grow.h).
std::unique_ptr<Communicator> join_job(const Options& options, BackendContext ctx) {
  const std::string who = ctx.launch.spare.empty()
                              ? "join (rank " + std::to_string(ctx.launch.rank) + "'s replacement)"
                              : "join (spare " + ctx.launch.spare + ")";
  if (ctx.launch.world_size < 2 && !options.store)
    throw Error(ErrorCode::invalid_argument,
                who + ": no job to join: the launch variables say a world of one rank");
  if (!options.store && !ctx.launch.launcher_store && ctx.launch.store_file.empty())
    throw Error(ErrorCode::invalid_argument,
                who +
                    ": the job's store must outlive its ranks (collie-run's, with "
                    "COLLIE_LAUNCHER_STORE=1; a file store; or Options::store): under "
                    "another launcher, rank 0 serves it and a lost rank 0 takes it along");
  ctx.key = "collie/join";
  ctx.failure = std::make_shared<FailureLatch>();
  make_rendezvous(options, ctx);
  std::string backend;
  BackendContext c = joiner_context(ctx, ctx.launch.timeout, backend);
  const BackendEntry& entry = pick_backend(backend, c.launch);
  c.backend_name = entry.name;
  c.trace = trace::Sink::open(config::trace(c.env), c.launch.rank, c.launch.world_size);
  c.remake = [&entry](const BackendContext& x) { return make_backend(entry, x); };
  return make_front(c, make_backend(entry, c));
}

}  // namespace

std::unique_ptr<Communicator> join(const Options& options) {
  BackendContext ctx;
  ctx.env = config::process_env();
  ctx.launch = config::resolve_launch(options, ctx.env);
  return join_job(options, std::move(ctx));
}

std::unique_ptr<Communicator> connect(const Options& options) {
  BackendContext ctx;
  ctx.env = config::process_env();
  ctx.launch = config::resolve_launch(options, ctx.env);
  // A rank that collie-run --elastic restarted joins the running job.
  if (ctx.launch.join) return join_job(options, std::move(ctx));
  // Nothing said how many ranks there are: a world of one, which may be
  // meant (a test, a notebook) or may be ranks started by hand that will
  // each train alone. Said once per process, never an error.
  if (ctx.launch.source == "none" && ctx.launch.world_size == 1 && options.world_size < 0) {
    static std::once_flag said;
    std::call_once(said, [] {
      log::warn(
          "no launcher variables are set (RANK and WORLD_SIZE, COLLIE_RANK, "
          "OMPI_COMM_WORLD_RANK, SLURM_PROCID): this process is a world of one rank. Start "
          "the ranks with collie-run, torchrun, mpirun or srun (from Python: collie.spawn, or "
          "torch.distributed.init_process_group before collie's first communicator)");
    });
  }
  // Before any of this communicator's threads start, so that they inherit it.
  if (std::string how = config::bind(ctx.env); how != "none")
    log::info("rank " + std::to_string(ctx.launch.rank) + ": COLLIE_BIND=" + how +
              ", bound to CPUs " +
              topology::bind(how, ctx.launch.local_rank, ctx.launch.local_world_size));
  const BackendEntry& entry = pick_backend(config::backend(options, ctx.env), ctx.launch);
  const int k = connect_number(options, ctx.launch);
  ctx.key = k == 0 ? "collie/world" : "collie/world." + std::to_string(k);
  ctx.failure = std::make_shared<FailureLatch>();
  if (entry.needs_store || options.store) make_rendezvous(options, ctx);
  ctx.inspector = StallInspector::start(ctx.store, ctx.key, ctx.launch.rank, ctx.launch.world_size,
                                        ctx.launch.timeout);
  ctx.arrivals = arrivals::log_for(ctx.launch.world_size, ctx.launch.arrivals);
  log::info("rank " + std::to_string(ctx.launch.rank) + " of " +
            std::to_string(ctx.launch.world_size) + ": backend " + entry.name +
            ", launch variables from " + ctx.launch.source);
  ctx.trace = trace::Sink::open(config::trace(ctx.env), ctx.launch.rank, ctx.launch.world_size);
  if (ctx.store) ctx.remake = [&entry](const BackendContext& c) { return make_backend(entry, c); };
  ctx.backend_name = entry.name;
  say_whether_tracing(ctx);
  auto comm = make_front(ctx, make_backend(entry, ctx));
  // Under collie-run, that this rank is in the job's world: --elastic
  // replaces a rank lost after every rank is in (the others can grow by
  // one), and starts the whole round again for one lost before (the others
  // still wait for it in the rendezvous; comm/launch/job_signals.cc).
  if (ctx.store && ctx.store_is_launchers && k == 0)
    ctx.store->set(config::world_formed_key(ctx.launch.rank), to_bytes("1"));
  if (ctx.trace && !ctx.trace->clock_started()) align_trace_clock(*comm, *ctx.trace, ctx);
  return comm;
}

}  // namespace collie
