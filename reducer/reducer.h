// reducer/reducer.h: the DDP gradient reducer.
//
// An autograd engine tells the reducer when each parameter's gradient is
// ready; the reducer packs gradients into buckets (buckets/) and, as soon as
// a bucket is complete and every bucket before it has been launched, starts
// its all-reduce, while the engine goes on computing earlier layers.
// finalize_backward() waits for the rest and leaves the averaged gradients
// where the engine expects them.
//
//   Reducer r(comm, params, opts);        // checks shapes across ranks, broadcasts rank 0's values
//   for each step:
//     r.prepare_for_backward();           // (with find_unused_parameters: which params were used)
//     ... backward: r.mark_grad_ready(i) as each gradient is written (any thread) ...
//     r.finalize_backward();              // averaged gradients in place
//     optimizer step
//
// With gradient_as_bucket_view the engine writes gradient i straight into
// grad_view(i), a slice of the bucket: no copies and no gradient-sized memory
// beyond the buckets. Otherwise the reducer copies each gradient in when it is
// marked ready and the average back out in finalize_backward().
//
// Buckets launch in plan order on every rank, so every rank issues the same
// all-reduces in the same order. After the first synchronised iteration the
// plan is rebuilt from the order gradients actually became ready (rank 0's
// order, broadcast), once; gradient values move to the new layout with them,
// so an engine that re-reads grad_view() after finalize sees the same values.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "buckets/bucket_memory.h"
#include "buckets/bucket_plan.h"
#include "collie/comm.h"
#include "hooks/comm_hook.h"

namespace collie {

namespace trace {
class Track;  // comm/core/trace.h
}

struct ReducerOptions {
  size_t first_bucket_bytes = 1u << 20;
  size_t bucket_bytes = 25u << 20;
  bool gradient_as_bucket_view = false;
  bool find_unused_parameters = false;
  bool static_graph = false;
  bool broadcast_parameters = true;
  bool rebuild_buckets = true;
  // How buckets travel: a hook spec ("fp16", "bf16_wrap:allreduce", ...);
  // empty means COLLIE_COMM_HOOK, else "allreduce". `hook`, when set, is used
  // instead (a user's own C++ hook).
  std::string comm_hook;
  std::shared_ptr<CommHook> hook;
  // Where bucket memory comes from: the engine's allocator (PyTorch's, a
  // CUDA one), so that buckets live on their device and the engine's
  // gradients can view them. Null: zeroed host memory. Asked once per
  // (dtype, device); the memory is released when the reducer and every
  // reduction still writing it are gone, never by a rebuild.
  std::shared_ptr<BucketAllocator> bucket_allocator;
};

struct Parameter {
  TensorView value;  // the parameter itself (broadcast from rank 0 at construction)
  // The engine's gradient buffer; unused with gradient_as_bucket_view. May
  // be empty here and given later (set_grad, or mark_grad_ready(i, grad)),
  // for engines whose gradients come and go (PyTorch's set_to_none).
  TensorView grad;
  // Its first dimension when it is a matrix or higher (a conv weight
  // [out, in, kh, kw] has rows = out); 0 for a vector. Hooks that compress
  // matrices (PowerSGD) view the gradient as rows x numel/rows.
  size_t rows = 0;
};

// Per-iteration timings, microseconds.
struct ReducerStats {
  uint64_t iteration = 0;
  double backward_us = 0;              // prepare_for_backward -> last mark_grad_ready
  double exposed_us = 0;               // time finalize_backward waited for communication
  std::vector<double> bucket_comm_us;  // launch -> completion, per bucket
  uint64_t gradient_bytes = 0;         // bytes of the buckets handed to the comm hook
  uint64_t hook_bytes = 0;             // bytes the hook handed to collectives (see CommHook)
};

class Reducer {
 public:
  Reducer(Communicator& comm, std::vector<Parameter> params, ReducerOptions options = {});
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Starts an iteration. `used` (size = number of parameters) says which
  // parameters this iteration's graph uses; needed only with
  // find_unused_parameters (unused ones are reduced as zeros so that every
  // rank still issues every bucket). With static_graph, the first
  // iteration's set is kept and later `used` arguments are ignored.
  void prepare_for_backward(const std::vector<bool>& used = {});
  void mark_grad_ready(size_t param);
  // The same, saying where the gradient is now. Copy mode: the engine's
  // current buffer, which may have moved since the last iteration (PyTorch's
  // zero_grad(set_to_none=True) frees it); it is copied in now and the
  // average copied back into it. Bucket-view mode: it must be grad_view(i);
  // a view from before a rebuild is refused, naming the layout generation,
  // instead of its writes landing in another gradient's place.
  void mark_grad_ready(size_t param, TensorView grad);
  void finalize_backward();

