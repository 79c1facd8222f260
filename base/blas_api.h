// base/blas_api.h: the cuBLAS calls collie makes, behind one interface
// (as cuda_api.h puts the CUDA runtime behind cuda::Api).
//
// PowerSGD's arithmetic on CUDA buckets (hooks/powersgd.cc) is written
// against this interface, so that CI, which has no GPU, runs it against a
// fake (tests/fake_device.h) and the GPU machine against blas_runtime().
// Only what that arithmetic needs, with cuBLAS's own conventions: matrices
// are column-major, vectors strided; each call is queued on the stream the
// handle is bound to, except nrm2 and dot, which return their result to the
// host and so wait for it. Row-major helpers live in collie code, not here.
// f32 and f64 only. A failing call throws collie::Error naming the call.
#pragma once

#include <memory>

#include "base/cuda_api.h"
#include "collie/types.h"

namespace collie::cuda {

using BlasHandle = void*;  // cublasHandle_t

class BlasApi {
 public:
  virtual ~BlasApi() = default;
  virtual BlasHandle create_handle() = 0;
  virtual void destroy_handle(BlasHandle h) noexcept = 0;
  // Later calls on `h` are queued on `s` (cublasSetStream).
  virtual void set_stream(BlasHandle h, Stream s) = 0;
  // c (m x n) = alpha op(a) op(b) + beta c, column-major, op(a) m x k.
  virtual void gemm(BlasHandle h, DType t, bool trans_a, bool trans_b, int m, int n, int k,
                    double alpha, const void* a, int lda, const void* b, int ldb, double beta,
                    void* c, int ldc) = 0;
  // The Euclidean norm of n elements of x, `incx` apart; waits for it.
  virtual double nrm2(BlasHandle h, DType t, int n, const void* x, int incx) = 0;
  // sum x_i y_i; waits for it.
  virtual double dot(BlasHandle h, DType t, int n, const void* x, int incx, const void* y,
                     int incy) = 0;
  // x = alpha x.
  virtual void scal(BlasHandle h, DType t, int n, double alpha, void* x, int incx) = 0;
  // y = alpha x + y.
  virtual void axpy(BlasHandle h, DType t, int n, double alpha, const void* x, int incx, void* y,
                    int incy) = 0;
};

// cuBLAS, when this build has it (COLLIE_HAVE_CUBLAS); else nullptr.
std::shared_ptr<BlasApi> blas_runtime();

// What the hooks' arithmetic on CUDA buckets uses: blas_runtime(), unless a
// test has installed another (a fake device's) first.
std::shared_ptr<BlasApi> blas_api();
void set_blas_api(std::shared_ptr<BlasApi> api);

}  // namespace collie::cuda
