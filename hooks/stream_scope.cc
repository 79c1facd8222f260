// hooks/stream_scope.cc: StreamScope (stream_scope.h), a thread's current
// stream and device for the life of a hook's step.
#include "hooks/stream_scope.h"

namespace collie {

StreamScope::StreamScope(void* stream, Device d) : before_(cuda_stream()) {
  if (!d.is_cpu() && (api_ = cuda::device_api())) device_.emplace(*api_, d.index);
  set_cuda_stream(stream);
}

StreamScope::~StreamScope() {
  set_cuda_stream(before_);
}

}  // namespace collie
