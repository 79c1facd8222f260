// hooks/cpu_low_rank_math.cc: PowerSGD's arithmetic (LowRankMath) on host
// buffers: the matrix products through BLAS (cblas_sgemm, cblas_dgemm, where
// the build has BLAS), Gram-Schmidt orthogonalization, axpby and the normal
// fill, in f32 or f64. Its CUDA twin is cuda_low_rank_math.cc; the hook
// itself (powersgd.cc) picks one by its bucket's device.
#include <cmath>
#include <random>
#include <string>

#include "collie_build_config.h"
#include "hooks/powersgd.h"
#if COLLIE_HAVE_BLAS
#include <cblas.h>
#endif

namespace collie {

namespace {

template <typename T>
T* at(TensorView v) {
  return static_cast<T*>(v.data);
}

#if COLLIE_HAVE_BLAS
void gemm_t(bool ta, bool tb, size_t m, size_t n, size_t k, const float* a, const float* b,
            float* c) {
  const int M = static_cast<int>(m), N = static_cast<int>(n), K = static_cast<int>(k);
  if (n == 1 && !tb) {
    // A matrix times a vector: gemv reads the matrix once at full bandwidth.
    cblas_sgemv(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, ta ? K : M, ta ? M : K, 1.0f, a,
                ta ? M : K, b, 1, 0.0f, c, 1);
    return;
  }
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
              K, 1.0f, a, ta ? M : K, b, tb ? K : N, 0.0f, c, N);
}
void gemm_t(bool ta, bool tb, size_t m, size_t n, size_t k, const double* a, const double* b,
            double* c) {
  const int M = static_cast<int>(m), N = static_cast<int>(n), K = static_cast<int>(k);
  if (n == 1 && !tb) {
    cblas_dgemv(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, ta ? K : M, ta ? M : K, 1.0, a,
                ta ? M : K, b, 1, 0.0, c, 1);
    return;
  }
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
              K, 1.0, a, ta ? M : K, b, tb ? K : N, 0.0, c, N);
}
#endif

template <typename T>
void orthogonalize_t(T* a, size_t rows, size_t cols, double eps) {
  // Modified Gram-Schmidt over the columns of a row-major matrix; the sums
  // run in double so that rank-r inputs come back orthonormal to f32
  // precision even for long columns.
  for (size_t i = 0; i < cols; ++i) {
    double norm2 = 0;
    for (size_t r = 0; r < rows; ++r)
      norm2 += static_cast<double>(a[r * cols + i]) * a[r * cols + i];
    double norm = std::sqrt(norm2) + eps;
    double inv = norm > 0 ? 1.0 / norm : 0.0;
    for (size_t r = 0; r < rows; ++r) a[r * cols + i] = static_cast<T>(a[r * cols + i] * inv);
    for (size_t j = i + 1; j < cols; ++j) {
      double dot = 0;
      for (size_t r = 0; r < rows; ++r)
        dot += static_cast<double>(a[r * cols + i]) * a[r * cols + j];
      for (size_t r = 0; r < rows; ++r)
        a[r * cols + j] = static_cast<T>(a[r * cols + j] - dot * a[r * cols + i]);
    }
  }
}

template <typename T>
void axpby_t(double a, const T* x, double b, T* y, size_t n) {
  const T A = static_cast<T>(a), B = static_cast<T>(b);
  if (b == 0) {
    for (size_t i = 0; i < n; ++i) y[i] = A * x[i];
  } else if (a == 1 && b == 1) {
    for (size_t i = 0; i < n; ++i) y[i] += x[i];
  } else {
    for (size_t i = 0; i < n; ++i) y[i] = A * x[i] + B * y[i];
  }
}

class CpuLowRankMath final : public LowRankMath {
 public:
  void gemm(bool ta, bool tb, size_t m, size_t n, size_t k, TensorView a, TensorView b,
            TensorView c) override {
    check(a, b);
    check(a, c);
    if (a.numel < m * k || b.numel < k * n || c.numel < m * n)
      throw Error(ErrorCode::internal, "powersgd: matrix views smaller than their shapes");
#if COLLIE_HAVE_BLAS
    if (a.dtype == DType::f32)
      gemm_t(ta, tb, m, n, k, at<float>(a), at<float>(b), at<float>(c));
    else
      gemm_t(ta, tb, m, n, k, at<double>(a), at<double>(b), at<double>(c));
#else
    (void)ta;
    (void)tb;
    throw Error(ErrorCode::unavailable, "powersgd: collie was built without BLAS");
#endif
  }
  void orthogonalize(TensorView mat, size_t rows, size_t cols, double eps) override {
    check(mat, mat);
    if (mat.dtype == DType::f32)
      orthogonalize_t(at<float>(mat), rows, cols, eps);
    else
      orthogonalize_t(at<double>(mat), rows, cols, eps);
  }
  void axpby(double a, TensorView x, double b, TensorView y) override {
    check(x, y);
    if (x.numel != y.numel) throw Error(ErrorCode::internal, "powersgd: axpby sizes differ");
    if (x.dtype == DType::f32)
      axpby_t(a, at<float>(x), b, at<float>(y), x.numel);
    else
      axpby_t(a, at<double>(x), b, at<double>(y), x.numel);
  }
  void fill_normal(TensorView x, uint64_t seed) override {
    check(x, x);
    std::mt19937_64 g(seed);
    std::normal_distribution<double> d;
    for (size_t i = 0; i < x.numel; ++i) {
      if (x.dtype == DType::f32)
        at<float>(x)[i] = static_cast<float>(d(g));
      else
        at<double>(x)[i] = d(g);
    }
  }

 private:
  static void check(const TensorView& a, const TensorView& b) {
    if (a.dtype != b.dtype || (a.dtype != DType::f32 && a.dtype != DType::f64))
      throw Error(ErrorCode::invalid_argument,
                  "powersgd: the low-rank arithmetic runs on f32 or f64 (got " +
                      std::string(to_string(a.dtype)) + ")");
    if (!a.device.is_cpu() || !b.device.is_cpu())
      throw Error(ErrorCode::internal, "powersgd: the CPU low-rank math got a CUDA buffer");
  }
};

}  // namespace

LowRankMath& cpu_low_rank_math() {
  static CpuLowRankMath m;
  return m;
}

}  // namespace collie
