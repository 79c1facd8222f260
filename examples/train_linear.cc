// examples/train_linear.cc: data-parallel training in its plainest form.
//
// Each rank holds its own shard of a synthetic regression problem
// (y = x . w_true + noise), computes the gradient of the mean squared error
// on its shard, and averages it across ranks with one all-reduce before the
// SGD step: every rank then applies the same update and the replicas stay
// identical. Run: collie-run -n 2 train_linear [steps]
//
// The DDP reducer (reducer/) automates exactly this, bucket by bucket,
// overlapped with backward; this example keeps it to one call to show the
// communicator alone.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "collie/comm.h"

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 60;
  constexpr int kDim = 64, kSamplesPerRank = 512;
  try {
    auto comm = collie::connect();
    const int rank = comm->rank(), n = comm->size();

    std::mt19937 truth_rng(1234);  // the same on every rank
    std::normal_distribution<double> gauss(0.0, 1.0);
    std::vector<double> w_true(kDim);
    for (auto& v : w_true) v = gauss(truth_rng);

    std::mt19937 data_rng(99 + rank);  // this rank's shard
    std::vector<double> x(kSamplesPerRank * kDim), y(kSamplesPerRank);
    for (int s = 0; s < kSamplesPerRank; ++s) {
      double dot = 0;
      for (int d = 0; d < kDim; ++d) {
        x[s * kDim + d] = gauss(data_rng);
        dot += x[s * kDim + d] * w_true[d];
      }
      y[s] = dot + 0.01 * gauss(data_rng);
    }

    std::vector<double> w(kDim, 0.0), grad(kDim);
    std::mt19937 init_rng(rank);  // deliberately different: broadcast fixes it
    for (auto& v : w) v = gauss(init_rng);
    comm->broadcast(collie::view_of(w.data(), kDim), 0).wait();

    const double lr = 0.1;
    if (rank == 0)
      std::printf("training a %d-weight linear model on %d ranks x %d samples\n", kDim, n,
                  kSamplesPerRank);
    for (int step = 0; step <= steps; ++step) {
      std::fill(grad.begin(), grad.end(), 0.0);
      double loss = 0;
      for (int s = 0; s < kSamplesPerRank; ++s) {
        double err = -y[s];
        for (int d = 0; d < kDim; ++d) err += x[s * kDim + d] * w[d];
        loss += err * err / kSamplesPerRank;
        for (int d = 0; d < kDim; ++d) grad[d] += 2 * err * x[s * kDim + d] / kSamplesPerRank;
      }
      // Average gradients and loss over ranks: the whole of data parallelism.
      comm->allreduce(collie::view_of(grad.data(), kDim), collie::ReduceOp::avg).wait();
      comm->allreduce(collie::view_of(&loss, 1), collie::ReduceOp::avg).wait();
      for (int d = 0; d < kDim; ++d) w[d] -= lr * grad[d];
      if (rank == 0 && step % 10 == 0) std::printf("step %3d  loss %.6f\n", step, loss);
    }
    // The replicas must be identical: compare every rank's weights with rank 0's.
    std::vector<double> w0 = w;
    comm->broadcast(collie::view_of(w0.data(), kDim), 0).wait();
    int64_t differs = w0 != w;
    comm->allreduce(collie::view_of(&differs, 1), collie::ReduceOp::sum).wait();
    if (rank == 0)
      std::printf("replicas identical on all %d ranks: %s\n", n, differs == 0 ? "yes" : "NO");
    return differs == 0 ? 0 : 1;
  } catch (const collie::Error& e) {
    std::fprintf(stderr, "train_linear: %s\n", e.what());
    return 1;
  }
}
