// base/cuda_runtime.cc: cuda::Api over the CUDA runtime (cudart), when
// this build has it. Without it, runtime() says there is none.
#include <cstring>

#include "base/cuda_api.h"
#include "base/installed.h"
#include "collie/comm.h"
#include "collie/error.h"
#include "collie_build_config.h"

#if COLLIE_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace collie {

namespace {
thread_local void* current_stream = nullptr;
}  // namespace

void set_cuda_stream(void* stream) {
  current_stream = stream;
}

void* cuda_stream() {
  return current_stream;
}

}  // namespace collie

namespace collie::cuda {

#if COLLIE_HAVE_CUDA
namespace {

void check(cudaError_t rc, const char* call) {
  if (rc == cudaSuccess) return;
  throw Error(ErrorCode::internal, std::string(call) + " failed: " + cudaGetErrorString(rc) + " (" +
                                       cudaGetErrorName(rc) + ")");
}

class Runtime final : public Api {
 public:
  int device_count(std::string* why) override {
    int n = 0;
    cudaError_t rc = cudaGetDeviceCount(&n);
    if (rc != cudaSuccess) {
      if (why) *why = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(rc);
      (void)cudaGetLastError();  // clear it: it is not this thread's next call's error
      return 0;
    }
    if (n == 0 && why) *why = "no CUDA device is visible (CUDA_VISIBLE_DEVICES?)";
    return n;
  }
  void set_device(int device) override { check(cudaSetDevice(device), "cudaSetDevice"); }
  int current_device() override {
    int d = 0;
    check(cudaGetDevice(&d), "cudaGetDevice");
    return d;
  }
  Stream create_stream() override {
    cudaStream_t s = nullptr;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    return s;
  }
  void destroy_stream(Stream s) noexcept override {
    (void)cudaStreamDestroy(static_cast<cudaStream_t>(s));
  }
  Event create_event() override {
    cudaEvent_t e = nullptr;
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    return e;
  }
  void destroy_event(Event e) noexcept override {
    (void)cudaEventDestroy(static_cast<cudaEvent_t>(e));
  }
  void record(Event e, Stream s) override {
    check(cudaEventRecord(static_cast<cudaEvent_t>(e), static_cast<cudaStream_t>(s)),
          "cudaEventRecord");
  }
  bool query(Event e) override {
    cudaError_t rc = cudaEventQuery(static_cast<cudaEvent_t>(e));
    if (rc == cudaErrorNotReady) return false;
    check(rc, "cudaEventQuery");
    return true;
  }
  void stream_wait(Stream s, Event e) override {
    check(cudaStreamWaitEvent(static_cast<cudaStream_t>(s), static_cast<cudaEvent_t>(e), 0),
          "cudaStreamWaitEvent");
  }
  void synchronize(Stream s) override {
    check(cudaStreamSynchronize(static_cast<cudaStream_t>(s)), "cudaStreamSynchronize");
  }
  void* device_alloc(size_t bytes) override {
    void* p = nullptr;
    check(cudaMalloc(&p, bytes), "cudaMalloc");
    return p;
  }
  void device_free(void* p) noexcept override { (void)cudaFree(p); }
  void* host_alloc(size_t bytes) override {
    void* p = nullptr;
    check(cudaHostAlloc(&p, bytes, cudaHostAllocDefault), "cudaHostAlloc");
    return p;
  }
  void host_free(void* p) noexcept override { (void)cudaFreeHost(p); }
  void copy_async(void* dst, const void* src, size_t bytes, Stream s) override {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(s)),
          "cudaMemcpyAsync");
  }
  void zero_async(void* p, size_t bytes, Stream s) override {
    check(cudaMemsetAsync(p, 0, bytes, static_cast<cudaStream_t>(s)), "cudaMemsetAsync");
  }
};

}  // namespace

std::shared_ptr<Api> runtime() {
  static const std::shared_ptr<Api> api = std::make_shared<Runtime>();
  return api;
}
#else
std::shared_ptr<Api> runtime() {
  return nullptr;
}
#endif

namespace {
Installed<Api>& installed() {
  static Installed<Api> api(&runtime);
  return api;
}
}  // namespace

std::shared_ptr<Api> device_api() {
  return installed().get();
}

void set_device_api(std::shared_ptr<Api> api) {
  installed().set(std::move(api));
}

namespace {
std::shared_ptr<Api> api_for(Device device) {
  auto api = device_api();
  if (!api)
    throw Error(ErrorCode::unavailable,
                "memory on " + to_string(device) + ": this build of collie has no CUDA");
  return api;
}
}  // namespace

void copy(void* dst, const void* src, size_t bytes, Device device) {
  if (bytes == 0) return;
  if (device.is_cpu()) {
    std::memcpy(dst, src, bytes);
    return;
  }
  api_for(device)->copy_async(dst, src, bytes, cuda_stream());
}

void zero(void* p, size_t bytes, Device device) {
  if (bytes == 0) return;
  if (device.is_cpu()) {
    std::memset(p, 0, bytes);
    return;
  }
  api_for(device)->zero_async(p, bytes, cuda_stream());
}

void wait_queued(Device device) {
  if (!device.is_cpu()) api_for(device)->synchronize(cuda_stream());
}

}  // namespace collie::cuda
