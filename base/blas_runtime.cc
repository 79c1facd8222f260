// base/blas_runtime.cc: cuda::BlasApi over cuBLAS, when this build has
// it. Without it, blas_runtime() says there is none.
//
// cuBLAS is opened at its first use (dlopen), not linked: linked, every
// process that loads libcollie also mapped cuBLAS and cuBLASLt, and a
// program's start-up went from 10 MB and 0.01 s to 230 MB and 0.17 s
// (measured on test_buckets --gtest_list_tests), while only PowerSGD on
// CUDA buckets needs it.
#include <string>

#include "base/blas_api.h"
#include "base/installed.h"
#include "collie/error.h"
#include "collie_build_config.h"

#if COLLIE_HAVE_CUBLAS
#include <cublas_v2.h>
#include <dlfcn.h>
#endif

namespace collie::cuda {

#if COLLIE_HAVE_CUBLAS
namespace {

#define COLLIE_STR2(x) #x
#define COLLIE_STR(x) COLLIE_STR2(x)

// The cuBLAS entry points collie calls, resolved from the library this
// build was compiled against (its major version), found by the loader's
// search (which takes libcollie's RUNPATH), else in the toolkit's folder
// found at configure time.
struct CublasSymbols {
#define COLLIE_CUBLAS_FN(name) decltype(&::cublas##name) name = nullptr;
  COLLIE_CUBLAS_FN(Create_v2)
  COLLIE_CUBLAS_FN(Destroy_v2)
  COLLIE_CUBLAS_FN(SetStream_v2)
  COLLIE_CUBLAS_FN(SetPointerMode_v2)
  COLLIE_CUBLAS_FN(Sgemm_v2)
  COLLIE_CUBLAS_FN(Dgemm_v2)
  COLLIE_CUBLAS_FN(Snrm2_v2)
  COLLIE_CUBLAS_FN(Dnrm2_v2)
  COLLIE_CUBLAS_FN(Sdot_v2)
  COLLIE_CUBLAS_FN(Ddot_v2)
  COLLIE_CUBLAS_FN(Sscal_v2)
  COLLIE_CUBLAS_FN(Dscal_v2)
  COLLIE_CUBLAS_FN(Saxpy_v2)
  COLLIE_CUBLAS_FN(Daxpy_v2)
  COLLIE_CUBLAS_FN(GetStatusString)
  COLLIE_CUBLAS_FN(GetStatusName)
#undef COLLIE_CUBLAS_FN
  std::string error;  // why it could not be loaded; empty once loaded

