// comm/hier/hier_backend.cc: hosts found through the store, then shm inside
// each host and tcp between them.
#include "comm/hier/hier_backend.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "base/reduce.h"
#include "base/topology.h"
#include "base/trace.h"
#include "comm/hier/hier_choose.h"
#include "comm/host_executor.h"

namespace collie::hier {

namespace {

// Where this rank's host stands among the communicator's.
struct Hosts {
  int count = 0;            // hosts
  int index = 0;            // this rank's host, hosts numbered by their lowest rank
  std::vector<int> local;   // the ranks on this host, ascending
  int local_index = 0;      // this rank's place in `local`
  bool even = true;         // every host has local.size() ranks
  std::vector<int> across;  // the rank at this local_index on each host, in host order
  bool crowded = false;     // some host has more busy threads than CPUs (hier_choose.h)
};

// Whether this rank's host is crowded while hier runs (hier_choose.h).
bool host_crowded(const BackendContext& ctx) {
  return hier::host_crowded(ctx.launch.local_world_size, topology::usable_cpus(), ctx.env);
}

Hosts find_hosts(const BackendContext& ctx) {
  const int me = ctx.launch.rank, n = ctx.launch.world_size;
  if (n == 1) return Hosts{1, 0, {0}, 0, true, {0}};  // and no store to ask
  // "<crowded: 0 or 1> <host identity>": the choice of hier_choose.h must be
  // the same on every rank, and hosts may differ in cores.
  const std::string id = topology::host_identity(config::hostname_override(ctx.env));
  const std::string prefix = ctx.key + "/hier/host/";
  const std::string said = std::string(host_crowded(ctx) ? "1 " : "0 ") + id;
  ctx.store->set(prefix + std::to_string(me), to_bytes(said));
  std::vector<std::string> keys;
  for (int q = 0; q < n; ++q) keys.push_back(q == me ? "" : prefix + std::to_string(q));
  wait_for_ranks(*ctx.store, keys, std::chrono::steady_clock::now() + ctx.launch.timeout,
                 ctx.launch.timeout, ctx.names(me) + " (finding the hosts)", ctx.names);
  std::map<std::string, int> host_of_id;
  std::vector<std::vector<int>> ranks_of_host;
  std::vector<int> host(n);
  bool crowded = false;
  for (int q = 0; q < n; ++q) {
    std::string their = q == me ? said : to_string(ctx.store->get(keys[q]));
    crowded = crowded || their.rfind("1 ", 0) == 0;
    their = their.substr(std::min<size_t>(2, their.size()));
    auto [it, fresh] = host_of_id.try_emplace(their, static_cast<int>(ranks_of_host.size()));
    if (fresh) ranks_of_host.emplace_back();
    host[q] = it->second;
    ranks_of_host[it->second].push_back(q);
  }
  Hosts h;
  h.crowded = crowded;
  h.count = static_cast<int>(ranks_of_host.size());
  h.index = host[me];
  h.local = ranks_of_host[h.index];
  h.local_index = static_cast<int>(std::find(h.local.begin(), h.local.end(), me) - h.local.begin());
  for (const auto& r : ranks_of_host) h.even = h.even && r.size() == h.local.size();
  if (h.even)
    for (const auto& r : ranks_of_host) h.across.push_back(r[h.local_index]);
  return h;
}

// `env` (through the tuning file) with `name` reading "0" where neither
// sets it.
config::Env zero_unless_set(const config::Env& env, const char* name) {
  return [env = config::tuned(env), name](const char* asked) -> const char* {
    if (const char* v = env(asked)) return v;
    return std::strcmp(asked, name) == 0 ? "0" : nullptr;
  };
}

// The context of a runner over `members` (ranks of ctx), this rank being
// members[rank]. A stage of the hierarchical all-reduce (`staged`) counts
// the threads beside it; the flat mesh runs alone, as tcp does.
BackendContext part(const BackendContext& ctx, const std::string& name, int rank,
                    const std::vector<int>& members, bool staged = true) {
  BackendContext c = ctx;
  c.launch.rank = rank;
  c.launch.world_size = static_cast<int>(members.size());
  c.key = ctx.key + "/" + name;
  c.names = ctx.names.of(members);
  if (!staged) return c;
  // Spinning pays only while every busy thread has a core: tcp counts the
  // threads beside the host's ranks (busy_threads_on_host), shm beside the
  // awake ones (Segment::core_free).
  c.beside_per_rank = kBesideEachStage;
  // Nor does handing the CPU over between looks (COLLIE_YIELD_US) where
  // that makes the host look crowded: a stage polling would take turns with
  // its own rank's other stage (hier_collectives_2x2 took 44-48 s with it
  // against 20-30). Unless the user sets it (or a tuning file does).
  c.env = zero_unless_set(ctx.env, "COLLIE_YIELD_US");
  return c;
}

// The context of a stage that runs alone on crowded hosts (a small
// all-reduce's two, an all-reduce of one piece): its waiters hand the CPU
// over at once, never spinning (unless the user sets
// COLLIE_SPIN_US, or a tuning file does). The job is crowded though this
// host's ranks may fit its CPUs (hier_choose.h: a launcher's verdict, or
// another host's): other hosts' ranks may share them unseen, and a spinner
// holds the CPU that the rank it waits for needs. 2 hosts x 2 ranks on 2
// cores: 8 B to 2 KiB in 15-22 us, against 22-25 with shm's spin
// (bench/RESULTS.md, "Two hosts on a shaped link").
BackendContext crowded(BackendContext c) {
  c.crowded = true;
  c.env = zero_unless_set(c.env, "COLLIE_SPIN_US");
  return c;
}

// A thread that runs one stage at a time beside the executor's thread: the
// all-reduce across hosts of one piece while the executor's thread runs the
// shared-memory stages of the next piece and the previous one.
class Beside {
 public:
  ~Beside() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  void post(std::function<void()> fn) {
    std::lock_guard lk(mu_);
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    job_ = std::move(fn);
    busy_ = true;
    cv_.notify_all();
  }
  // Waits for the posted stage; returns what it threw.
  std::optional<Error> join() {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return !busy_; });
    return std::exchange(error_, std::nullopt);
  }

