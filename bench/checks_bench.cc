// bench/checks_bench.cc: what the reducer's checks cost (reducer/README.md).
//
//   collie-run -n 2 checks_bench [--mb 32] [--iters 20] [--rounds 3]
//
// One gradient of `mb` MiB of f32 in one bucket, reduced by the reducer
// (prepare, mark ready, finalize: the default allreduce hook, the average),
// in both gradient modes, with no check, with the non-finite check, and with
// the replica check at every iteration (so that its cost per check shows;
// every N iterations costs 1/N of it); and one all-reduce of the same bytes
// alone. The configurations are interleaved round by round; each figure is
// the median of every timed iteration on rank 0, the ranks lined up by a
// barrier before each. "extra" is a configuration's time minus the same
// mode's without checks, as a share of the all-reduce alone.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "collie/comm.h"
#include "reducer/reducer.h"

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct Config {
  std::string name;
  bool view;
  int nonfinite;
  int64_t replicas;
};

}  // namespace

int main(int argc, char** argv) {
  size_t mb = 32;
  int iters = 20, rounds = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--mb")
      mb = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--iters")
      iters = std::atoi(argv[i + 1]);
    else if (a == "--rounds")
      rounds = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: checks_bench [--mb 32] [--iters 20] [--rounds 3]\n");
      return 2;
    }
  }
  try {
    auto comm = collie::connect();
    const size_t n = (mb << 20) / sizeof(float);
    std::vector<float> param(n), grad(n);
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-1, 1);
    for (auto& x : param) x = u(rng);
    const std::vector<Config> configs = {
        {"copy", false, 0, 0}, {"copy + nonfinite", false, 1, 0}, {"copy + replicas", false, 0, 1},
        {"view", true, 0, 0},  {"view + nonfinite", true, 1, 0},  {"view + replicas", true, 0, 1}};
    std::map<std::string, std::vector<double>> times;
    std::vector<float> alone(n);
    for (int round = 0; round < rounds; ++round) {
      for (const Config& c : configs) {
        collie::ReducerOptions opt;
        opt.gradient_as_bucket_view = c.view;
        opt.check_nonfinite = c.nonfinite;
        opt.check_replicas = c.replicas;
        opt.check_warns = 0;
        opt.first_bucket_bytes = opt.bucket_bytes = (mb << 20) + 4096;
        std::vector<collie::Parameter> ps{
            {collie::view_of(param.data(), n), collie::view_of(grad.data(), n), 0}};
        collie::Reducer red(*comm, ps, opt);
        for (int it = -2; it < iters; ++it) {  // two warm-up iterations
          float* g = static_cast<float*>(red.grad_view(0).data);
          for (size_t k = 0; k < n; k += 1024) g[k] = u(rng);  // some of it written each time
          comm->barrier();
          auto t0 = Clock::now();
          red.prepare_for_backward();
          red.mark_grad_ready(0);
          red.finalize_backward();
          if (it >= 0) times[c.name].push_back(ms_since(t0));
        }
      }
      for (int it = -2; it < iters; ++it) {
        comm->barrier();
        auto t0 = Clock::now();
        comm->allreduce(collie::view_of(alone.data(), n), collie::ReduceOp::avg).wait();
        if (it >= 0) times["allreduce alone"].push_back(ms_since(t0));
      }
    }
    if (comm->rank() == 0) {
      const double base = median(times["allreduce alone"]);
      std::printf("# %s, %d ranks, one %zu MiB f32 gradient, median of %d x %d iterations (ms)\n",
                  comm->backend().c_str(), comm->size(), mb, rounds, iters);
      std::printf("| configuration | ms | extra, share of the all-reduce alone |\n|---|---|---|\n");
      std::printf("| allreduce alone | %.3f | |\n", base);
      for (const Config& c : configs) {
        const double t = median(times[c.name]);
        const double plain = median(times[c.view ? "view" : "copy"]);
        if (c.nonfinite || c.replicas)
          std::printf("| %s | %.3f | %+.1f %% |\n", c.name.c_str(), t, 100 * (t - plain) / base);
        else
          std::printf("| %s | %.3f | |\n", c.name.c_str(), t);
      }
    }
  } catch (const collie::Error& e) {
    std::fprintf(stderr, "checks_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
