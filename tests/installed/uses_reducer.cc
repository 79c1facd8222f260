// tests/installed/uses_reducer.cc: a C++ engine built only against the
// installed headers and pkg-config file: the reducer with PowerSGD (or the
// plain all-reduce in a build without BLAS) and a model averager.
#include <cstdio>
#include <vector>

#include "collie/comm.h"
#include "hooks/model_averager.h"
#include "reducer/reducer.h"
int main(int argc, char** argv) {
  auto comm = collie::connect();
  std::vector<float> w(64 * 32, 0.0f), g(64 * 32, 1.0f);
  collie::ReducerOptions o;
  o.comm_hook = argc > 1 ? argv[1] : "allreduce";
  collie::Reducer red(
      *comm, {{collie::view_of(w.data(), w.size()), collie::view_of(g.data(), g.size()), 64}}, o);
  for (int s = 0; s < 3; ++s) {
    red.prepare_for_backward();
    red.mark_grad_ready(0);
    red.finalize_backward();
  }
  collie::PeriodicModelAverager avg(*comm, 1);
  avg.average_parameters({collie::view_of(w.data(), w.size())});
  // Every rank's gradient is all ones: the average is too, and so is any
  // rank-1 approximation of it.
  for (float x : g)
    if (x < 0.999f || x > 1.001f) {
      std::printf("rank %d: gradient %g, want 1\n", comm->rank(), x);
      return 1;
    }
  std::printf("rank %d: C++ reducer from the installed tree ok, hook %s\n", comm->rank(),
              red.comm_hook().name().c_str());
}
