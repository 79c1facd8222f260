// bench/bench_kernels.cc: Google Benchmark microbenchmarks of the reduction
// kernels the collectives are made of (bytes/s of output), to compare with
// the machine's memory bandwidth (bench/peers/ANCHORS.md: memcpy ~10 GB/s,
// c = a + b f32 ~8 GB/s on the reference VM).
#include <benchmark/benchmark.h>

#include <vector>

#include "base/nonfinite.h"
#include "base/reduce.h"
#include "hooks/powersgd.h"

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

// The same sums, out of place (out = a + b) or in place (a = a + b), the
// plain reduction against the one that searches both operands for NaN and
// Inf as it goes (kernels::reduce_searching, the reducer's check_nonfinite).
void BM_Sum(benchmark::State& state, collie::DType t, bool in_place, bool searching) {
  const size_t n = static_cast<size_t>(state.range(0));
  const size_t bytes = n * collie::dtype_size(t);
  std::vector<uint8_t> a(bytes, 0), b(bytes, 0), out(bytes);
  uint8_t* dst = in_place ? a.data() : out.data();
  collie::kernels::NonFiniteSeen seen;
  for (auto _ : state) {
    if (searching)
      collie::kernels::reduce_searching(t, collie::ReduceOp::sum, dst, a.data(), b.data(), n, 0,
                                        seen, 0, 0, 1);
    else
      collie::kernels::reduce(t, collie::ReduceOp::sum, dst, a.data(), b.data(), n);
    benchmark::DoNotOptimize(dst);
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

// PowerSGD's passes over a gradient viewed as rows x cols at rank r, in
// bytes of the gradient read per second: P = M Q (gemv at r = 1), Q = M^T P,
// and M = P Q^T (written). Each should run near memory bandwidth: the
// gradient is read or written once and the factors stay in cache.
void BM_PowerSgdPass(benchmark::State& state, int pass) {
  const size_t rows = static_cast<size_t>(state.range(0)),
               cols = static_cast<size_t>(state.range(1));
  const size_t r = static_cast<size_t>(state.range(2));
  std::vector<float> m(rows * cols, 0.25f), p(rows * r, 0.5f), q(cols * r, 0.5f);
  collie::LowRankMath& math = collie::cpu_low_rank_math();
  auto M = collie::view_of(m.data(), m.size()), P = collie::view_of(p.data(), p.size()),
       Q = collie::view_of(q.data(), q.size());
  for (auto _ : state) {
    if (pass == 0)
      math.gemm(false, false, rows, r, cols, M, Q, P);
    else if (pass == 1)
      math.gemm(true, false, cols, r, rows, M, P, Q);
    else
      math.gemm(false, true, rows, cols, r, P, Q, M);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * m.size() * sizeof(float)));
}

void BM_Orthogonalize(benchmark::State& state) {
  const size_t rows = static_cast<size_t>(state.range(0)), r = static_cast<size_t>(state.range(1));
  std::vector<float> p(rows * r);
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<float>((i * 7919) % 101) - 50;
  for (auto _ : state) {
    collie::cpu_low_rank_math().orthogonalize(collie::view_of(p.data(), p.size()), rows, r, 0);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * p.size()));
}

}  // namespace

BENCHMARK_CAPTURE(BM_PowerSgdPass, MQ, 0)
    ->Args({1024, 1024, 1})
    ->Args({3072, 768, 1})
    ->Args({30522, 768, 1})
    ->Args({3072, 768, 4});
BENCHMARK_CAPTURE(BM_PowerSgdPass, MtP, 1)
    ->Args({1024, 1024, 1})
    ->Args({3072, 768, 1})
    ->Args({30522, 768, 1})
    ->Args({3072, 768, 4});
BENCHMARK_CAPTURE(BM_PowerSgdPass, PQt, 2)
    ->Args({1024, 1024, 1})
    ->Args({3072, 768, 1})
    ->Args({30522, 768, 1})
    ->Args({3072, 768, 4});
BENCHMARK(BM_Orthogonalize)->Args({3072, 1})->Args({3072, 4})->Args({30522, 1});
BENCHMARK_CAPTURE(BM_Reduce, f32_sum, collie::DType::f32, collie::ReduceOp::sum)
    ->Range(1 << 12, 1 << 24);
BENCHMARK_CAPTURE(BM_Reduce, f64_sum, collie::DType::f64, collie::ReduceOp::sum)
    ->Range(1 << 12, 1 << 23);
BENCHMARK_CAPTURE(BM_Reduce, f16_sum, collie::DType::f16, collie::ReduceOp::sum)
    ->Range(1 << 12, 1 << 24);
BENCHMARK_CAPTURE(BM_Reduce, bf16_sum, collie::DType::bf16, collie::ReduceOp::sum)
    ->Range(1 << 12, 1 << 24);
BENCHMARK_CAPTURE(BM_Reduce, f32_max, collie::DType::f32, collie::ReduceOp::max)
    ->Range(1 << 12, 1 << 24);
BENCHMARK(BM_HalfRoundTrip)->Range(1 << 12, 1 << 20);
// 16 Ki elements (in L2) and 4 Mi (16 MiB of f32 a side: from memory).
BENCHMARK_CAPTURE(BM_Sum, f32_plain, collie::DType::f32, false, false)->Arg(1 << 14)->Arg(1 << 22);
BENCHMARK_CAPTURE(BM_Sum, f32_searching, collie::DType::f32, false, true)
    ->Arg(1 << 14)
    ->Arg(1 << 22);
BENCHMARK_CAPTURE(BM_Sum, f32_in_place_plain, collie::DType::f32, true, false)
    ->Arg(1 << 14)
    ->Arg(1 << 22);
BENCHMARK_CAPTURE(BM_Sum, f32_in_place_searching, collie::DType::f32, true, true)
    ->Arg(1 << 14)
    ->Arg(1 << 22);
BENCHMARK_CAPTURE(BM_Sum, bf16_plain, collie::DType::bf16, false, false)
    ->Arg(1 << 14)
    ->Arg(1 << 22);
BENCHMARK_CAPTURE(BM_Sum, bf16_searching, collie::DType::bf16, false, true)
    ->Arg(1 << 14)
    ->Arg(1 << 22);
BENCHMARK_CAPTURE(BM_Sum, bf16_in_place_plain, collie::DType::bf16, true, false)->Arg(1 << 22);
BENCHMARK_CAPTURE(BM_Sum, bf16_in_place_searching, collie::DType::bf16, true, true)->Arg(1 << 22);
BENCHMARK_CAPTURE(BM_Sum, f16_plain, collie::DType::f16, false, false)->Arg(1 << 14)->Arg(1 << 22);
BENCHMARK_CAPTURE(BM_Sum, f16_searching, collie::DType::f16, false, true)
    ->Arg(1 << 14)
    ->Arg(1 << 22);

BENCHMARK_MAIN();
