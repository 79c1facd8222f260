// hooks/stream_scope.h: a hook step's CUDA stream and device (internal: not
// installed, as it needs base/cuda_api.h).
#pragma once

#include <memory>
#include <optional>

#include "base/cuda_api.h"
#include "collie/comm.h"

namespace collie {

// Makes `stream` this thread's current stream while it lives: a hook's
// later steps run on whichever thread completed the step before (a
// continuation thread, or the caller's own when the step had ended
// already), and must queue their work on the stream the bucket was handed
// over on. For a CUDA bucket the bucket's device is the thread's current
// one meanwhile too: a collie thread starts on device 0, and the stream,
// the kernels and a cuBLAS handle must be on the bucket's. Both are put
// back after.
class StreamScope {
 public:
  StreamScope(void* stream, Device d);
  ~StreamScope();
  StreamScope(const StreamScope&) = delete;
  StreamScope& operator=(const StreamScope&) = delete;

 private:
  void* before_;
  std::shared_ptr<cuda::Api> api_;
  std::optional<cuda::DeviceScope> device_;
};

}  // namespace collie