 private:
  void loop() {
    std::unique_lock lk(mu_);
    for (;;) {
      cv_.wait(lk, [&] { return stop_ || job_; });
      if (!job_) return;
      auto fn = std::exchange(job_, nullptr);
      lk.unlock();
      std::optional<Error> e;
      try {
        fn();
      } catch (const Error& x) {
        e = x;
      } catch (const std::exception& x) {
        e = Error(ErrorCode::internal, x.what());
      }
      lk.lock();
      error_ = std::move(e);
      busy_ = false;
      cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> job_;
  std::optional<Error> error_;
  bool busy_ = false, stop_ = false;
  std::thread thread_;
};

class HierRunner final : public HostRunner {
 public:
  explicit HierRunner(const BackendContext& ctx)
      : hosts_(find_hosts(ctx)),
        me_(ctx.launch.rank),
        n_(ctx.launch.world_size),
        // Crowded hosts: one piece, the whole message, unless the user sets
        // COLLIE_HIER_PIECE (hier_choose.h).
        piece_bytes_(hosts_.crowded ? config::hier_piece_bytes(ctx.env, hier::kCrowdedPieceBytes)
                                    : config::hier_piece_bytes(ctx.env)),
        failure_(ctx.failure) {
    // The same order on every rank: the mesh of all ranks, then the host's
    // segment, then the mesh across hosts.
    const int L = static_cast<int>(hosts_.local.size());
    if (hosts_.count > 1) {
      std::vector<int> all(n_);
      for (int q = 0; q < n_; ++q) all[q] = q;
      flat_ = make_host_runner("tcp", part(ctx, "flat", me_, all, false));
    }
    if (hosts_.count == 1 || (L > 1 && hosts_.even)) {
      // One host: no stage across hosts runs beside it (exactly shm).
      local_ = make_host_runner("shm", part(ctx, "h" + std::to_string(hosts_.index),
                                            hosts_.local_index, hosts_.local, hosts_.count > 1));
      local_name_ = "inside host " + std::to_string(hosts_.index) + " (ranks " +
                    ctx.names.list(hosts_.local) + ")";
    }
    if (local_ && flat_) {
      across_ = make_host_runner(
          "tcp", part(ctx, "x" + std::to_string(hosts_.local_index), hosts_.index, hosts_.across));
      across_name_ = "across hosts (ranks " + ctx.names.list(hosts_.across) + ")";
    }
    if (across_ && hosts_.crowded) {
      // For the stages that run alone on crowded hosts (hier_choose.h): the
      // small all-reduces' two, and an all-reduce of one piece.
      alone_local_ =
          make_host_runner("shm", crowded(part(ctx, "s" + std::to_string(hosts_.index),
                                               hosts_.local_index, hosts_.local, false)));
      alone_across_ =
          make_host_runner("tcp", crowded(part(ctx, "y" + std::to_string(hosts_.local_index),
                                               hosts_.index, hosts_.across, false)));
    }
  }

 private:
  void run_collective(const Op& op, Deadline dl) override {
    if (!flat_) return local_->run_collective(op, dl);  // one host
    if (two_stage(op)) {
      trace::algorithm(op, "two stages");  // all-reduce inside hosts, then across
      return two_stage_allreduce(op, dl);
    }
    if (hierarchical(op)) {
      trace::algorithm(op, "hierarchical");  // shm inside hosts, tcp across
      return allreduce(op, dl);
    }
    flat_->run_collective(op, dl);
  }

  void run_p2p(P2pBatch& batch, Deadline dl) override {
    (flat_ ? flat_ : local_)->run_p2p(batch, dl);
  }

  // The one-host and flat paths hand the op itself on, so their runner's
  // answer; the hierarchical all-reduce's stages are ops of their own, and
  // the executor searches this rank's input before them.
  bool searches_nonfinite(const Op& op) const override {
    if (!flat_) return local_->searches_nonfinite(op);
    if (two_stage(op) || hierarchical(op)) return false;
    return flat_->searches_nonfinite(op);
  }

  // Whether `op` is an all-reduce across hosts of equal rank counts, and
  // which way it goes (hier_choose.h); any other op runs on the flat mesh.
  bool two_stage(const Op& op) const {
    return op.desc.op == OpKind::allreduce && alone_across_ &&
           hier::two_stage_allreduce(op.in.nbytes(), hosts_.crowded);
  }
  bool hierarchical(const Op& op) const {
    return op.desc.op == OpKind::allreduce && across_ && !two_stage(op);
  }

  void abort_peers(const Error& e) noexcept override {
    for (HostRunner* r : runners()) r->abort_peers(e);
  }
  void close() noexcept override {
    for (HostRunner* r : runners()) r->close();
  }
  void wake() noexcept override {
    for (HostRunner* r : runners()) r->wake();
  }

  std::vector<HostRunner*> runners() const {
    std::vector<HostRunner*> v;
    for (const auto* r : {&flat_, &local_, &across_, &alone_local_, &alone_across_})
      if (*r) v.push_back(r->get());
    return v;
  }

  // One stage of a hierarchical all-reduce on `runner`, numbered in its own
  // sequence (shm's slots alternate by operation number).
  void stage(HostRunner& runner, uint32_t& seq, const std::string& where, const Op& parent,
             OpKind kind, TensorView in, TensorView out, ReduceOp redop, Deadline dl) {
    Op op;
    op.desc.op = kind;
    op.desc.dtype = in.dtype;
    op.desc.redop = redop;
    op.desc.seq = ++seq;
    op.desc.count = in.numel;
    op.in = in;
    op.out = out;
    try {
      runner.run_collective(op, dl);
    } catch (const Error& e) {
      throw Error(e.code(), parent.desc.describe() + " on rank " + std::to_string(me_) + ", " +
                                op.desc.describe() + " " + where + ": " + e.what());
    }
  }

  // A small all-reduce on crowded hosts: every rank of a host ends with the
  // host's sum (the same bits on each), then the ranks of each local index
  // all-reduce those across hosts: the same inputs on every comm across, so
  // the same bits everywhere.
  void two_stage_allreduce(const Op& op, Deadline dl) {
    const ReduceOp red = op.desc.redop == ReduceOp::avg ? ReduceOp::sum : op.desc.redop;
    stage(*alone_local_, alone_local_seq_, local_name_, op, OpKind::allreduce, op.in, op.out, red,
          dl);
    stage(*alone_across_, alone_across_seq_, across_name_, op, OpKind::allreduce, op.out, op.out,
          red, dl);
    if (op.desc.redop == ReduceOp::avg)
      kernels::divide(op.out.dtype, op.out.data, op.out.data, op.out.numel, n_);
  }

  // Pieces of whole multiples of L elements, pipelined: reduce-scatter of
  // piece k, then (while piece k crosses the network beside) all-gather of
  // piece k - 1. The last count % L elements go after, in one step.
  void allreduce(const Op& op, Deadline dl) {
    const size_t L = hosts_.local.size(), count = op.in.numel, li = hosts_.local_index;
    const size_t es = dtype_size(op.in.dtype);
    const size_t piece = std::max<size_t>(piece_bytes_ / es / L, 1) * L;
    const size_t body = count / L * L, pieces = (body + piece - 1) / piece;
    const ReduceOp red = op.desc.redop == ReduceOp::avg ? ReduceOp::sum : op.desc.redop;
    auto whole = [&](size_t k) {
      return op.out.slice(k * piece, std::min(piece, body - k * piece));
    };
    auto mine = [&](size_t k) {
      TensorView w = whole(k);
      return w.slice(li * (w.numel / L), w.numel / L);
    };
    auto finish = [&](TensorView v) {
      if (op.desc.redop == ReduceOp::avg) kernels::divide(v.dtype, v.data, v.data, v.numel, n_);
    };
    // One piece runs its stages in this thread, none beside it: on crowded
    // hosts, on the runners that run alone (hier_choose.h).
    const bool alone = pieces <= 1 && alone_local_;
    HostRunner& inside = alone ? *alone_local_ : *local_;
    HostRunner& between = alone ? *alone_across_ : *across_;
    uint32_t& inside_seq = alone ? alone_local_seq_ : local_seq_;
    uint32_t& between_seq = alone ? alone_across_seq_ : across_seq_;
    auto local = [&](OpKind kind, TensorView in, TensorView out) {
      stage(inside, inside_seq, local_name_, op, kind, in, out, red, dl);
    };
    auto across = [&](TensorView v) {
      stage(between, between_seq, across_name_, op, OpKind::allreduce, v, v, red, dl);
    };
    auto gather = [&](size_t k) {
      finish(mine(k));
      local(OpKind::allgather, mine(k), whole(k));
    };
    if (pieces == 1) {  // nothing to overlap: no thread hand-offs
      local(OpKind::reduce_scatter, op.in.slice(0, body), mine(0));
      across(mine(0));
      gather(0);
    } else if (pieces > 1) {
      bool posted = false;
      try {
        for (size_t k = 0; k < pieces; ++k) {
          local(OpKind::reduce_scatter, op.in.slice(k * piece, whole(k).numel), mine(k));
          if (posted) {
            posted = false;
            if (auto e = beside_.join()) throw *e;
          }
          beside_.post([&, v = mine(k)] { across(v); });
          posted = true;
          if (k > 0) gather(k - 1);
        }
        posted = false;
        if (auto e = beside_.join()) throw *e;
        gather(pieces - 1);
      } catch (const Error& e) {
        // The stage beside may still write into the output: stop it (the
        // latch ends its wait) and wait for it before reporting.
        if (posted && e.code() == ErrorCode::timeout && Deadline::clock::now() >= dl) {
          // A stage inside the host timed out waiting for a host mate, which
          // is itself stuck across hosts; the stage beside has the same
          // deadline, now passed, so it ends by itself at once. Its error
          // names the rank on the other host that is missing, where this
          // one named only the host mate; and with the latch left clear the
          // executor asks every rank where it is (the stall inspector).
          if (auto beside = beside_.join()) throw *beside;
          throw;
        }
        if (posted) {
          failure_->set(e);
          across_->wake();
          beside_.join();
        }
        throw;
      }
    }
    if (size_t rest = count - body) {
      // Every local rank all-reduces the same tail across hosts: the same
      // inputs on every comm across, so the same bits everywhere.
      TensorView tail = op.out.slice(body, rest);
      local(OpKind::allreduce, op.in.slice(body, rest), tail);
      across(tail);
      finish(tail);
    }
  }

  const Hosts hosts_;
  const int me_, n_;
  const size_t piece_bytes_;
  const std::shared_ptr<FailureLatch> failure_;
  Beside beside_;  // after the runners: its thread ends before they go
  std::unique_ptr<HostRunner> flat_, local_, across_, alone_local_, alone_across_;
  std::string local_name_, across_name_;
  uint32_t local_seq_ = 0, across_seq_ = 0, alone_local_seq_ = 0, alone_across_seq_ = 0;
};

std::unique_ptr<HostRunner> make_runner(const BackendContext& ctx) {
  return std::make_unique<HierRunner>(ctx);
}

}  // namespace

BackendEntry backend_entry() {
  return {"hier", true, "", nullptr,
          [](const BackendContext& ctx) { return make_host_backend("hier", &make_runner, ctx); }};
}

}  // namespace collie::hier
