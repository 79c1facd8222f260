// bench/reducer_bench.cc: how much of the all-reduce the reducer hides
// behind backward.
//
//   collie-run -n 2 reducer_bench [--model resnet50|bert] [--compute-ms T]
//                                 [--work sleep|cpu] [--iters N] [--bucket-mb 25]
//                                 [--hook SPEC]... [--modes view,copy] [--average-every K]
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
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "collie/comm.h"
#include "hooks/model_averager.h"
#include "reducer/reducer.h"

namespace {

using Clock = std::chrono::steady_clock;

// A tensor: its size and its first dimension (0 for vectors), which is how
// PowerSGD views it as a matrix (a conv weight [out, in, kh, kw] has out rows).
struct Tensor {
  size_t numel, rows;
};

std::vector<Tensor> resnet50() {
  std::vector<Tensor> t{{64 * 3 * 7 * 7, 64}, {64, 0}, {64, 0}};  // stem conv + batch norm
  size_t in = 64;
  const int blocks[4] = {3, 4, 6, 3}, widths[4] = {64, 128, 256, 512};
  for (int s = 0; s < 4; ++s)
    for (int b = 0; b < blocks[s]; ++b) {
      size_t w = static_cast<size_t>(widths[s]), out = 4 * w;
      for (Tensor x : {Tensor{w * in, w},
                       {w, 0},
                       {w, 0},
                       {w * w * 9, w},
                       {w, 0},
                       {w, 0},
                       {out * w, out},
                       {out, 0},
                       {out, 0}})
        t.push_back(x);
      if (b == 0)
        for (Tensor x : {Tensor{out * in, out}, {out, 0}, {out, 0}}) t.push_back(x);  // downsample
      in = out;
    }
  t.push_back({1000 * 2048, 1000});
  t.push_back({1000, 0});
  return t;
}

std::vector<Tensor> bert_base() {
  const size_t h = 768, ff = 3072;
  std::vector<Tensor> t{{30522 * h, 30522}, {512 * h, 512}, {2 * h, 2}, {h, 0}, {h, 0}};
  for (int l = 0; l < 12; ++l)
    for (Tensor x : {Tensor{h * h, h},
                     {h, 0},
                     {h * h, h},
                     {h, 0},
                     {h * h, h},
                     {h, 0},
                     {h * h, h},
                     {h, 0},
                     {h, 0},
                     {h, 0},
                     {ff * h, ff},
                     {ff, 0},
                     {h * ff, h},
                     {h, 0},
                     {h, 0},
                     {h, 0}})
      t.push_back(x);
  t.push_back({h * h, h});
  t.push_back({h, 0});
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

struct HookResult {
  std::string hook;
  double payload_mb = 0, ratio = 0, comm_ms = 0, step_ms = 0;
};

int main(int argc, char** argv) {
  std::string model = "resnet50", work = "sleep";
  double compute_ms = -1;
  int iters = 5;
  double bucket_mb = 25;
  std::vector<std::string> hooks;
  std::string modes = "view,copy";
  int average_every = 0;  // > 0: also time the model averaging of post-local SGD
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--model")
      model = argv[i + 1];
    else if (a == "--work")
      work = argv[i + 1];
    else if (a == "--compute-ms")
      compute_ms = std::atof(argv[i + 1]);
    else if (a == "--iters")
      iters = std::max(1, std::atoi(argv[i + 1]));
    else if (a == "--bucket-mb")
      bucket_mb = std::atof(argv[i + 1]);
    else if (a == "--hook")
      hooks.push_back(argv[i + 1]);
    else if (a == "--modes")
      modes = argv[i + 1];
    else if (a == "--average-every")
      average_every = std::max(0, std::atoi(argv[i + 1]));
    else {
      std::fprintf(stderr,
                   "usage: reducer_bench [--model resnet50|bert] [--compute-ms T] "
                   "[--work sleep|cpu] [--iters N] [--bucket-mb MB] [--hook SPEC]... "
                   "[--modes view,copy] [--average-every K]\n");
      return 2;
    }
  }
  if (hooks.empty()) hooks.push_back("allreduce");
  std::vector<Tensor> tensors = model == "bert" ? bert_base() : resnet50();
  std::vector<size_t> sizes;
  for (const Tensor& t : tensors) sizes.push_back(t.numel);
  if (compute_ms < 0) compute_ms = model == "bert" ? 400 : 120;
  const bool cpu = work == "cpu";
  size_t total = 0;
  for (size_t s : sizes) total += s;

  try {
    auto comm = collie::connect();
    const int rank = comm->rank(), nranks = comm->size();
    if (rank == 0)
      std::printf(
          "# reducer_bench: %s, %zu tensors, %.1f M parameters (%.0f MB f32), %d ranks, "
          "backward %.0f ms of %s, median of %d steps; times in ms\n",
          model.c_str(), sizes.size(), total / 1e6, total * 4 / 1e6, nranks, compute_ms,
          cpu ? "CPU work" : "free CPU (sleep)", iters);
    std::vector<std::vector<float>> values;
    for (size_t s : sizes) values.emplace_back(s, 0.5f);
    std::vector<float> pattern(*std::max_element(sizes.begin(), sizes.end()) + 1024);
    {
      std::mt19937 g(42);
      std::uniform_real_distribution<float> u(-0.5f, 0.5f);
      for (auto& x : pattern) x = u(g);
    }
    std::vector<HookResult> results;
    for (const std::string& hook : hooks) {
      if (rank == 0) std::printf("## hook %s\n", hook.c_str());
      for (bool view : {true, false}) {
        if (modes.find(view ? "view" : "copy") == std::string::npos) continue;
        std::vector<std::vector<float>> grads;
        std::vector<collie::Parameter> params;
        for (size_t i = 0; i < sizes.size(); ++i) {
          if (!view) grads.emplace_back(sizes[i], 0.0f);
          params.push_back(
              {collie::view_of(values[i].data(), sizes[i]),
               view ? collie::TensorView{} : collie::view_of(grads.back().data(), sizes[i]),
               tensors[i].rows});
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
        // Gradients are copied from a fixed random pattern (at a shifting
        // offset): as cheap as a fill, yet full rank, so that compressing
        // hooks see realistic values.
        enum Mode { compute_only, comm_only, no_overlap, overlap };
        uint32_t salt = 1;
        auto step = [&](Mode m) {
          comm->barrier().wait();
          auto t0 = Clock::now();
          if (m != compute_only) red.prepare_for_backward();
          std::vector<size_t> done;
          ++salt;
          for (size_t k = sizes.size(); k-- > 0;) {
            if (m != comm_only) spend(compute_ms * 1e3 * sizes[k] / total, cpu);
            auto g = red.grad_view(k);
            std::memcpy(g.data, pattern.data() + (salt * 97 + k) % 1024, sizes[k] * sizeof(float));
            if (m == overlap || m == comm_only)
              red.mark_grad_ready(k);
            else
              done.push_back(k);
          }
          if (m == no_overlap)
            for (size_t k : done) red.mark_grad_ready(k);
          if (m != compute_only) red.finalize_backward();
          double t = ms_since(t0);
          comm->allreduce(collie::view_of(&t, 1), collie::ReduceOp::max).wait();
          return t;
        };
        // Warm-up: the first-iteration bucket rebuild, and past a hook's
        // start_iter when it is 2 or less.
        step(overlap);
        step(overlap);
        std::vector<double> tc, ta, tn, to, waited;
        uint64_t hook_bytes = 0, gradient_bytes = 0;
        for (int i = 0; i < iters; ++i) {
          tc.push_back(step(compute_only));
          ta.push_back(step(comm_only));
          tn.push_back(step(no_overlap));
          to.push_back(step(overlap));
          double w = red.last_stats().exposed_us / 1e3;
          hook_bytes = red.last_stats().hook_bytes;
          gradient_bytes = red.last_stats().gradient_bytes;
          comm->allreduce(collie::view_of(&w, 1), collie::ReduceOp::max).wait();
          waited.push_back(w);
        }
        // The floor for exposed communication: the last bucket holds the
        // gradient backward produces last, so nothing is left to hide its
        // all-reduce behind. Timed alone, plain all-reduce.
        std::vector<float> last(red.plan().buckets().back().numel);
        std::vector<double> tl;
        for (int i = 0; i < 3; ++i) {
          comm->barrier().wait();
          auto t0 = Clock::now();
          comm->allreduce(collie::view_of(last.data(), last.size()), collie::ReduceOp::avg).wait();
          double t = ms_since(t0);
          comm->allreduce(collie::view_of(&t, 1), collie::ReduceOp::max).wait();
          tl.push_back(t);
        }
        double floor_ms = median(tl);
        double c = median(tc), a = median(ta), n = median(tn), o = median(to), f = median(waited);
        if (rank == 0) {
          std::printf(
              "%-12s buckets %3zu | compute %7.1f | allreduce %7.1f | no-overlap %7.1f | "
              "collie %7.1f | overlap efficiency %5.2f | finalize waited %6.1f (%3.0f%% "
              "of allreduce) | collie - compute %6.1f (%3.0f%%)\n",
              view ? "bucket-view" : "copy", red.plan().buckets().size(), c, a, n, o, (n - o) / a,
              f, 100.0 * f / a, o - c, 100.0 * (o - c) / a);
          std::printf(
              "%-13s last bucket (%.0f MB) all-reduced alone: %.1f ms = %.0f%% of allreduce, "
              "the floor for finalize's wait\n",
              "", last.size() * 4 / 1e6, floor_ms, 100.0 * floor_ms / a);
          std::printf(
              "%-13s memory: buckets %.0f MB, engine gradients %.0f MB, extra beyond the "
              "buckets %.0f MB\n",
              "", bucket_bytes / 1e6, engine_grad_bytes / 1e6, engine_grad_bytes / 1e6);
        }
        if (view || modes.find("view") == std::string::npos) {
          HookResult r;
          r.hook = hook;
          r.payload_mb = hook_bytes / 1e6;
          r.ratio = hook_bytes ? static_cast<double>(gradient_bytes) / hook_bytes : 0;
          r.comm_ms = a;
          r.step_ms = o;
          results.push_back(r);
        }
      }
    }
    double average_ms = 0;
    if (average_every > 0) {
      collie::PeriodicModelAverager avg(*comm, 1);
      std::vector<collie::TensorView> views;
      for (auto& v : values) views.push_back(collie::view_of(v.data(), v.size()));
      std::vector<double> ts;
      for (int i = 0; i < 3; ++i) {
        comm->barrier().wait();
        auto t0 = Clock::now();
        avg.average_parameters(views);
        double t = ms_since(t0);
        comm->allreduce(collie::view_of(&t, 1), collie::ReduceOp::max).wait();
        ts.push_back(t);
      }
      average_ms = median(ts);
    }
    if (rank == 0 && !results.empty()) {
      // Bytes each rank hands to all-reduces per step (what the hook counts),
      // and what a ring then sends: 2(n-1)/n of it.
      std::printf(
          "\n# per hook (%s gradients): bytes per rank per step, compression, and time "
          "against the first hook\n",
          modes.find("view") != std::string::npos ? "bucket-view" : "copy");
      std::printf("# %-36s %12s %12s %8s %12s %10s %12s %10s\n", "hook", "payload MB",
                  "ring wire MB", "ratio", "comm-only ms", "vs first", "step ms", "vs first");
      for (const HookResult& r : results)
        std::printf("  %-36s %12.2f %12.2f %7.1f%s %12.1f %9.2fx %12.1f %9.2fx\n", r.hook.c_str(),
                    r.payload_mb, r.payload_mb * 2 * (nranks - 1) / nranks, r.ratio,
                    r.ratio > 0 ? "x" : " (local)", r.comm_ms, r.comm_ms / results[0].comm_ms,
                    r.step_ms, r.step_ms / results[0].step_ms);
      if (average_every > 0) {
        std::printf(
            "# model averaging (post-local SGD): average_parameters over %.0f MB took %.1f ms; "
            "every %d steps that adds %.1f ms per step\n",
            total * 4 / 1e6, average_ms, average_every, average_ms / average_every);
        for (const HookResult& r : results)
          if (r.hook.rfind("post_local_sgd", 0) == 0)
            std::printf("  %-36s step with averaging %.1f ms, %.2fx the first hook's\n",
                        r.hook.c_str(), r.step_ms + average_ms / average_every,
                        (r.step_ms + average_ms / average_every) / results[0].step_ms);
      }
    }
  } catch (const collie::Error& e) {
    std::fprintf(stderr, "reducer_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
