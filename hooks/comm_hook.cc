// hooks/comm_hook.cc: the hook registry, the spec parser, and the built-in
// hooks that exist so far: allreduce (the default), noop, fp16 and bf16
// compression, and the fp16_wrap:/bf16_wrap: wrappers.
#include <mutex>
#include <vector>

#include "base/cuda_api.h"
#include "base/reduce.h"
#include "hooks/comm_hook.h"
#include "hooks/post_local_sgd.h"
#include "hooks/powersgd.h"
#include "hooks/stream_scope.h"
#include "kernels/kernels.h"

namespace collie {

void CommHook::load_state(const Bytes& state) {
  if (!state.empty())
    throw Error(ErrorCode::invalid_argument, "comm hook '" + name() +
                                                 "' has no state to load, but was given " +
                                                 std::to_string(state.size()) + " bytes");
}

namespace {

Error bad_spec(const std::string& msg) {
  return Error(ErrorCode::invalid_argument, "comm hook: " + msg);
}

// --- arithmetic ------------------------------------------------------------

void check_pair(const TensorView& a, const TensorView& b) {
  if (a.numel != b.numel) throw bad_spec("compression buffers differ in size");
  if (!is_floating(a.dtype) || !is_floating(b.dtype))
    throw bad_spec("compression needs floating-point gradients");
}

class CpuHookMath final : public HookMath {
 public:
  void compress(TensorView src, TensorView dst, int divisor) override {
    check(src, dst);
    kernels::convert(src.dtype, src.data, dst.dtype, dst.data, src.numel, divisor);
  }
  void decompress(TensorView src, TensorView dst) override {
    check(src, dst);
    kernels::convert(src.dtype, src.data, dst.dtype, dst.data, src.numel, 1);
  }

 private:
  static void check(const TensorView& a, const TensorView& b) {
    check_pair(a, b);
    if (!a.device.is_cpu() || !b.device.is_cpu())
      throw Error(ErrorCode::invalid_argument, "comm hook: the CPU hook math got a CUDA buffer");
  }
};

// On CUDA buffers, with the kernels (kernels/): queued on the calling
// thread's current stream, which the collective that follows is ordered
// after; decompress, the last step, waits for its kernel, so that the
// bucket holds the result when the hook's Work ends.
class CudaHookMath final : public HookMath {
 public:
  void compress(TensorView src, TensorView dst, int divisor) override {
    check_pair(src, dst);
    gpu::convert(src.dtype, src.data, dst.dtype, dst.data, src.numel, divisor, cuda_stream());
  }
  void decompress(TensorView src, TensorView dst) override {
    check_pair(src, dst);
    gpu::convert(src.dtype, src.data, dst.dtype, dst.data, src.numel, 1, cuda_stream());
    cuda::wait_queued(dst.device);
  }
};

// --- built-in hooks ----------------------------------------------------------

class AllreduceHook final : public CommHook {
 public:
  std::string name() const override { return "allreduce"; }
  Work run(Communicator& comm, GradBucket& b) override {
    count_bytes(b.buffer.nbytes());
    return comm.allreduce(b.buffer, ReduceOp::avg);
  }
};

// Sends nothing: each rank keeps its own gradients. For measuring what the
// communication costs.
class NoopHook final : public CommHook {
 public:
  std::string name() const override { return "noop"; }
  Work run(Communicator&, GradBucket&) override { return Work(); }
};

// Compress to a 16-bit float type, reduce, decompress into the bucket. On its
// own (`inner` null) it divides by the world size while compressing and sums
// in the narrow type (PyTorch's fp16_compress_hook); as a wrapper it hands the
// compressed bucket to `inner` and decompresses what that leaves.
class CompressHook final : public CommHook {
 public:
  CompressHook(DType narrow, std::unique_ptr<CommHook> inner)
      : narrow_(narrow), inner_(std::move(inner)) {}

  std::string name() const override {
    std::string n = narrow_ == DType::f16 ? "fp16" : "bf16";
    return inner_ ? n + "_wrap:" + inner_->name() : n;
  }

