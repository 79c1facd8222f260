// comm/fake/fake_backend.cc: the fake backend: joining rank 0's in-process
// network through the store, and a HostRunner over it.
#include "comm/fake/fake_backend.h"

#include <unistd.h>

#include <map>
#include <mutex>

#include "comm/algorithms/algorithms.h"
#include "comm/fake/fake_network.h"

namespace collie::fake {

namespace {

// The networks of this process that ranks are still joining, by name.
struct Joining {
  std::shared_ptr<FakeNetwork> net;
  int joined = 0;
};
std::mutex g_mu;
std::map<std::string, Joining> g_joining;
uint64_t g_made = 0;

FakeOptions options(const BackendContext& ctx) {
  const config::FakeInjection f = config::fake_injection(ctx.env);
  FakeOptions o;
  o.shuffle = f.shuffle_seed != 0;
  o.seed = f.shuffle_seed;
  o.vanish_rank = f.vanish_rank;
  o.vanish_after_posts = f.vanish_after_posts;
  return o;
}

// This rank's share of the communicator's network: rank 0 makes it and
// names it in the store; the others take it from this process's table.
std::shared_ptr<FakeNetwork> join(const BackendContext& ctx) {
  const int rank = ctx.launch.rank, n = ctx.launch.world_size;
  if (n == 1) return std::make_shared<FakeNetwork>(1, options(ctx));
  const std::string key = ctx.key + "/fake/network";
  const std::string pid = std::to_string(::getpid());
  if (rank == 0) {
    auto net = std::make_shared<FakeNetwork>(n, options(ctx));
    std::string name;
    {
      std::lock_guard lk(g_mu);
      name = pid + "/" + std::to_string(g_made++);
      g_joining[name] = {net, 1};
    }
    ctx.store->set(key, to_bytes(name));
    return net;
  }
  std::string name;
  try {
    name = to_string(ctx.store->get(key, ctx.launch.timeout));
  } catch (const Error& e) {
    if (e.code() != ErrorCode::timeout) throw;
    throw Error(ErrorCode::timeout, ctx.names(rank) +
                                        ": rank 0 made no fake network within the timeout "
                                        "(did rank 0 connect with backend \"fake\"?): " +
                                        e.what());
  }
  std::lock_guard lk(g_mu);
  auto it = g_joining.find(name);
  if (it == g_joining.end()) {
    const std::string theirs = name.substr(0, name.find('/'));
    throw Error(ErrorCode::invalid_argument,
                ctx.names(rank) + " (process " + pid +
                    ") cannot join the fake backend's network of rank 0" +
                    (theirs != pid ? " (process " + theirs + ")" : "") +
                    ": every rank of a fake communicator must be a thread of one process");
  }
  std::shared_ptr<FakeNetwork> net = it->second.net;
  if (++it->second.joined == n) g_joining.erase(it);
  return net;
}

class FakeRunner final : public HostRunner {
 public:
  FakeRunner(const BackendContext& ctx, std::shared_ptr<FakeNetwork> net)
      : net_(std::move(net)),
        rank_(ctx.launch.rank),
        names_(ctx.names),
        failure_(ctx.failure),
        tuning_(config::tcp_tuning(ctx.env)) {}

 private:
  bool runs_alltoall() const override { return true; }
  // algo::run_collective's all-reduces search as they reduce (op.seen).
  bool searches_nonfinite(const Op& op) const override { return op.desc.op == OpKind::allreduce; }

  void run_collective(const Op& op, Deadline deadline) override {
    guarded([&] {
      algo::Ctx c{net_->endpoint(rank_), op.desc, tuning_.chunk_bytes, scratch_, deadline};
      algo::run_collective(c, op, tuning_);
    });
  }

  void run_p2p(P2pBatch& batch, Deadline deadline) override {
    guarded([&] { algo::run_p2p(net_->endpoint(rank_), batch, deadline); });
  }

  // The network's errors as a real backend's: a vanished rank's own thread
  // gets an error that says it was made to vanish; a lost peer is recorded
  // in the latch, for shrink.
  template <class F>
  void guarded(F&& f) {
    try {
      f();
    } catch (const Vanished&) {
      throw Error(ErrorCode::aborted,
                  names_(rank_) + " vanished (the fake backend's COLLIE_FAKE_VANISH)");
    } catch (const Error& e) {
      if (e.code() == ErrorCode::peer_lost && failure_)
        for (int q : net_->gone()) failure_->lost(names_[q]);
      throw;
    }
  }

  void abort_peers(const Error& e) noexcept override { net_->abort(rank_, e); }
  void close() noexcept override { net_->close(rank_); }
  void wake() noexcept override {
    // Another thread aborted: the run in progress ends with the latch's error.
    if (failure_ && failure_->failed())
      net_->abort(rank_, *failure_->get());
    else
      net_->wake(rank_);
  }

  std::shared_ptr<FakeNetwork> net_;
  const int rank_;
  const RankNames names_;
  std::shared_ptr<FailureLatch> failure_;
  const config::TcpTuning tuning_;
  algo::Scratch scratch_;
};

std::unique_ptr<HostRunner> make_runner(const BackendContext& ctx) {
  return std::make_unique<FakeRunner>(ctx, join(ctx));
}

}  // namespace

BackendEntry backend_entry() {
  BackendEntry e{"fake", true, "", nullptr, [](const BackendContext& ctx) {
                   return make_host_backend("fake", &make_runner, ctx);
                 }};
  e.automatic = false;
  return e;
}

}  // namespace collie::fake
