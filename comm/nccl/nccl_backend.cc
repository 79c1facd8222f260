// comm/nccl/nccl_backend.cc: the NCCL backend (see nccl_backend.h). The
// logic is built in every build and tested against a fake device; only the
// registry's line depends on whether this build has NCCL.
#include "comm/nccl/nccl_backend.h"

#include <algorithm>
#include <utility>

#include "base/log.h"
#include "collie/comm.h"
#include "collie_build_config.h"
#include "comm/nccl/nccl_state.h"

namespace collie::nccl {

namespace {

class NcclBackend final : public Backend {
 public:
  explicit NcclBackend(std::shared_ptr<State> st) : st_(std::move(st)) {}
  std::string name() const override { return "nccl"; }
  bool accepts(const Device& d) const override {
    return d.kind == Device::Kind::cuda && d.index == st_->device();
  }
  Work start(Op op) override { return st_->start(std::move(op)); }
  std::unique_ptr<Backend> split(const SplitPlan& plan) override { return st_->split(plan); }
  std::shared_ptr<void> register_memory(const TensorView& t) override {
    return accepts(t.device) ? st_->register_memory(t) : nullptr;
  }
  void abort(const Error& e) override {
    // The front has recorded `e` already: fail() would not count it as
    // this rank's first failure, which is what it tells the peers.
    st_->publish(e);
    st_->fail(e, nullptr, false);
  }
  void shutdown() override { st_->shutdown(); }

 private:
  std::shared_ptr<State> st_;
};

std::unique_ptr<Backend> make_over(const BackendContext& ctx, Apis apis, Comm comm, int device) {
  auto st = std::make_shared<State>(ctx, std::move(apis), comm, device);
  st->start_watchdog();
  return std::make_unique<NcclBackend>(std::move(st));
}

}  // namespace

std::unique_ptr<Backend> State::split(const SplitPlan& plan) {
  launch_pending();
  if (auto first = ctx_.failure->get())
    throw FailureLatch::earlier(*first, "split on rank " + std::to_string(rank_));
  Comm made = nullptr;
  Result r;
  {
    std::lock_guard lk(mu_);
    r = apis_.nccl->split(comm_, plan.color, plan.key, &made, false);
    // A rank that joins none has no new communicator to poll: the parent
    // says when its part is done.
    r = settle(*apis_.nccl, made ? made : comm_, r, Clock::now() + timeout_);
  }
  if (!r.ok()) {
    if (made) apis_.nccl->abort(made);
    throw Error(r.failed() ? code_of(r) : ErrorCode::timeout,
                "ncclCommSplit on rank " + std::to_string(rank_) + " (color " +
                    std::to_string(plan.color) + ") " +
                    (r.failed() ? "failed: " + r.message
                                : "did not finish within " + log::seconds(timeout_) +
                                      ": a rank of the parent did not call split"));
  }
  if (plan.color < 0) return nullptr;
  return make_over(plan.context, apis_, made, device_);
}

namespace {

std::unique_ptr<Backend> create(const BackendContext& ctx) {
  return make_backend(ctx, {cuda::device_api(), api()});
}

}  // namespace

std::unique_ptr<Backend> make_backend(const BackendContext& ctx, Apis apis) {
  const config::Launch& launch = ctx.launch;
  const std::string who = ctx.names(launch.rank);
  if (!apis.cuda || !apis.nccl)
    throw Error(ErrorCode::unavailable, who + ": this build of collie has no NCCL");
  std::string why;
  const int devices = apis.cuda->device_count(&why);
  if (devices <= 0)
    throw Error(ErrorCode::unavailable,
                who + ": the nccl backend needs a CUDA device, and none can be used: " + why);
  const int device = launch.local_rank % devices;
  // As every DDP program's torch.cuda.set_device(local_rank): the calling
  // thread's device becomes the communicator's.
  apis.cuda->set_device(device);
  const auto deadline = Clock::now() + launch.timeout;
  UniqueId id{};
  const std::string id_key = ctx.key + "/nccl/id";
  if (launch.rank == 0) {
    if (Result r = apis.nccl->unique_id(&id); !r.ok())
      throw Error(code_of(r), who + ": ncclGetUniqueId failed: " + r.message);
    if (ctx.store) ctx.store->set(id_key, Bytes(id.bytes, id.bytes + sizeof id.bytes));
  }
  if (launch.world_size > 1) {
    if (!ctx.store) throw Error(ErrorCode::internal, who + ": the nccl backend has no store");
    // Rank 0 writes the id before it says it has joined.
    std::vector<std::string> joined;
    for (int q = 0; q < launch.world_size; ++q)
      joined.push_back(ctx.key + "/nccl/joined/" + std::to_string(q));
    ctx.store->set(joined[static_cast<size_t>(launch.rank)], to_bytes("1"));
    wait_for_ranks(*ctx.store, joined, deadline, launch.timeout, who, ctx.names);
    if (launch.rank != 0) {
      Bytes b = ctx.store->get(id_key);
      if (b.size() != sizeof id.bytes)
        throw Error(ErrorCode::mismatch, who + ": NCCL's unique id in the store has " +
                                             std::to_string(b.size()) + " bytes, not " +
                                             std::to_string(sizeof id.bytes));
      std::copy(b.begin(), b.end(), id.bytes);
    }
  }
  Comm comm = nullptr;
  Result r = apis.nccl->init_rank(&comm, launch.world_size, id, launch.rank, false);
  r = settle(*apis.nccl, comm, r, deadline);
  if (!r.ok()) {
    if (comm) apis.nccl->abort(comm);
    if (r.failed()) throw Error(code_of(r), who + ": NCCL's init failed: " + r.message);
    throw Error(ErrorCode::timeout,
                who + ": every rank joined, but NCCL's init did not finish within " +
                    log::seconds(launch.timeout) + " (NCCL_DEBUG=INFO shows where it waits)");
  }
  return make_over(ctx, std::move(apis), comm, device);
}

BackendEntry backend_entry() {
#if COLLIE_HAVE_NCCL
  BackendEntry e{"nccl", true, "", nullptr, &create};
#else
  BackendEntry e{"nccl", false,
                 "this build has no NCCL: configure with -Dcuda=enabled -Dnccl=enabled, with the "
                 "CUDA toolkit and NCCL under CUDA_HOME",
                 nullptr, &create};
#endif
  // CPU tensors cannot go to it, so `auto` never picks it on its own.
  e.automatic = false;
  return e;
}

}  // namespace collie::nccl
