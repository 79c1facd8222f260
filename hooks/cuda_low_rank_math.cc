// hooks/cuda_low_rank_math.cc: PowerSGD's arithmetic (LowRankMath) on CUDA
// buffers, through cuda::BlasApi and cuda::Api only: no kernels of its own,
// so that the whole path runs against the fake device in CI.
//
// Every call is queued on the calling thread's current stream
// (collie::cuda_stream()), which the hook sets to the stream its bucket
// was handed over on. cuBLAS is column-major and collie's matrices are
// row-major: a row-major m x n matrix is, read column-major, its n x m
// transpose, so C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T.
#include <mutex>
#include <vector>

#include "base/blas_api.h"
#include "base/cuda_api.h"
#include "collie/comm.h"
#include "hooks/powersgd.h"

namespace collie {

namespace {

// A cuBLAS handle per thread (a handle must not be used by two threads at
// once), made through whichever BlasApi is installed for the device the
// thread works on (a handle belongs to the device current when it was
// made; the hook makes the bucket's current first), and bound to the
// thread's current stream before each call.
class ThreadHandle {
 public:
  ~ThreadHandle() { reset(); }
  std::pair<cuda::BlasApi*, cuda::BlasHandle> get(int device) {
    auto api = cuda::blas_api();
    if (!api)
      throw Error(ErrorCode::unavailable,
                  "powersgd: CUDA buckets need cuBLAS, and this build of collie has none "
                  "(configure with -Dcuda=enabled and the toolkit under CUDA_HOME)");
    if (api != api_ || device != device_) {
      reset();
      h_ = api->create_handle();
      api_ = std::move(api);
      device_ = device;
    }
    api_->set_stream(h_, cuda_stream());
    return {api_.get(), h_};
  }

 private:
  void reset() {
    if (api_) api_->destroy_handle(h_);
    api_.reset();
  }
  std::shared_ptr<cuda::BlasApi> api_;
  cuda::BlasHandle h_ = nullptr;
  int device_ = -1;
};

std::pair<cuda::BlasApi*, cuda::BlasHandle> blas(const Device& d) {
  thread_local ThreadHandle handle;
  return handle.get(d.index);
}

std::shared_ptr<cuda::Api> device() {
  auto api = cuda::device_api();
  if (!api)
    throw Error(ErrorCode::unavailable, "powersgd: a CUDA bucket, but this build has no CUDA");
  return api;
}

int as_int(size_t n) {
  if (n > static_cast<size_t>(INT32_MAX))
    throw Error(ErrorCode::invalid_argument,
                "powersgd: a dimension of " + std::to_string(n) + " is beyond cuBLAS's int");
  return static_cast<int>(n);
}

void check(const TensorView& a, const TensorView& b) {
  if (a.dtype != b.dtype || (a.dtype != DType::f32 && a.dtype != DType::f64))
    throw Error(ErrorCode::invalid_argument,
                "powersgd: the low-rank arithmetic runs on f32 or f64 (got " +
                    std::string(to_string(a.dtype)) + ")");
  if (a.device.is_cpu() || b.device.is_cpu())
    throw Error(ErrorCode::internal, "powersgd: the CUDA low-rank math got a host buffer");
}

class CudaLowRankMath final : public LowRankMath {
 public:
  void gemm(bool ta, bool tb, size_t m, size_t n, size_t k, TensorView a, TensorView b,
            TensorView c) override {
    check(a, b);
    check(a, c);
    if (a.numel < m * k || b.numel < k * n || c.numel < m * n)
      throw Error(ErrorCode::internal, "powersgd: matrix views smaller than their shapes");
    if (m == 0 || n == 0) return;
    auto [api, h] = blas(c.device);
    if (k == 0) {
      cuda::zero(c.data, c.nbytes(), c.device);  // an empty sum
      return;
    }
    // Row-major leading dimensions: the row lengths as stored.
    const int lda = as_int(ta ? m : k), ldb = as_int(tb ? k : n), ldc = as_int(n);
    api->gemm(h, a.dtype, tb, ta, as_int(n), as_int(m), as_int(k), 1.0, b.data, ldb, a.data, lda,
              0.0, c.data, ldc);
  }

  // Modified Gram-Schmidt as the CPU twin does it, column by column, with
  // the norms and dot products brought to the host to decide on (a zero
  // column is left zero, not divided by zero).
  void orthogonalize(TensorView mat, size_t rows, size_t cols, double eps) override {
    check(mat, mat);
    if (rows == 0 || cols == 0) return;
    if (mat.numel < rows * cols)
      throw Error(ErrorCode::internal, "powersgd: matrix view smaller than its shape");
    auto [api, h] = blas(mat.device);
    const size_t es = dtype_size(mat.dtype);
    auto col = [&](size_t i) { return static_cast<uint8_t*>(mat.data) + i * es; };
    const int n = as_int(rows), inc = as_int(cols);
    for (size_t i = 0; i < cols; ++i) {
      const double norm = api->nrm2(h, mat.dtype, n, col(i), inc) + eps;
      api->scal(h, mat.dtype, n, norm > 0 ? 1.0 / norm : 0.0, col(i), inc);
      for (size_t j = i + 1; j < cols; ++j) {
        const double d = api->dot(h, mat.dtype, n, col(i), inc, col(j), inc);
        api->axpy(h, mat.dtype, n, -d, col(i), inc, col(j), inc);
      }
    }
  }

  void axpby(double a, TensorView x, double b, TensorView y) override {
    check(x, y);
    if (x.numel != y.numel) throw Error(ErrorCode::internal, "powersgd: axpby sizes differ");
    if (x.numel == 0) return;
    auto [api, h] = blas(y.device);
    const int n = as_int(x.numel);
    if (b == 0)
      cuda::zero(y.data, y.nbytes(), y.device);  // y's old contents ignored, NaN too
    else if (b != 1)
      api->scal(h, y.dtype, n, b, y.data, 1);
    if (a != 0) api->axpy(h, x.dtype, n, a, x.data, 1, y.data, 1);
  }

  // Drawn on the host by the CPU twin's generator, so that every rank, and
  // the CPU hook, start from the same values; waits for the copy, whose
  // source is this call's.
  void fill_normal(TensorView x, uint64_t seed) override {
    check(x, x);
    std::vector<uint8_t> host(x.nbytes());
    cpu_low_rank_math().fill_normal(TensorView{host.data(), x.dtype, x.numel, Device::cpu()}, seed);
    device()->copy_async(x.data, host.data(), host.size(), cuda_stream());
    cuda::wait_queued(x.device);
  }
};

}  // namespace

LowRankMath& cuda_low_rank_math() {
  static CudaLowRankMath m;
  return m;
}

LowRankMath& low_rank_math_for(const Device& d) {
  return d.is_cpu() ? cpu_low_rank_math() : cuda_low_rank_math();
}

}  // namespace collie