  Work run(Communicator& comm, GradBucket& b) override {
    TensorView small{scratch(b), narrow_, b.buffer.numel, b.buffer.device};
    HookMath& math = hook_math_for(b.buffer.device);
    TensorView full = b.buffer;
    Work w;
    if (!inner_) {
      math.compress(full, small, comm.size());
      count_bytes(small.nbytes());
      w = comm.allreduce(small, ReduceOp::sum);
    } else {
      math.compress(full, small, 1);
      GradBucket nb = b;
      nb.buffer = small;
      for (auto& g : nb.grads) {
        size_t off = (static_cast<uint8_t*>(g.data) - static_cast<uint8_t*>(full.data)) /
                     dtype_size(full.dtype);
        g = small.slice(off, g.numel);
      }
      w = inner_->run(comm, nb);
    }
    // The continuation runs on the communicator's continuation thread:
    // decompress on the stream and device the bucket came with, not that
    // thread's (the legacy stream of device 0).
    return w.then([small, full, stream = cuda_stream()](const Work& done) {
      if (auto e = done.error()) throw *e;
      StreamScope on(stream, full.device);
      hook_math_for(full.device).decompress(small, full);
    });
  }

  uint64_t bytes_communicated() const override {
    return CommHook::bytes_communicated() + (inner_ ? inner_->bytes_communicated() : 0);
  }

  Bytes save_state() const override { return inner_ ? inner_->save_state() : Bytes{}; }
  void load_state(const Bytes& s) override {
    if (inner_)
      inner_->load_state(s);
    else
      CommHook::load_state(s);
  }

 private:
  DType narrow_;
  std::unique_ptr<CommHook> inner_;
  // The compressed bucket's memory, per bucket, reused every iteration: on
  // the bucket's device.
  void* scratch(const GradBucket& b) {
    const size_t bytes = b.buffer.numel * 2;
    if (b.buffer.device.is_cpu()) {
      auto& buf = scratch_[b.index];
      buf.resize(bytes);
      return buf.data();
    }
    auto& d = device_scratch_[b.index];
    if (d.bytes < bytes || !d.mem) {
      auto api = cuda::device_api();
      if (!api)
        throw Error(ErrorCode::unavailable, "comm hook " + name() + ": bucket " +
                                                std::to_string(b.index) +
                                                " is on CUDA, and this build has no CUDA");
      d.mem = std::shared_ptr<void>(api->device_alloc(bytes ? bytes : 1),
                                    [api](void* p) { api->device_free(p); });
      d.bytes = bytes;
    }
    return d.mem.get();
  }

  struct DeviceScratch {
    std::shared_ptr<void> mem;
    size_t bytes = 0;
  };
  std::map<size_t, std::vector<uint8_t>> scratch_;  // per bucket, reused every iteration
  std::map<size_t, DeviceScratch> device_scratch_;
};

// --- registry ---------------------------------------------------------------

struct Entry {
  std::vector<std::string> params;
  HookFactory factory;
};

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}

std::map<std::string, Entry>& registry() {
  static std::map<std::string, Entry> r = [] {
    std::map<std::string, Entry> m;
    m["allreduce"] = {{}, [](const HookParams&) { return std::make_unique<AllreduceHook>(); }};
    m["noop"] = {{}, [](const HookParams&) { return std::make_unique<NoopHook>(); }};
    m["fp16"] = {
        {}, [](const HookParams&) { return std::make_unique<CompressHook>(DType::f16, nullptr); }};
    m["bf16"] = {
        {}, [](const HookParams&) { return std::make_unique<CompressHook>(DType::bf16, nullptr); }};
    m["powersgd"] = {powersgd_param_names(),
                     [](const HookParams& p) { return make_powersgd_hook(p, false); }};
    m["batched_powersgd"] = {powersgd_param_names(),
                             [](const HookParams& p) { return make_powersgd_hook(p, true); }};
    m["post_local_sgd"] = {{"start_iter", "subgroup"}, make_post_local_sgd_hook};
    return m;
  }();
  return r;
}

std::string accepted_names() {
  std::string s;
  for (const auto& n : comm_hook_names()) s += (s.empty() ? "" : ", ") + n;
  return s + ", fp16_wrap:<hook>, bf16_wrap:<hook>";
}

}  // namespace

