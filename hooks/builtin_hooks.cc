// hooks/builtin_hooks.cc: the hooks that need no parameters: allreduce
// (the default: the average over every rank), noop (nothing sent, for
// measuring), and fp16/bf16 compression on its own or around another hook
// (fp16_wrap:, bf16_wrap:).
#include "hooks/builtin_hooks.h"

#include <map>
#include <vector>

#include "base/cuda_api.h"
#include "hooks/stream_scope.h"

namespace collie {

namespace {

class AllreduceHook final : public CommHook {
 public:
  std::string name() const override { return "allreduce"; }
  Work run(Communicator& comm, GradBucket& b) override {
    count_bytes(b.buffer.nbytes());
    if (b.seen) return comm.allreduce(b.buffer, b.buffer, ReduceOp::avg, *b.seen);
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

}  // namespace

std::unique_ptr<CommHook> make_allreduce_hook() {
  return std::make_unique<AllreduceHook>();
}

std::unique_ptr<CommHook> make_noop_hook() {
  return std::make_unique<NoopHook>();
}

std::unique_ptr<CommHook> make_compress_hook(DType narrow, std::unique_ptr<CommHook> inner) {
  return std::make_unique<CompressHook>(narrow, std::move(inner));
}

}  // namespace collie
