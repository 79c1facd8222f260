// hooks/powersgd.h: PowerSGD gradient compression (Vogels et al., 2019),
// with the semantics of PyTorch's powerSGD_hook and batched_powerSGD_hook.
//
//   COLLIE_COMM_HOOK="powersgd:rank=2,start_iter=10"
//
// Each gradient viewed as an n x m matrix M (rows = its first dimension) is
// sent as two thin factors: P = M Q (n x r) is all-reduced and
// orthogonalised, then Q = M^T P (m x r) is all-reduced, and M ~ P Q^T / world
// is written back into the bucket. A matrix is compressed only when that
// saves at least min_compression_rate times its size,
// (n + m) r min_compression_rate < n m; the rest (biases, small tensors)
// travel uncompressed, in the same all-reduce as the P factors. With error
// feedback, what compression lost on this rank is added to its next
// gradient; with warm start, Q carries over from the last iteration, so the
// power iteration keeps converging instead of starting from noise.
// batched_powersgd compresses the whole bucket as one square matrix instead.
//
// The arithmetic sits behind LowRankMath: on CPU buckets over BLAS, on CUDA
// buckets over cuBLAS (hooks/cuda_low_rank_math.cc), through the thin
// cuda::BlasApi and cuda::Api interfaces, so that CI runs the CUDA path
// against a fake device. On a CUDA bucket the hook's state (error feedback,
// P, Q, the batched square, the wire copies) lives in device memory, its
// arithmetic and copies are queued on the stream the bucket was handed over
// on (collie::cuda_stream() at run()), each all-reduce is issued after them
// on that stream, and the hook's Work ends once the bucket holds the result.
// Q is drawn on the host by one generator, so a CUDA rank and a CPU rank
// start from the same Q. 16-bit buckets on CUDA are widened by the CUDA
// hook math's kernels.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "hooks/comm_hook.h"

namespace collie {

struct PowerSgdOptions {
  int rank = 1;                     // matrix_approximation_rank
  uint64_t start_iter = 1000;       // plain all-reduce before this iteration
  double min_compression_rate = 2;  // compress a matrix only if it saves this factor
  bool error_feedback = true;
  bool warm_start = true;
  double orthogonalization_epsilon = 0;
  uint64_t seed = 0;     // the random initial Q; the same on every rank
  bool batched = false;  // the whole bucket as one square matrix
};

// Checks the options (start_iter > 1 with error feedback or warm start:
// buckets are rebuilt after the first iteration) and builds the hook.
std::unique_ptr<CommHook> make_powersgd_hook(const PowerSgdOptions& options);
std::unique_ptr<CommHook> make_powersgd_hook(const HookParams& params, bool batched);
std::vector<std::string> powersgd_param_names();

// Whether PowerSGD compresses an n x m gradient at rank r.
bool powersgd_compresses(size_t n, size_t m, size_t r, double min_compression_rate);

// Row-major dense arithmetic on f32 or f64 views.
struct LowRankMath {
  virtual ~LowRankMath() = default;
  // c (m x n) = op(a) op(b), op(x) = x or x^T, k the inner dimension.
  virtual void gemm(bool trans_a, bool trans_b, size_t m, size_t n, size_t k, TensorView a,
                    TensorView b, TensorView c) = 0;
  // Makes the columns of the rows x cols matrix orthonormal (modified
  // Gram-Schmidt, eps added to each norm). A zero column stays zero rather
  // than becoming NaN.
  virtual void orthogonalize(TensorView mat, size_t rows, size_t cols, double eps) = 0;
  // y = a x + b y (with b = 0, y's old contents are ignored, even NaN).
  virtual void axpby(double a, TensorView x, double b, TensorView y) = 0;
  // Standard normal values, the same for the same seed on every rank.
  virtual void fill_normal(TensorView x, uint64_t seed) = 0;
};
LowRankMath& cpu_low_rank_math();
// Over cuBLAS, queued on the calling thread's current stream
// (collie::cuda_stream()); Error{unavailable} from each call in a build
// without cuBLAS, unless a test has installed a fake (cuda::set_blas_api).
LowRankMath& cuda_low_rank_math();
// The arithmetic for buffers on `d`.
LowRankMath& low_rank_math_for(const Device& d);

}  // namespace collie
