// hooks/hook_math.cc: the compression hooks' arithmetic (HookMath): casts
// to and from a 16-bit float type, with the division for the average, on
// host buffers (kernels' CPU twins) or CUDA ones (the kernels), and the
// choice between them by the bucket's device (a test may install its own
// for CUDA: set_cuda_hook_math).
#include <atomic>
#include <string>

#include "base/cuda_api.h"
#include "base/reduce.h"
#include "hooks/comm_hook.h"
#include "kernels/kernels.h"

namespace collie {

namespace {

Error bad_compression(const std::string& msg) {
  return Error(ErrorCode::invalid_argument, "comm hook: " + msg);
}

void check_pair(const TensorView& a, const TensorView& b) {
  if (a.numel != b.numel) throw bad_compression("compression buffers differ in size");
  if (!is_floating(a.dtype) || !is_floating(b.dtype))
    throw bad_compression("compression needs floating-point gradients");
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

}  // namespace

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

}  // namespace collie
