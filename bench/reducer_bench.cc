// bench/reducer_bench.cc: how much of the all-reduce the reducer hides
// behind backward.
//
//   collie-run -n 2 reducer_bench [--model resnet50|bert] [--compute-ms T]
//                                 [--work sleep|cpu] [--iters N] [--bucket-mb 25]
//                                 [--hook allreduce|fp16|bf16|...] [--modes view,copy]
//
// A synthetic backward with the gradient tensors of a real model (ResNet-50:
// 161 tensors, 25.6 M parameters; BERT-base: 199 tensors, 110 M), produced
// last layer first, each taking a share of T ms proportional to its size.
// That time is modelled two ways: `sleep` (the CPU is free, as when a GPU
// runs backward) or `cpu` (real arithmetic on this core). Per step, median
// over N steps:
//   compute      backward alone
//   allreduce    the reducer's buckets reduced with no backward at all
//   no-overlap   backward, then every bucket reduced
//   collie       backward with each gradient handed to the reducer as it is done
// overlap efficiency = (no-overlap - collie) / allreduce (1 = all hidden);
// exposed communication = how long finalize_backward waited (the slowest
// rank's), and collie - compute, which also counts what sharing the cores
// with the communication costs backward, each as a share of the all-reduce. Both
// gradient modes run: bucket views (the engine writes into the buckets) and
// copies (the engine owns its gradients; the reducer copies in and out).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "collie/comm.h"
#include "reducer/reducer.h"