namespace {
// The shared part of reading a numeric parameter: absent gives `fallback`;
// `parse` must consume the whole value, which must lie in [lo, hi].
template <typename T, typename Parse>
T hook_param_number(const HookParams& p, const std::string& hook, const std::string& key,
                    T fallback, T lo, T hi, const char* kind, Parse parse) {
  auto it = p.find(key);
  if (it == p.end()) return fallback;
  const std::string& v = it->second;
  size_t used = 0;
  T x{};
  try {
    x = parse(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (v.empty() || used != v.size() || !(x >= lo && x <= hi))
    throw bad_spec("hook '" + hook + "': " + key + "='" + v + "' is not " + kind + " in [" +
                   std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return x;
}
}  // namespace

int64_t hook_param_int(const HookParams& p, const std::string& hook, const std::string& key,
                       int64_t fallback, int64_t lo, int64_t hi) {
  return hook_param_number<int64_t>(
      p, hook, key, fallback, lo, hi, "an integer",
      [](const std::string& v, size_t* used) { return std::stoll(v, used, 10); });
}

double hook_param_double(const HookParams& p, const std::string& hook, const std::string& key,
                         double fallback, double lo, double hi) {
  return hook_param_number<double>(
      p, hook, key, fallback, lo, hi, "a number",
      [](const std::string& v, size_t* used) { return std::stod(v, used); });
}

bool hook_param_bool(const HookParams& p, const std::string& hook, const std::string& key,
                     bool fallback) {
  auto it = p.find(key);
  if (it == p.end()) return fallback;
  const std::string& v = it->second;
  if (v == "1" || v == "true" || v == "on" || v == "yes") return true;
  if (v == "0" || v == "false" || v == "off" || v == "no") return false;
  throw bad_spec("hook '" + hook + "': " + key + "='" + v +
                 "' is not a boolean (1/0, true/false, on/off)");
}

HookMath& cpu_hook_math() {
  static CpuHookMath m;
  return m;
}

namespace {
std::atomic<HookMath*> cuda_math_override{nullptr};
}  // namespace

HookMath& hook_math_for(const Device& d) {
  static CudaHookMath cuda;
  if (d.is_cpu()) return cpu_hook_math();
  HookMath* m = cuda_math_override.load(std::memory_order_acquire);
  return m ? *m : cuda;
}

void set_cuda_hook_math(HookMath* math) {
  cuda_math_override.store(math, std::memory_order_release);
}

StreamScope::StreamScope(void* stream, Device d) : before_(cuda_stream()) {
  if (!d.is_cpu() && (api_ = cuda::device_api())) device_.emplace(*api_, d.index);
  set_cuda_stream(stream);
}

StreamScope::~StreamScope() {
  set_cuda_stream(before_);
}

void register_comm_hook(const std::string& name, std::vector<std::string> params,
                        HookFactory factory) {
  if (name.empty() || name.find_first_of(":,=") != std::string::npos)
    throw bad_spec("a hook name must be non-empty and free of ':', ',' and '=': '" + name + "'");
  std::lock_guard lk(registry_mutex());
  registry()[name] = {std::move(params), std::move(factory)};
}

std::vector<std::string> comm_hook_names() {
  std::lock_guard lk(registry_mutex());
  std::vector<std::string> v;
  for (const auto& [name, e] : registry()) v.push_back(name);
  return v;
}

std::unique_ptr<CommHook> make_comm_hook(const std::string& spec) {
  auto colon = spec.find(':');
  std::string name = spec.substr(0, colon);
  std::string rest = colon == std::string::npos ? "" : spec.substr(colon + 1);
  if (name == "fp16_wrap" || name == "bf16_wrap") {
    if (rest.empty())
      throw bad_spec("'" + name + "' wraps another hook: write " + name + ":<hook>, e.g. " + name +
                     ":allreduce");
    return std::make_unique<CompressHook>(name == "fp16_wrap" ? DType::f16 : DType::bf16,
                                          make_comm_hook(rest));
  }
  Entry entry;
  bool found = false;
  {
    std::lock_guard lk(registry_mutex());
    auto it = registry().find(name);
    if (it != registry().end()) {
      entry = it->second;
      found = true;
    }
  }
  // (accepted_names() takes the registry lock itself.)
  if (!found) throw bad_spec("unknown hook '" + name + "'; known: " + accepted_names());
  HookParams params;
  size_t at = 0;
  while (at < rest.size()) {
    size_t comma = rest.find(',', at);
    std::string kv = rest.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    at = comma == std::string::npos ? rest.size() : comma + 1;
    if (kv.empty()) continue;
    auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0)
      throw bad_spec("'" + kv + "' in '" + spec + "' is not key=value");
    std::string key = kv.substr(0, eq);
    bool known = false;
    for (const auto& p : entry.params) known = known || p == key;
    if (!known) {
      std::string list;
      for (const auto& p : entry.params) list += (list.empty() ? "" : ", ") + p;
      throw bad_spec("hook '" + name + "' has no parameter '" + key + "'; it takes " +
                     (list.empty() ? std::string("none") : list));
    }
    params[key] = kv.substr(eq + 1);
  }
  return entry.factory(params);
}

}  // namespace collie
