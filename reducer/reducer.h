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
//     r.prepare_for_backward();
//     ... backward: r.mark_grad_ready(i) each time gradient i is accumulated (any thread) ...
//     r.finalize_backward();              // averaged gradients in place
//     optimizer step
//
// DDP's semantics live here, for every engine (collie.torch, the C ABI's):
//  * A gradient may arrive several times in one backward (activation
//    checkpointing recomputes a segment; a weight shared by two layers).
//    The first synchronised iteration learns how many times each one
//    arrives (its buckets go out at finalize); later ones send a bucket as
//    soon as each of its gradients has arrived as often as it did then. One
//    that arrives more often after its bucket left is an error at finalize,
//    naming it (its late part was not reduced).
//  * A gradient that never arrives: an error at finalize naming it, unless
//    find_unused_parameters or static_graph; then it travels as zeros, the
//    ranks exchange which parameters they used (one small all-reduce; with
//    static_graph only in the first iteration, whose unused set is kept and
//    its gradients' slots zeroed at prepare), and param_use() says whether
//    another rank used it (its average is in its bucket) or none did (its
//    gradient is left as it was, in copy mode).
//  * no_sync iterations only accumulate; the next synchronised iteration
//    sends what they accumulated, a gradient that arrived only in them too.
//  * join_step(): the collectives of one iteration with zero gradients, for
//    a rank that has run out of data while others train (uneven inputs).
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
class Track;  // base/trace.h
}
class NonfiniteCheck;  // reducer/nonfinite_check.h

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
  // The parameters' names, for errors ("parameters fc.weight, fc.bias
  // received no gradient"); empty: their indices.
  std::vector<std::string> param_names;
  // Checks (reducer/checks.h). Replica agreement: every this many
  // synchronised iterations, before the backward pass, the ranks compare
  // fingerprints of every parameter; on a difference each names the ranks
  // that disagree, the first parameter that differs and by how much. 0
  // never; -1 COLLIE_CHECK_REPLICAS (default never).
  int64_t check_replicas = -1;
  // Non-finite gradients: each gradient is searched for NaN and Inf as it
  // enters its bucket (in the copy that puts it there, in copy mode), and
  // the ranks tell each other with the iteration's last bucket, so every
  // rank names the rank, parameter and element. Host memory only. 0 off,
  // 1 on, -1 COLLIE_CHECK_NONFINITE (default off).
  int check_nonfinite = -1;
  // What a failed check does: 0 every rank throws Error{mismatch} (replicas)
  // or Error{invalid_argument} (non-finite) at the end of the iteration, its
  // collectives done; 1 every rank logs a warning and goes on; -1
  // COLLIE_CHECK_ACTION (default: throw).
  int check_warns = -1;
};

// Where a parameter's gradient came from in the last synchronised iteration.
enum class ParamUse : uint8_t {
  here = 0,       // this rank's backward produced it (or its no_sync steps did)
  elsewhere = 1,  // not here, but on another rank: its average is in its bucket
  nowhere = 2,    // on no rank: left as it was (copy mode); zeros in its bucket view
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