  // Where gradient i lives now, in copy mode (empty: the engine has none,
  // and finalize leaves it alone). In bucket-view mode it must be
  // grad_view(i).
  void set_grad(size_t param, TensorView grad);

  // Where the engine must write gradient i (gradient_as_bucket_view), or the
  // engine's own buffer otherwise. Re-read after finalize_backward() when
  // layout_generation() has changed: the first rebuild moves gradients to
  // other places in the same memory.
  TensorView grad_view(size_t param) const;
  // Counts the changes of bucket layout (the rebuild after the first
  // iteration, a load_state with another layout): 0 until the first.
  uint64_t layout_generation() const;

  // While set, iterations only accumulate locally (no communication); the
  // next iteration without it reduces the accumulated gradients.
  void set_no_sync(bool on);
  bool no_sync() const { return no_sync_; }

  // Checkpoints: the bucket layout (the order it was rebuilt from), the
  // iteration count and the comm hook's state (PowerSGD's error and Q, ...).
  // A resumed job builds its reducer as the first one did, calls
  // load_state() before its first backward, and goes on exactly as the saved
  // job would have. Not in the middle of a backward pass. Loading may move
  // the buckets: re-read grad_view() afterwards. load_state is collective:
  // it checks that every rank loads a state from the same step and layout.
  Bytes save_state();
  void load_state(const Bytes& state);

  const BucketPlan& plan() const { return plan_; }
  CommHook& comm_hook() { return *hook_; }
  // Swaps the comm hook between iterations (PyTorch's register_comm_hook):
  // a spec for the registry, or a hook object. Every rank must swap at the
  // same iteration. The old hook's state goes with it.
  void set_comm_hook(const std::string& spec);
  void set_comm_hook(std::shared_ptr<CommHook> hook);
  const ReducerStats& last_stats() const { return stats_; }
  uint64_t iterations() const { return iteration_; }

 private:
  void build_buckets(const std::vector<size_t>& order);
  void launch_ready_buckets();  // with mu_ held
  void mark_locked(size_t param);
  void set_grad_locked(size_t param, const TensorView& grad);
  TensorView bucket_slot(size_t param) const;
  void copy_in(size_t param);
  void rebuild_from_observed_order();
  void apply_order(const std::vector<size_t>& order);  // moves gradients with the buckets
  void log_stats() const;

  Communicator& comm_;
  std::vector<Parameter> params_;
  std::vector<ParamSpec> specs_;
  ReducerOptions opt_;
  BucketPlan plan_;
  std::unique_ptr<BucketMemory> memory_;
  std::vector<FlatBuffer> buffers_;  // slices of memory_'s arenas
  // The communicator's registrations of the device arenas (NCCL's), undone
  // before the arenas can go (members are destroyed last to first).
  std::vector<std::shared_ptr<void>> registrations_;
  uint64_t generation_ = 0;
  std::vector<const void*> stale_view_;  // per parameter: its view before the last rebuild
  std::shared_ptr<CommHook> hook_;

  std::mutex mu_;
  bool in_backward_ = false;
  bool no_sync_ = false;
  bool rebuilt_ = false;
  uint64_t iteration_ = 0;  // synchronised iterations finished
  std::vector<bool> marked_;
  std::vector<bool> used_;
  std::optional<std::vector<bool>> static_used_;
  std::vector<size_t> pending_;  // per bucket: gradients still to come
  size_t next_launch_ = 0;
  std::vector<Work> works_;
  std::vector<std::chrono::steady_clock::time_point> launched_at_;
  std::shared_ptr<std::vector<double>> comm_us_;  // shared with the bucket continuations
  std::vector<size_t> ready_order_;
  std::vector<size_t> bucket_order_;  // what the plan was built from (empty: registration order)
  std::chrono::steady_clock::time_point backward_start_, last_mark_;
  ReducerStats stats_;
  uint64_t hook_bytes_before_ = 0;
  int log_every_ = 100;
  std::shared_ptr<trace::Track> trace_;  // COLLIE_TRACE's row for this reducer, or null
};

}  // namespace collie
