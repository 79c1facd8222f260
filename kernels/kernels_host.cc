// kernels/kernels_host.cc: the CPU twins, and the launchers' stand-ins in
// a build without CUDA.
#include <cstring>

#include "collie/error.h"
#include "collie_build_config.h"
#include "kernels/kernels.h"

namespace collie::gpu {

void copy_all_cpu(const Copy* copies, size_t n) {
  for (size_t i = 0; i < n; ++i) std::memcpy(copies[i].dst, copies[i].src, copies[i].bytes);
}

#if !COLLIE_HAVE_CUDA
namespace {
[[noreturn]] void none(const char* what) {
  throw Error(ErrorCode::unavailable, std::string(what) +
                                          ": this build of collie has no CUDA (configure with "
                                          "-Dcuda=enabled, the toolkit under CUDA_HOME)");
}
}  // namespace

bool built() {
  return false;
}
void convert(DType, const void*, DType, void*, size_t, int, void*) {
  none("gpu::convert");
}
void copy_all(const Copy*, size_t, void*) {
  none("gpu::copy_all");
}
#endif

}  // namespace collie::gpu
