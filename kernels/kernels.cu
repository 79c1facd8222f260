// kernels/kernels.cu: the CUDA kernels (see kernels.h). Only cuda_fp16.h
// and cuda_bf16.h are included: heavy headers (thrust, cub, nccl.h) would
// multiply this file's compile time.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "collie/error.h"
#include "kernels/kernels.h"

namespace collie::gpu {

namespace {

constexpr int kThreads = 256;
constexpr unsigned kMaxBlocks = 4096;  // grid-stride beyond this

void check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess)
    throw Error(ErrorCode::internal, std::string(what) + " failed: " + cudaGetErrorString(rc));
}

unsigned blocks_for(size_t items) {
  size_t b = (items + kThreads - 1) / kThreads;
  if (b == 0) b = 1;
  return static_cast<unsigned>(b < kMaxBlocks ? b : kMaxBlocks);
}

// Loads and stores as the element types.
template <class T>
struct Elem;
template <>
struct Elem<float> {
  using Acc = float;
  __device__ static float load(float x) { return x; }
  __device__ static float store(float x) { return x; }
  __device__ static float store(double x) { return static_cast<float>(x); }
};
template <>
struct Elem<double> {
  using Acc = double;
  __device__ static double load(double x) { return x; }
  __device__ static double store(float x) { return x; }
  __device__ static double store(double x) { return x; }
};
template <>
struct Elem<__half> {
  using Acc = float;
  __device__ static float load(__half x) { return __half2float(x); }
  __device__ static __half store(float x) { return __float2half_rn(x); }
  __device__ static __half store(double x) { return __float2half_rn(static_cast<float>(x)); }
};
template <>
struct Elem<__nv_bfloat16> {
  using Acc = float;
  __device__ static float load(__nv_bfloat16 x) { return __bfloat162float(x); }
  __device__ static __nv_bfloat16 store(float x) { return __float2bfloat16_rn(x); }
  __device__ static __nv_bfloat16 store(double x) {
    return __float2bfloat16_rn(static_cast<float>(x));
  }
};

// f32 unless either side is f64, as the CPU twin computes.
template <class S, class D>
using Acc = std::conditional_t<std::is_same_v<S, double> || std::is_same_v<D, double>, double,
                               float>;

// Eight elements per step, moved as 16-byte words: 8 x 4 bytes is two
// loads, 8 x 2 bytes one. Needs both pointers 16-byte aligned.
template <class S, class D>
__global__ void convert8(const S* __restrict__ src, D* __restrict__ dst, size_t groups,
                         int divisor) {
  constexpr int kIn = 8 * sizeof(S) / 16, kOut = 8 * sizeof(D) / 16;
  const Acc<S, D> div = static_cast<Acc<S, D>>(divisor);
  for (size_t g = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; g < groups;
       g += static_cast<size_t>(gridDim.x) * blockDim.x) {
    union {
      uint4 w[kIn];
      S e[8];
    } in;
    union {
      uint4 w[kOut];
      D e[8];
    } out;
    const uint4* s4 = reinterpret_cast<const uint4*>(src) + g * kIn;
#pragma unroll
    for (int k = 0; k < kIn; ++k) in.w[k] = s4[k];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      Acc<S, D> v = static_cast<Acc<S, D>>(Elem<S>::load(in.e[j]));
      out.e[j] = Elem<D>::store(v / div);
    }
    uint4* d4 = reinterpret_cast<uint4*>(dst) + g * kOut;
#pragma unroll
    for (int k = 0; k < kOut; ++k) d4[k] = out.w[k];
  }
}

// One element at a time: unaligned buffers and the tail.
template <class S, class D>
__global__ void convert1(const S* __restrict__ src, D* __restrict__ dst, size_t n, int divisor) {
  const Acc<S, D> div = static_cast<Acc<S, D>>(divisor);
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    dst[i] = Elem<D>::store(static_cast<Acc<S, D>>(Elem<S>::load(src[i])) / div);
}

template <class S, class D>
void launch_convert(const void* src, void* dst, size_t n, int divisor, cudaStream_t s) {
  const S* sp = static_cast<const S*>(src);
  D* dp = static_cast<D*>(dst);
  size_t head = 0;
  if ((reinterpret_cast<uintptr_t>(sp) | reinterpret_cast<uintptr_t>(dp)) % 16 == 0) {
    const size_t groups = n / 8;
    head = groups * 8;
    if (groups) convert8<S, D><<<blocks_for(groups), kThreads, 0, s>>>(sp, dp, groups, divisor);
  }
  if (n > head)
    convert1<S, D><<<blocks_for(n - head), kThreads, 0, s>>>(sp + head, dp + head, n - head,
                                                              divisor);
  check(cudaGetLastError(), "the convert kernel's launch");
}

template <class S>
void convert_from(DType dt, const void* src, void* dst, size_t n, int divisor, cudaStream_t s) {
  switch (dt) {
    case DType::f32: return launch_convert<S, float>(src, dst, n, divisor, s);
    case DType::f64: return launch_convert<S, double>(src, dst, n, divisor, s);
    case DType::f16: return launch_convert<S, __half>(src, dst, n, divisor, s);
    case DType::bf16: return launch_convert<S, __nv_bfloat16>(src, dst, n, divisor, s);
    default: throw Error(ErrorCode::invalid_argument, "gpu::convert: a non-float destination");
  }
}

// One block per copy at a time; 16-byte words where the copy allows.
__global__ void copy_all_kernel(const Copy* copies, size_t n) {
  for (size_t c = blockIdx.x; c < n; c += gridDim.x) {
    const Copy cp = copies[c];
    const auto* s = static_cast<const unsigned char*>(cp.src);
    auto* d = static_cast<unsigned char*>(cp.dst);
    size_t done = 0;
    if ((reinterpret_cast<uintptr_t>(s) | reinterpret_cast<uintptr_t>(d)) % 16 == 0) {
      const size_t words = cp.bytes / 16;
      const uint4* s4 = reinterpret_cast<const uint4*>(s);
      uint4* d4 = reinterpret_cast<uint4*>(d);
      for (size_t i = threadIdx.x; i < words; i += blockDim.x) d4[i] = s4[i];
      done = words * 16;
    }
    for (size_t i = done + threadIdx.x; i < cp.bytes; i += blockDim.x) d[i] = s[i];
  }
}

}  // namespace

bool built() {
  return true;
}

void convert(DType st, const void* src, DType dt, void* dst, size_t n, int divisor,
             void* stream) {
  if (n == 0) return;
  if (divisor < 1) throw Error(ErrorCode::invalid_argument, "gpu::convert: divisor < 1");
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (st) {
    case DType::f32: return convert_from<float>(dt, src, dst, n, divisor, s);
    case DType::f64: return convert_from<double>(dt, src, dst, n, divisor, s);
    case DType::f16: return convert_from<__half>(dt, src, dst, n, divisor, s);
    case DType::bf16: return convert_from<__nv_bfloat16>(dt, src, dst, n, divisor, s);
    default: throw Error(ErrorCode::invalid_argument, "gpu::convert: a non-float source");
  }
}

void copy_all(const Copy* copies, size_t n, void* stream) {
  if (n == 0) return;
  const unsigned blocks = static_cast<unsigned>(n < kMaxBlocks ? n : kMaxBlocks);
  copy_all_kernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(copies, n);
  check(cudaGetLastError(), "the copy_all kernel's launch");
}

}  // namespace collie::gpu
