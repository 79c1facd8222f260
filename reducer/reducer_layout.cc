// reducer/reducer_layout.cc: a reducer built (its parameters checked, its
// buckets laid out in memory its communicator can share, its hook chosen)
// and its buckets rebuilt in the order gradients were seen to arrive.
#include <map>
#include <mutex>

#include "base/config.h"
#include "base/cuda_api.h"
#include "base/fingerprint.h"
#include "base/trace.h"
#include "reducer/nonfinite_check.h"
#include "reducer/reducer.h"

namespace collie {

namespace {

// Host buckets in the communicator's own memory (Communicator::allocate): on
// shm every rank's peers map it, and a bucket's all-reduce reads and writes
// it in place instead of copying it through the segment.
class CommAllocator final : public BucketAllocator {
 public:
  explicit CommAllocator(Communicator& comm) : comm_(comm) {}
  void* allocate(size_t bytes, DType t, Device device) override {
    if (!device.is_cpu()) return host_bucket_allocator()->allocate(bytes, t, device);
    std::shared_ptr<void> p = comm_.allocate(bytes);
    std::lock_guard lk(mu_);
    held_[p.get()] = p;
    return p.get();
  }
  void release(void* ptr, size_t bytes, Device device) noexcept override {
    if (!device.is_cpu()) return host_bucket_allocator()->release(ptr, bytes, device);
    std::lock_guard lk(mu_);
    held_.erase(ptr);
  }

 private:
  Communicator& comm_;  // used only while the reducer is built
  std::mutex mu_;
  std::map<void*, std::shared_ptr<void>> held_;
};

std::shared_ptr<BucketAllocator> communicator_allocator(Communicator& comm) {
  return std::make_shared<CommAllocator>(comm);
}

}  // namespace

Reducer::Reducer(Communicator& comm, std::vector<Parameter> params, ReducerOptions options)
    : comm_(comm), params_(std::move(params)), opt_(options) {
  const std::string who = "rank " + std::to_string(comm_.rank());
  if (!opt_.param_names.empty() && opt_.param_names.size() != params_.size())
    throw misuse("param_names has " + std::to_string(opt_.param_names.size()) + " names for " +
                 std::to_string(params_.size()) + " parameters");
  uint64_t shape_hash = kFnvBasis;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Parameter& p = params_[i];
    if (p.value.numel > 0 && !p.value.data)
      throw misuse("parameter " + std::to_string(i) + " on " + who + " has no data");
    if (!opt_.gradient_as_bucket_view && p.grad.data &&
        (p.grad.numel != p.value.numel || p.grad.dtype != p.value.dtype))
      throw misuse("parameter " + std::to_string(i) + " on " + who +
                   ": its gradient buffer must match it (" + std::to_string(p.value.numel) + " " +
                   std::string(to_string(p.value.dtype)) +
                   " elements), or be given later (set_grad, mark_grad_ready), or use "
                   "gradient_as_bucket_view");
    if (p.rows > 0 && p.value.numel % p.rows != 0)
      throw misuse("parameter " + std::to_string(i) + " on " + who + " has " +
                   std::to_string(p.value.numel) +
                   " elements, which is not a whole number of its " + std::to_string(p.rows) +
                   " rows");
    specs_.push_back({p.value.numel, p.value.dtype, p.value.device});
    shape_hash = fnv_mix(
        fnv_mix(fnv_mix(shape_hash, p.value.numel), static_cast<uint64_t>(p.value.dtype)), p.rows);
  }

  // Every rank must hold the same parameters and build the same buckets:
  // compare counts, shapes and the bucket plan (it also depends on the
  // bucket sizes, which a rank could be given differently).
  memory_ = std::make_unique<BucketMemory>(
      specs_, opt_.bucket_allocator ? opt_.bucket_allocator : communicator_allocator(comm_));
  // Device arenas are registered with the communicator once (NCCL's
  // ncclCommRegister): the buckets live in them for the reducer's life.
  for (const TensorView& arena : memory_->arena_views())
    if (!arena.device.is_cpu())
      if (auto h = comm_.register_memory(arena)) registrations_.push_back(std::move(h));
  stale_view_.assign(params_.size(), nullptr);
  accumulated_.assign(params_.size(), false);
  use_.assign(params_.size(), ParamUse::here);
  build_buckets({});
  agree_across_ranks(shape_hash);

