// hooks/comm_hook.h: how a bucket of gradients travels.
//
// The reducer hands each full bucket to a CommHook, which starts whatever
// communication it likes and returns a Work; when the Work completes, the
// bucket's buffer must hold the averaged gradients. Hooks are picked by name
// with parameters, per run, without recompiling:
//
//   COLLIE_COMM_HOOK="fp16"            compress to f16, all-reduce, decompress
//   COLLIE_COMM_HOOK="bf16_wrap:noop"  a wrapper around another hook
//
// (or ReducerOptions::comm_hook, or collie_reducer_options.comm_hook in C).
// A hook owns its state and can save and load it, so a resumed job goes on
// exactly where it stopped. The arithmetic of the built-in hooks goes through
// HookMath, which the CUDA kernels implement for device buffers.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "collie/comm.h"

namespace collie {

struct GradBucket {
  size_t index = 0;
  TensorView buffer;               // the bucket's flat gradients; the result goes here
  std::vector<TensorView> grads;   // each gradient, a view into `buffer`
  std::vector<TensorView> params;  // the matching parameters
  // Each gradient's first dimension when it is a matrix (viewed as
  // rows x numel/rows, as PowerSGD compresses it); 0 for a vector.
  std::vector<size_t> rows;
  bool is_last = false;  // the last bucket of this iteration
  uint64_t iteration = 0;
  // The reducer's search for NaN and Inf (check_nonfinite), or null: the
  // allreduce hook hands it to its all-reduce, which searches as it reduces
  // (Communicator::allreduce with a NonFiniteSeen). Other hooks leave it:
  // the reducer searches the gradients itself when the hook is not
  // "allreduce".
  kernels::NonFiniteSeen* seen = nullptr;
};

class CommHook {
 public:
  virtual ~CommHook() = default;
  virtual std::string name() const = 0;
  // Starts reducing `bucket`; the Work completes once bucket.buffer holds the
  // average over ranks. The bucket's memory stays valid until then.
  virtual Work run(Communicator& comm, GradBucket& bucket) = 0;
  // Opaque state (error feedback, step counts, ...) for checkpoints.
  virtual Bytes save_state() const { return {}; }
  virtual void load_state(const Bytes& state);

  // Bytes this hook has handed to collectives so far, per rank (what each
  // rank contributes to all-reduces; a ring sends 2(n-1)/n times that). The
  // reducer turns it into bytes per step and a compression ratio. Built-in
  // hooks count; a user's hook may call count_bytes() itself.
  // (Wrappers add their inner hook's.)
  virtual uint64_t bytes_communicated() const { return bytes_.load(std::memory_order_relaxed); }

 protected:
  void count_bytes(uint64_t n) { bytes_.fetch_add(n, std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> bytes_{0};
};

using HookParams = std::map<std::string, std::string>;
using HookFactory = std::function<std::unique_ptr<CommHook>(const HookParams&)>;

// Parses "name:key=value,key=value" (or, for wrappers, "name:inner-spec")
// and builds the hook. Unknown names and parameters are invalid_argument
// errors that list what is accepted.
std::unique_ptr<CommHook> make_comm_hook(const std::string& spec);
// Adds a hook (a user's own) to the registry. `params` lists the parameter
// names it accepts, for error messages.
void register_comm_hook(const std::string& name, std::vector<std::string> params,
                        HookFactory factory);
std::vector<std::string> comm_hook_names();

// Reading a hook's parameters: a missing key gives `fallback`; a value that
// does not parse, or lies outside [lo, hi], is an invalid_argument error
// naming the hook, the key and what is accepted.
int64_t hook_param_int(const HookParams& p, const std::string& hook, const std::string& key,
                       int64_t fallback, int64_t lo, int64_t hi);
double hook_param_double(const HookParams& p, const std::string& hook, const std::string& key,
                         double fallback, double lo, double hi);
bool hook_param_bool(const HookParams& p, const std::string& hook, const std::string& key,
                     bool fallback);

// The element-wise arithmetic of the built-in hooks.
struct HookMath {
  virtual ~HookMath() = default;
  // dst (dtype of dst) = src (f32/f64/f16/bf16) / divisor, rounded once.
  virtual void compress(TensorView src, TensorView dst, int divisor) = 0;
  // dst = src converted (both any float type).
  virtual void decompress(TensorView src, TensorView dst) = 0;
};
HookMath& cpu_hook_math();
// The hook math for buffers on `d`: the CPU's, or the CUDA kernels'
// (kernels/; Error{unavailable} from each call in a build without CUDA).
HookMath& hook_math_for(const Device& d);
// Tests: the hook math for CUDA buffers (a fake device's); nullptr puts the
// kernels back.
void set_cuda_hook_math(HookMath* math);

}  // namespace collie