  CublasSymbols() {
    const std::string soname = "libcublas.so." COLLIE_STR(CUBLAS_VER_MAJOR);
    void* lib = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib)
      lib = dlopen((std::string(COLLIE_CUBLAS_DIR "/") + soname).c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* why = dlerror();
      error = "cannot load " + soname + " (nor from " COLLIE_CUBLAS_DIR "): " + (why ? why : "?");
      return;
    }
#define COLLIE_CUBLAS_FN(name)                                         \
  name = reinterpret_cast<decltype(name)>(dlsym(lib, "cublas" #name)); \
  if (!name) {                                                         \
    error = soname + " has no cublas" #name;                           \
    return;                                                            \
  }
    COLLIE_CUBLAS_FN(Create_v2)
    COLLIE_CUBLAS_FN(Destroy_v2)
    COLLIE_CUBLAS_FN(SetStream_v2)
    COLLIE_CUBLAS_FN(SetPointerMode_v2)
    COLLIE_CUBLAS_FN(Sgemm_v2)
    COLLIE_CUBLAS_FN(Dgemm_v2)
    COLLIE_CUBLAS_FN(Snrm2_v2)
    COLLIE_CUBLAS_FN(Dnrm2_v2)
    COLLIE_CUBLAS_FN(Sdot_v2)
    COLLIE_CUBLAS_FN(Ddot_v2)
    COLLIE_CUBLAS_FN(Sscal_v2)
    COLLIE_CUBLAS_FN(Dscal_v2)
    COLLIE_CUBLAS_FN(Saxpy_v2)
    COLLIE_CUBLAS_FN(Daxpy_v2)
    COLLIE_CUBLAS_FN(GetStatusString)
    COLLIE_CUBLAS_FN(GetStatusName)
#undef COLLIE_CUBLAS_FN
  }
};

// Loaded at the first call (never unloaded: handles may outlive any owner).
const CublasSymbols& cublas() {
  static const CublasSymbols s;
  if (!s.error.empty()) throw Error(ErrorCode::unavailable, "cuBLAS: " + s.error);
  return s;
}

void check(cublasStatus_t rc, const char* call) {
  if (rc == CUBLAS_STATUS_SUCCESS) return;
  throw Error(ErrorCode::internal, std::string(call) + " failed: " + cublas().GetStatusString(rc) +
                                       " (" + cublas().GetStatusName(rc) + ")");
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
    check(cublas().Create_v2(&h), "cublasCreate");
    // Scalars (alpha, beta, and the results of nrm2 and dot) live on the host.
    check(cublas().SetPointerMode_v2(h, CUBLAS_POINTER_MODE_HOST), "cublasSetPointerMode");
    return h;
  }
  void destroy_handle(BlasHandle h) noexcept override { (void)cublas().Destroy_v2(hd(h)); }
  void set_stream(BlasHandle h, Stream s) override {
    check(cublas().SetStream_v2(hd(h), static_cast<cudaStream_t>(s)), "cublasSetStream");
  }
  void gemm(BlasHandle h, DType t, bool ta, bool tb, int m, int n, int k, double alpha,
            const void* a, int lda, const void* b, int ldb, double beta, void* c,
            int ldc) override {
    if (t == DType::f32) {
      const float al = static_cast<float>(alpha), be = static_cast<float>(beta);
      check(
          cublas().Sgemm_v2(hd(h), op(ta), op(tb), m, n, k, &al, static_cast<const float*>(a), lda,
                            static_cast<const float*>(b), ldb, &be, static_cast<float*>(c), ldc),
          "cublasSgemm");
    } else if (t == DType::f64) {
      check(cublas().Dgemm_v2(hd(h), op(ta), op(tb), m, n, k, &alpha, static_cast<const double*>(a),
                              lda, static_cast<const double*>(b), ldb, &beta,
                              static_cast<double*>(c), ldc),
            "cublasDgemm");
    } else {
      throw not_floating(t);
    }
  }
  double nrm2(BlasHandle h, DType t, int n, const void* x, int incx) override {
    if (t == DType::f32) {
      float r = 0;
      check(cublas().Snrm2_v2(hd(h), n, static_cast<const float*>(x), incx, &r), "cublasSnrm2");
      return r;
    }
    if (t != DType::f64) throw not_floating(t);
    double r = 0;
    check(cublas().Dnrm2_v2(hd(h), n, static_cast<const double*>(x), incx, &r), "cublasDnrm2");
    return r;
  }
  double dot(BlasHandle h, DType t, int n, const void* x, int incx, const void* y,
             int incy) override {
    if (t == DType::f32) {
      float r = 0;
      check(cublas().Sdot_v2(hd(h), n, static_cast<const float*>(x), incx,
                             static_cast<const float*>(y), incy, &r),
            "cublasSdot");
      return r;
    }
    if (t != DType::f64) throw not_floating(t);
    double r = 0;
    check(cublas().Ddot_v2(hd(h), n, static_cast<const double*>(x), incx,
                           static_cast<const double*>(y), incy, &r),
          "cublasDdot");
    return r;
  }
  void scal(BlasHandle h, DType t, int n, double alpha, void* x, int incx) override {
    if (t == DType::f32) {
      const float al = static_cast<float>(alpha);
      check(cublas().Sscal_v2(hd(h), n, &al, static_cast<float*>(x), incx), "cublasSscal");
    } else if (t == DType::f64) {
      check(cublas().Dscal_v2(hd(h), n, &alpha, static_cast<double*>(x), incx), "cublasDscal");
    } else {
      throw not_floating(t);
    }
  }
  void axpy(BlasHandle h, DType t, int n, double alpha, const void* x, int incx, void* y,
            int incy) override {
    if (t == DType::f32) {
      const float al = static_cast<float>(alpha);
      check(cublas().Saxpy_v2(hd(h), n, &al, static_cast<const float*>(x), incx,
                              static_cast<float*>(y), incy),
            "cublasSaxpy");
    } else if (t == DType::f64) {
      check(cublas().Daxpy_v2(hd(h), n, &alpha, static_cast<const double*>(x), incx,
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
Installed<BlasApi>& installed_blas() {
  static Installed<BlasApi> api(&blas_runtime);
  return api;
}
}  // namespace

std::shared_ptr<BlasApi> blas_api() {
  return installed_blas().get();
}

void set_blas_api(std::shared_ptr<BlasApi> api) {
  installed_blas().set(std::move(api));
}

}  // namespace collie::cuda
