// bench/latency_windows.cc: the time of every single small all-reduce, for
// looking at how latency is distributed rather than at its mean: per-window
// medians (do whole stretches of a run switch between modes?) and
// percentiles.
//
//   collie-run -n 2 latency_windows [iterations=5000] [bytes=4] [window=500]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "collie/comm.h"

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 5000;
  const size_t count = std::max<size_t>(1, (argc > 2 ? std::atol(argv[2]) : 4) / sizeof(float));
  const int window = argc > 3 ? std::atoi(argv[3]) : 500;
  if (iters < 1 || window < 1) {
    std::fprintf(stderr, "usage: latency_windows [iterations >= 1] [bytes] [window >= 1]\n");
    return 2;
  }
  try {
    auto c = collie::connect();
    std::vector<float> x(count, 1.0f);
    auto view = collie::view_of(x.data(), count);
    for (int w = 0; w < 200; ++w) c->allreduce(view, collie::ReduceOp::sum).wait();
    std::vector<double> t(static_cast<size_t>(iters));
    for (auto& us : t) {
      auto t0 = std::chrono::steady_clock::now();
      c->allreduce(view, collie::ReduceOp::sum).wait();
      us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    }
    if (c->rank() != 0) return 0;
    std::printf("# %d all-reduces of %zu B on %d ranks (%s); us\n", iters, count * sizeof(float),
                c->size(), c->backend().c_str());
    std::printf("window medians:");
    for (size_t s = 0; s + window <= t.size(); s += window) {
      std::vector<double> w(t.begin() + s, t.begin() + s + window);
      std::nth_element(w.begin(), w.begin() + window / 2, w.end());
      std::printf(" %.1f", w[window / 2]);
    }
    std::sort(t.begin(), t.end());
    auto pct = [&](double p) {
      return t[std::min(t.size() - 1, static_cast<size_t>(p * t.size()))];
    };
    std::printf("\np10 %.1f  p50 %.1f  p90 %.1f  p99 %.1f  max %.1f\n", pct(0.1), pct(0.5),
                pct(0.9), pct(0.99), t.back());
  } catch (const collie::Error& e) {
    std::fprintf(stderr, "latency_windows: %s\n", e.what());
    return 1;
  }
  return 0;
}