  // Starts an iteration. `used` (size = number of parameters), optional,
  // says which parameters this iteration's graph uses, with
  // find_unused_parameters: declared-unused ones are zeroed now so that
  // their buckets need not wait for finalize. Without it, a parameter whose
  // gradient never arrives is found at finalize. With static_graph, the
  // first iteration's set is kept and later `used` arguments are ignored.
  void prepare_for_backward(const std::vector<bool>& used = {});
  // Gradient i has been accumulated (once more, if it arrives several times).
  void mark_grad_ready(size_t param);
  // The same, saying where the gradient is now. Copy mode: the engine's
  // current buffer, which may have moved since the last iteration (PyTorch's
  // zero_grad(set_to_none=True) frees it); it is copied in now and the
  // average copied back into it. Bucket-view mode: it must be grad_view(i);
  // a view from before a rebuild is refused, naming the layout generation,
  // instead of its writes landing in another gradient's place.
  void mark_grad_ready(size_t param, TensorView grad);
  void finalize_backward();
  // A rank with no more data, while others still train (uneven inputs):
  // the collectives of one iteration with zero gradients; the engine's
  // gradients are left alone. Not under no_sync.
  void join_step();
  // Parameter i in the last synchronised iteration (see ParamUse).
  ParamUse param_use(size_t param) const;
  // Where gradient i sits in its bucket: grad_view(i) with bucket views; in
  // copy mode the bucket's copy, which holds the average after finalize
  // until the next prepare (how an engine gets the average of a gradient
  // it had no buffer for: ParamUse::elsewhere).
  TensorView bucket_grad(size_t param) const;
  // PyTorch's _set_static_graph: static_graph turned on after construction,
  // before the first synchronised iteration, on every rank.
  void set_static_graph();

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
  // After a shrink or a grow (Communicator::grow): the state a rank's new
  // reducer on `comm` loads, so that training goes on in memory, without a
  // checkpoint. A rank with a reducer (`mine`) keeps its own state (its
  // layout, its iteration count, its hook's state, which may be its own:
  // PowerSGD's error feedback); a joiner passes null and gets rank `root`'s,
  // and so does every rank when the ones with reducers finished different
  // iterations (they failed in different collectives).
  // Collective over `comm`: call it before building the new reducer, whose
  // construction then broadcasts rank 0's parameters, and load the result.
  static Bytes handoff_state(Communicator& comm, Reducer* mine, int root = 0);

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
  static Error misuse(const std::string& msg);
  // At construction (reducer_agreement.cc): the checks set up, and every
  // rank's model, buckets and options compared; throws naming a rank that
  // differs.
  void agree_across_ranks(uint64_t shape_hash);
  void build_buckets(const std::vector<size_t>& order);
  void launch_ready_buckets();  // with mu_ held
  void mark_locked(size_t param);
  void take(size_t param);  // counts gradient i in its bucket (with mu_ held)
  // Copy mode: the engine gave gradient i a buffer; else an error naming it.
  void require_buffer(size_t param) const;
  void zero_slot(size_t param);
  void finish_backward(bool shadow);
  std::vector<bool> exchange_used(const std::vector<bool>& here);
  std::string name(size_t param) const;
  std::string names(const std::vector<size_t>& params) const;
  void set_grad_locked(size_t param, const TensorView& grad);
  TensorView bucket_slot(size_t param) const;
  void copy_in(size_t param);
  void rebuild_from_observed_order();
  void apply_order(const std::vector<size_t>& order);  // moves gradients with the buckets
  void log_stats() const;
  void log_arrivals();

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
  bool allow_unused() const { return opt_.find_unused_parameters || opt_.static_graph; }
  std::vector<bool> marked_;  // counted in its bucket this iteration
  std::vector<bool> used_;    // not declared unused (prepare's mask, or the static graph's)
  std::optional<std::vector<bool>> static_used_;
  std::optional<std::vector<bool>> static_global_used_;  // static_graph: the exchange's result
  std::vector<uint32_t> fires_;     // arrivals of each gradient this synchronised iteration
  std::vector<uint32_t> expected_;  // arrivals learnt (empty: this iteration learns them)
  std::vector<bool> accumulated_;   // arrived in no_sync iterations since the last sync
  std::vector<bool> late_;          // arrived again after its bucket had left
  std::vector<ParamUse> use_;
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
  // Iterations between comparisons of the ranks' arrivals (rank 0's
  // log_every_ where it logs INFO, else 0: never).
  uint64_t arrivals_every_ = 0;
  // The checks (ReducerOptions::check_*), resolved from the environment.
  uint64_t check_replicas_ = 0;                // every this many iterations (0: never)
  bool check_warns_ = false;                   // warn instead of throwing
  std::unique_ptr<NonfiniteCheck> nonfinite_;  // null: off
  bool shadowing_ = false;  // in join_step: this rank's parameters no longer follow
  void check_replicas_now();
  void failed_check(ErrorCode code, const std::string& msg) const;
  std::shared_ptr<trace::Track> trace_;  // COLLIE_TRACE's row for this reducer, or null
};

}  // namespace collie
