// comm/cuda/blas_runtime.cc: cuda::BlasApi over cuBLAS, when this build has
// it. Without it, blas_runtime() says there is none.
#include <string>

#include "collie/error.h"
#include "collie_build_config.h"
#include "comm/core/installed.h"
#include "comm/cuda/blas_api.h"

#if COLLIE_HAVE_CUBLAS
#include <cublas_v2.h>
#endif

namespace collie::cuda {

#if COLLIE_HAVE_CUBLAS
namespace {

void check(cublasStatus_t rc, const char* call) {
  if (rc == CUBLAS_STATUS_SUCCESS) return;
  throw Error(ErrorCode::internal, std::string(call) + " failed: " + cublasGetStatusString(rc) +
                                       " (" + cublasGetStatusName(rc) + ")");
}

cublasHandle_t hd(BlasHandle h) {
  return static_cast<cublasHandle_t>(h);
}

cublasOperation_t op(bool trans) {
  return trans ? CUBLAS_OP_T : CUBLAS_OP_N;
}

Error not_floating(DType t) {
  return Error(ErrorCode::invalid_argument,
               "cuBLAS: f32 or f64 only, not " + std::string(to_string(t)));
}

class Cublas final : public BlasApi {
 public:
  BlasHandle create_handle() override {
    cublasHandle_t h = nullptr;
    check(cublasCreate(&h), "cublasCreate");
    // Scalars (alpha, beta, and the results of nrm2 and dot) live on the host.
    check(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST), "cublasSetPointerMode");
    return h;
  }
  void destroy_handle(BlasHandle h) noexcept override { (void)cublasDestroy(hd(h)); }
  void set_stream(BlasHandle h, Stream s) override {
    check(cublasSetStream(hd(h), static_cast<cudaStream_t>(s)), "cublasSetStream");
  }
  void gemm(BlasHandle h, DType t, bool ta, bool tb, int m, int n, int k, double alpha,
            const void* a, int lda, const void* b, int ldb, double beta, void* c,
            int ldc) override {
    if (t == DType::f32) {
      const float al = static_cast<float>(alpha), be = static_cast<float>(beta);
      check(cublasSgemm(hd(h), op(ta), op(tb), m, n, k, &al, static_cast<const float*>(a), lda,
                        static_cast<const float*>(b), ldb, &be, static_cast<float*>(c), ldc),
            "cublasSgemm");
    } else if (t == DType::f64) {
      check(cublasDgemm(hd(h), op(ta), op(tb), m, n, k, &alpha, static_cast<const double*>(a), lda,
                        static_cast<const double*>(b), ldb, &beta, static_cast<double*>(c), ldc),
            "cublasDgemm");
    } else {
      throw not_floating(t);
    }
  }
  double nrm2(BlasHandle h, DType t, int n, const void* x, int incx) override {
    if (t == DType::f32) {
      float r = 0;
      check(cublasSnrm2(hd(h), n, static_cast<const float*>(x), incx, &r), "cublasSnrm2");
      return r;
    }
    if (t != DType::f64) throw not_floating(t);
    double r = 0;
    check(cublasDnrm2(hd(h), n, static_cast<const double*>(x), incx, &r), "cublasDnrm2");
    return r;
  }
  double dot(BlasHandle h, DType t, int n, const void* x, int incx, const void* y,
             int incy) override {
    if (t == DType::f32) {
      float r = 0;
      check(cublasSdot(hd(h), n, static_cast<const float*>(x), incx, static_cast<const float*>(y),
                       incy, &r),
            "cublasSdot");
      return r;
    }
    if (t != DType::f64) throw not_floating(t);
    double r = 0;
    check(cublasDdot(hd(h), n, static_cast<const double*>(x), incx, static_cast<const double*>(y),
                     incy, &r),
          "cublasDdot");
    return r;
  }
  void scal(BlasHandle h, DType t, int n, double alpha, void* x, int incx) override {
    if (t == DType::f32) {
      const float al = static_cast<float>(alpha);
      check(cublasSscal(hd(h), n, &al, static_cast<float*>(x), incx), "cublasSscal");
    } else if (t == DType::f64) {
      check(cublasDscal(hd(h), n, &alpha, static_cast<double*>(x), incx), "cublasDscal");
    } else {
      throw not_floating(t);
    }
  }
  void axpy(BlasHandle h, DType t, int n, double alpha, const void* x, int incx, void* y,
            int incy) override {
    if (t == DType::f32) {
      const float al = static_cast<float>(alpha);
      check(cublasSaxpy(hd(h), n, &al, static_cast<const float*>(x), incx, static_cast<float*>(y),
                        incy),
            "cublasSaxpy");
    } else if (t == DType::f64) {
      check(cublasDaxpy(hd(h), n, &alpha, static_cast<const double*>(x), incx,
                        static_cast<double*>(y), incy),
            "cublasDaxpy");
    } else {
      throw not_floating(t);
    }
  }
};

}  // namespace

std::shared_ptr<BlasApi> blas_runtime() {
  static const std::shared_ptr<BlasApi> api = std::make_shared<Cublas>();
  return api;
}
#else
std::shared_ptr<BlasApi> blas_runtime() {
  return nullptr;
}
#endif

namespace {
Installed<BlasApi>& installed() {
  static Installed<BlasApi> api(&blas_runtime);
  return api;
}
}  // namespace

std::shared_ptr<BlasApi> blas_api() {
  return installed().get();
}

void set_blas_api(std::shared_ptr<BlasApi> api) {
  installed().set(std::move(api));
}

}  // namespace collie::cuda