  if (opt_.broadcast_parameters)
    for (const Parameter& p : params_) comm_.broadcast(p.value, 0).wait();

  if (opt_.hook) {
    hook_ = opt_.hook;
  } else {
    std::string spec = opt_.comm_hook;
    if (spec.empty()) spec = config::comm_hook(config::process_env());
    hook_ = make_comm_hook(spec.empty() ? "allreduce" : spec);
  }
  // COLLIE_TRACE: a row of its own in the communicator's rank's file.
  if (auto sink = trace_sink(comm_))
    trace_ = sink->track("reducer (" + std::to_string(params_.size()) + " parameters, " +
                         std::to_string(plan_.buckets().size()) + " buckets)");
}

Reducer::~Reducer() {
  // Reductions still in flight write into buffers this object owns.
  for (auto& w : works_) {
    try {
      w.wait();
    } catch (const Error&) {
    }
  }
  if (trace_) trace_->sink().flush();
}

void Reducer::build_buckets(const std::vector<size_t>& order) {
  plan_ = BucketPlan::build(specs_, order, opt_.first_bucket_bytes, opt_.bucket_bytes);
  buffers_ = memory_->lay_out(plan_);
  works_.assign(plan_.buckets().size(), Work());
  launched_at_.assign(plan_.buckets().size(), {});
  comm_us_ = std::make_shared<std::vector<double>>(plan_.buckets().size(), 0.0);
}

void Reducer::rebuild_from_observed_order() {
  rebuilt_ = true;
  // Rank 0's order decides, so that every rank builds the same plan;
  // parameters not marked (unused) go last, in reverse registration order.
  const size_t n = params_.size();
  std::vector<int64_t> order;
  std::vector<bool> in(n, false);
  for (size_t p : ready_order_) {
    order.push_back(static_cast<int64_t>(p));
    in[p] = true;
  }
  for (size_t p = n; p-- > 0;)
    if (!in[p]) order.push_back(static_cast<int64_t>(p));
  comm_.broadcast(view_of(order.data(), order.size()), 0).wait();
  apply_order(std::vector<size_t>(order.begin(), order.end()));
}

void Reducer::apply_order(const std::vector<size_t>& new_order) {
  const size_t n = params_.size();
  bucket_order_ = new_order;
  const std::string before = plan_.fingerprint();
  std::vector<TensorView> old_slots(n);
  for (size_t i = 0; i < n; ++i) old_slots[i] = bucket_slot(i);
  build_buckets(new_order);
  if (plan_.fingerprint() == before) return;
  // The new layout is in the same memory: gradients (the engine's, with
  // bucket views) move to their new places through a copy, since old and
  // new places overlap. Nothing is reallocated, so a view the engine kept
  // still points into live memory, and mark_grad_ready(i, view) recognises
  // it as stale.
  // CUDA gradients go through the host too (a rebuild happens once), in
  // order on the calling thread's stream, waited for before `saved` goes.
  size_t total = 0;
  bool on_device = false;
  for (size_t i = 0; i < n; ++i) {
    total += old_slots[i].nbytes();
    on_device = on_device || !old_slots[i].device.is_cpu();
  }
  std::vector<uint8_t> saved(total);
  for (size_t i = 0, at = 0; i < n; at += old_slots[i].nbytes(), ++i)
    cuda::copy(saved.data() + at, old_slots[i].data, old_slots[i].nbytes(), old_slots[i].device);
  for (size_t i = 0, at = 0; i < n; at += old_slots[i].nbytes(), ++i) {
    TensorView now = bucket_slot(i);
    cuda::copy(now.data, saved.data() + at, now.nbytes(), now.device);
    stale_view_[i] = now.data == old_slots[i].data ? nullptr : old_slots[i].data;
  }
  if (on_device) cuda::wait_queued(Device::cuda(0));
  ++generation_;
}

}  // namespace collie
