// examples/train_libtorch.cc: a torch::nn model trained from C++ (libtorch)
// with collie's reducer doing the data parallelism.
//
//   collie-run -n 2 build/examples/train_libtorch [--steps N] [--check]
//
// What an engine adds to its training loop, with libtorch as the engine:
// the parameters handed to collie::Reducer (which broadcasts rank 0's), a
// post-hook on each parameter's gradient accumulator that marks the gradient
// ready as soon as backward has accumulated it (so buckets go out while
// backward still runs), and prepare/finalize around backward. Each rank
// trains on its own data; with --check every rank also trains the same model
// serially in float64 on every rank's data and fails unless the two agree.
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "collie/comm.h"
#include "reducer/reducer.h"

namespace {

constexpr double kLr = 0.05;

torch::nn::Sequential make_model(torch::Dtype dtype) {
  torch::manual_seed(0);
  torch::nn::Sequential m(torch::nn::Linear(8, 32), torch::nn::Tanh(), torch::nn::Linear(32, 4));
  m->to(dtype);
  return m;
}

// Rank r's batch at step s: the same on every rank that asks, so the serial
// check can compute every rank's gradient.
std::pair<torch::Tensor, torch::Tensor> batch(int step, int rank) {
  auto gen = at::detail::createCPUGenerator(1000 * step + rank);
  auto x = at::randn({16, 8}, gen);
  auto y = at::sin(x.narrow(1, 0, 4)) + 0.1 * at::randn({16, 4}, gen);
  return {x, y};
}

// Runs after backward has accumulated a parameter's gradient: hands it to
// collie where it is now (PyTorch may have replaced the grad tensor).
struct MarkReady final : torch::autograd::FunctionPostHook {
  MarkReady(collie::Reducer& r, size_t i, torch::Tensor p) : reducer(r), index(i), param(p) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    torch::Tensor g = param.grad();
    reducer.mark_grad_ready(index, collie::view_of(g.data_ptr<float>(), size_t(g.numel())));
    return outputs;
  }
  collie::Reducer& reducer;
  size_t index;
  torch::Tensor param;
};

}  // namespace

int main(int argc, char** argv) {
  int steps = 30;
  bool check = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--steps") && i + 1 < argc)
      steps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--check"))
      check = true;
    else {
      std::fprintf(stderr, "usage: %s [--steps N] [--check]\n", argv[0]);
      return 2;
    }
  }
  torch::set_num_threads(1);
  auto comm = collie::connect();
  const int rank = comm->rank(), world = comm->size();

  auto model = make_model(torch::kFloat32);
  std::vector<torch::Tensor> params = model->parameters();
  std::vector<collie::Parameter> ps;
  for (auto& p : params)
    ps.push_back({collie::view_of(p.data_ptr<float>(), size_t(p.numel())),
                  {},
                  p.dim() >= 2 ? size_t(p.size(0)) : 0});
  collie::Reducer reducer(*comm, ps);  // COLLIE_COMM_HOOK picks a hook, if set

  // The accumulators are held by us: a variable keeps only a weak reference.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;
  for (size_t i = 0; i < params.size(); ++i) {
    accumulators.push_back(torch::autograd::impl::grad_accumulator(params[i]));
    accumulators.back()->add_post_hook(std::make_unique<MarkReady>(reducer, i, params[i]));
  }

  torch::optim::SGD opt(params, torch::optim::SGDOptions(kLr));
  for (int step = 0; step < steps; ++step) {
    auto [x, y] = batch(step, rank);
    opt.zero_grad();
    reducer.prepare_for_backward();
    auto loss = torch::mse_loss(model->forward(x), y);
    loss.backward();
    reducer.finalize_backward();  // every gradient is now the average over ranks
    opt.step();
    if (rank == 0 && (step % 10 == 0 || step == steps - 1))
      std::printf("step %d: loss %.4f (rank 0's batch)\n", step, loss.item<float>());
  }

  if (!check) return 0;
  // The same training, serially in float64 on the mean of every rank's gradient.
  auto ref = make_model(torch::kFloat64);
  auto rparams = ref->parameters();
  for (int step = 0; step < steps; ++step) {
    std::vector<torch::Tensor> mean;
    for (auto& p : rparams) mean.push_back(torch::zeros_like(p));
    for (int r = 0; r < world; ++r) {
      auto [x, y] = batch(step, r);
      for (auto& p : rparams) p.mutable_grad() = torch::Tensor();
      torch::mse_loss(ref->forward(x.to(torch::kFloat64)), y.to(torch::kFloat64)).backward();
      for (size_t i = 0; i < rparams.size(); ++i) mean[i] += rparams[i].grad() / world;
    }
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < rparams.size(); ++i) rparams[i] -= kLr * mean[i];
  }
  double worst = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    double err =
        (params[i].detach().to(torch::kFloat64) - rparams[i].detach()).abs().max().item<double>();
    double scale = rparams[i].abs().max().item<double>() + 1e-12;
    worst = std::max(worst, err / scale);
  }
  std::printf(
      "rank %d of %d: %d steps, largest difference from the serial float64 training %.2g "
      "(relative)\n",
      rank, world, steps, worst);
  if (worst > 1e-5) {
    std::fprintf(stderr, "rank %d: differs from the serial float64 reference by %.3g\n", rank,
                 worst);
    return 1;
  }
  return 0;
}
