// base/cuda_api.h: every CUDA runtime call collie makes, behind one
// interface (as torchcomms puts NCCL behind NcclApi).
//
// The NCCL backend and the staging of CUDA tensors through host memory are
// written against this interface, not against cudart: CI, which has no GPU,
// runs their logic (stream and event ordering, error polling, abort on a
// deadline) against a fake (tests/fake_device.h), and the GPU machine runs
// it against runtime() below. Handles are opaque (a cudaStream_t or
// cudaEvent_t behind a void*), so that no CUDA header leaks past
// base/cuda_runtime.cc. A failing call throws collie::Error naming the
// call and CUDA's message.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "collie/types.h"

namespace collie::cuda {

using Stream = void*;  // cudaStream_t; nullptr is the legacy default stream
using Event = void*;   // cudaEvent_t

class Api {
 public:
  virtual ~Api() = default;
  // How many devices this process sees; 0, with the reason in `why`, when
  // none can be used (no driver, none visible).
  virtual int device_count(std::string* why) = 0;
  // The calling thread's current device.
  virtual void set_device(int device) = 0;
  virtual int current_device() = 0;
  // A stream that does not synchronise with the legacy default stream.
  virtual Stream create_stream() = 0;
  virtual void destroy_stream(Stream s) noexcept = 0;
  // An event without timing (the cheapest to record and query).
  virtual Event create_event() = 0;
  virtual void destroy_event(Event e) noexcept = 0;
  virtual void record(Event e, Stream s) = 0;
  // Whether the work before the event's last record has finished; throws
  // when the device reports an error.
  virtual bool query(Event e) = 0;
  // Work queued on `s` after this call starts once `e` has happened.
  virtual void stream_wait(Stream s, Event e) = 0;
  virtual void synchronize(Stream s) = 0;
  virtual void* device_alloc(size_t bytes) = 0;
  virtual void device_free(void* p) noexcept = 0;
  // Page-locked host memory, which copies to and from the device can
  // overlap with other work.
  virtual void* host_alloc(size_t bytes) = 0;
  virtual void host_free(void* p) noexcept = 0;
  // Any direction (cudaMemcpyDefault), ordered on `s`.
  virtual void copy_async(void* dst, const void* src, size_t bytes, Stream s) = 0;
  // Zeroes device memory, ordered on `s` (cudaMemsetAsync).
  virtual void zero_async(void* p, size_t bytes, Stream s) = 0;
};

// The CUDA runtime, when this build has it (COLLIE_HAVE_CUDA); else nullptr.
std::shared_ptr<Api> runtime();

// Makes `device` the calling thread's current one while it lives, and
// puts the one before back (a collie thread that runs a step for a tensor
// on another device, or a user's thread that runs a continuation inline).
class DeviceScope {
 public:
  DeviceScope(Api& api, int device) : api_(api), before_(api.current_device()) {
    if (before_ != device) api_.set_device(device);
    changed_ = before_ != device;
  }
  ~DeviceScope() {
    if (changed_) {
      try {
        api_.set_device(before_);
      } catch (...) {  // a destructor does not throw; the next call reports it
      }
    }
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  Api& api_;
  const int before_;
  bool changed_ = false;
};

// What connect() stages CUDA tensors through on the host backends:
// runtime(), unless a test has installed another (a fake device) first.
std::shared_ptr<Api> device_api();
void set_device_api(std::shared_ptr<Api> api);

// Memory on `device` (the host's, or a CUDA device's), copied and zeroed
// the same way: on the host at once, or through device_api() queued on the
// calling thread's current stream (collie::cuda_stream()). For the reducer,
// whose buckets and gradients may be on either. A CUDA device without a
// CUDA API is Error{unavailable}.
void copy(void* dst, const void* src, size_t bytes, Device device);
void zero(void* p, size_t bytes, Device device);
// Waits for what the calling thread queued on its current stream (nothing
// to wait for on the host).
void wait_queued(Device device);

}  // namespace collie::cuda
