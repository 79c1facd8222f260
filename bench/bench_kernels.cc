// bench/bench_kernels.cc: Google Benchmark microbenchmarks of the reduction
// kernels the collectives are made of (bytes/s of output), to compare with
// the machine's memory bandwidth (../shared/anchors: memcpy ~10 GB/s,
// c = a + b f32 ~8 GB/s on the reference VM).
#include <benchmark/benchmark.h>

#include <vector>

#include "comm/core/reduce.h"

namespace {

void BM_Reduce(benchmark::State& state, collie::DType t, collie::ReduceOp op) {
  const size_t n = static_cast<size_t>(state.range(0));
  const size_t bytes = n * collie::dtype_size(t);
  std::vector<uint8_t> a(bytes, 0), b(bytes, 0), out(bytes);
  for (auto _ : state) {
    collie::kernels::reduce(t, op, out.data(), a.data(), b.data(), n);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}

void BM_HalfRoundTrip(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  std::vector<float> f(n, 1.2345f);
  std::vector<uint16_t> h(n);
  for (auto _ : state) {
    for (size_t i = 0; i < n; ++i) h[i] = collie::kernels::float_to_half(f[i]);
    for (size_t i = 0; i < n; ++i) f[i] = collie::kernels::half_to_float(h[i]);
    benchmark::DoNotOptimize(f.data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * n));
}

}  // namespace

BENCHMARK_CAPTURE(BM_Reduce, f32_sum, collie::DType::f32, collie::ReduceOp::sum)->Range(1 << 12, 1 << 24);
BENCHMARK_CAPTURE(BM_Reduce, f64_sum, collie::DType::f64, collie::ReduceOp::sum)->Range(1 << 12, 1 << 23);
BENCHMARK_CAPTURE(BM_Reduce, f16_sum, collie::DType::f16, collie::ReduceOp::sum)->Range(1 << 12, 1 << 24);
BENCHMARK_CAPTURE(BM_Reduce, bf16_sum, collie::DType::bf16, collie::ReduceOp::sum)->Range(1 << 12, 1 << 24);
BENCHMARK_CAPTURE(BM_Reduce, f32_max, collie::DType::f32, collie::ReduceOp::max)->Range(1 << 12, 1 << 24);
BENCHMARK(BM_HalfRoundTrip)->Range(1 << 12, 1 << 20);

BENCHMARK_MAIN();