namespace {

using Clock = std::chrono::steady_clock;

std::vector<size_t> resnet50() {
  std::vector<size_t> t{64 * 3 * 7 * 7, 64, 64};  // stem conv + batch norm
  int in = 64;
  const int blocks[4] = {3, 4, 6, 3}, widths[4] = {64, 128, 256, 512};
  for (int s = 0; s < 4; ++s)
    for (int b = 0; b < blocks[s]; ++b) {
      size_t w = static_cast<size_t>(widths[s]), out = 4 * w;
      for (size_t sz : {w * in, w, w, w * w * 9, w, w, out * w, out, out}) t.push_back(sz);
      if (b == 0)
        for (size_t sz : {out * in, out, out}) t.push_back(sz);  // downsample
      in = static_cast<int>(out);
    }
  t.push_back(1000 * 2048);
  t.push_back(1000);
  return t;
}

std::vector<size_t> bert_base() {
  const size_t h = 768, ff = 3072;
  std::vector<size_t> t{30522 * h, 512 * h, 2 * h, h, h};
  for (int l = 0; l < 12; ++l)
    for (size_t sz : {h * h, h, h * h, h, h * h, h, h * h, h, h, h, ff * h, ff, h * ff, h, h, h})
      t.push_back(sz);
  t.push_back(h * h);
  t.push_back(h);
  return t;
}

void spend(double us, bool cpu) {
  if (us <= 0) return;
  if (!cpu) {
    std::this_thread::sleep_for(std::chrono::duration<double, std::micro>(us));
    return;
  }
  auto until = Clock::now() + std::chrono::duration<double, std::micro>(us);
  volatile double sink = 1.0;
  while (Clock::now() < until)
    for (int i = 0; i < 256; ++i) sink = sink * 1.0000001 + 1e-9;
}

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string model = "resnet50", work = "sleep";
  double compute_ms = -1;
  int iters = 5;
  double bucket_mb = 25;
  std::string hook = "allreduce", modes = "view,copy";
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--model") model = argv[i + 1];
    else if (a == "--work") work = argv[i + 1];
    else if (a == "--compute-ms") compute_ms = std::atof(argv[i + 1]);
    else if (a == "--iters") iters = std::max(1, std::atoi(argv[i + 1]));
    else if (a == "--bucket-mb") bucket_mb = std::atof(argv[i + 1]);
    else if (a == "--hook") hook = argv[i + 1];
    else if (a == "--modes") modes = argv[i + 1];
    else {
      std::fprintf(stderr, "usage: reducer_bench [--model resnet50|bert] [--compute-ms T] "
                           "[--work sleep|cpu] [--iters N] [--bucket-mb MB] [--hook SPEC] [--modes view,copy]\n");
      return 2;
    }
  }
  std::vector<size_t> sizes = model == "bert" ? bert_base() : resnet50();
  if (compute_ms < 0) compute_ms = model == "bert" ? 400 : 120;
  const bool cpu = work == "cpu";
  size_t total = 0;
  for (size_t s : sizes) total += s;

  try {
    auto comm = collie::connect();
    const int rank = comm->rank();
    if (rank == 0) {
      // Bytes each rank sends per step: a ring all-reduce of S bytes sends
      // 2(n-1)/n S; the 16-bit compression hooks halve S.
      int n = comm->size();
      bool narrow = hook.rfind("fp16", 0) == 0 || hook.rfind("bf16", 0) == 0;
      double wire = hook == "noop" ? 0 : total * 4.0 * (narrow ? 0.5 : 1.0) * 2 * (n - 1) / n;
      std::printf("# reducer_bench: %s, %zu tensors, %.1f M parameters (%.0f MB f32), %d ranks, "
                  "backward %.0f ms of %s, hook %s (%.0f MB sent per rank per step, compression "
                  "%.1fx), median of %d steps\n",
                  model.c_str(), sizes.size(), total / 1e6, total * 4 / 1e6, n, compute_ms,
                  cpu ? "CPU work" : "free CPU (sleep)", hook.c_str(), wire / 1e6,
                  narrow ? 2.0 : 1.0, iters);
    }
    std::vector<std::vector<float>> values;
    for (size_t s : sizes) values.emplace_back(s, 0.5f);
    for (bool view : {true, false}) {
      if (modes.find(view ? "view" : "copy") == std::string::npos) continue;
      std::vector<std::vector<float>> grads;
      std::vector<collie::Parameter> params;
      for (size_t i = 0; i < sizes.size(); ++i) {
        if (!view) grads.emplace_back(sizes[i], 0.0f);
        params.push_back({collie::view_of(values[i].data(), sizes[i]),
                          view ? collie::TensorView{}
                               : collie::view_of(grads.back().data(), sizes[i])});
      }
      collie::ReducerOptions opt;
      opt.gradient_as_bucket_view = view;
      opt.broadcast_parameters = false;
      opt.bucket_bytes = static_cast<size_t>(bucket_mb * 1024 * 1024);
      opt.comm_hook = hook;
      collie::Reducer red(*comm, params, opt);
      size_t bucket_bytes = 0;
      for (const auto& b : red.plan().buckets()) bucket_bytes += b.nbytes();
      size_t engine_grad_bytes = view ? 0 : total * 4;

      // One step: backward over the tensors, last first. `mark` says when the
      // reducer hears of each gradient: as it is done, after all, or never.
      enum Mode { compute_only, comm_only, no_overlap, overlap };
      auto step = [&](Mode m) {
        comm->barrier().wait();
        auto t0 = Clock::now();
        if (m != compute_only) red.prepare_for_backward();
        std::vector<size_t> done;
        for (size_t k = sizes.size(); k-- > 0;) {
          if (m != comm_only) spend(compute_ms * 1e3 * sizes[k] / total, cpu);
          auto g = red.grad_view(k);
          std::fill_n(static_cast<float*>(g.data), sizes[k], 1.0f);
          if (m == overlap || m == comm_only) red.mark_grad_ready(k);
          else done.push_back(k);
        }
        if (m == no_overlap)
          for (size_t k : done) red.mark_grad_ready(k);
        if (m != compute_only) red.finalize_backward();
        double t = ms_since(t0);
        comm->allreduce(collie::view_of(&t, 1), collie::ReduceOp::max).wait();
        return t;
      };
      step(overlap);  // warm-up, and the first-iteration bucket rebuild
      std::vector<double> tc, ta, tn, to, waited;
      for (int i = 0; i < iters; ++i) {
        tc.push_back(step(compute_only));
        ta.push_back(step(comm_only));
        tn.push_back(step(no_overlap));
        to.push_back(step(overlap));
        double w = red.last_stats().exposed_us / 1e3;
        comm->allreduce(collie::view_of(&w, 1), collie::ReduceOp::max).wait();
        waited.push_back(w);
      }
      double c = median(tc), a = median(ta), n = median(tn), o = median(to), f = median(waited);
      if (rank == 0) {
        std::printf("%-12s buckets %3zu | compute %7.1f | allreduce %7.1f | no-overlap %7.1f | "
                    "collie %7.1f ms | overlap efficiency %5.2f | finalize waited %6.1f ms (%3.0f%% "
                    "of allreduce) | collie - compute %6.1f ms (%3.0f%%)\n",
                    view ? "bucket-view" : "copy", red.plan().buckets().size(), c, a, n, o,
                    (n - o) / a, f, 100.0 * f / a, o - c, 100.0 * (o - c) / a);
        std::printf("%-13s memory: buckets %.0f MB, engine gradients %.0f MB, extra beyond the "
                    "buckets %.0f MB\n",
                    "", bucket_bytes / 1e6, engine_grad_bytes / 1e6, engine_grad_bytes / 1e6);
      }
    }
  } catch (const collie::Error& e) {
    std::fprintf(stderr, "reducer_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
