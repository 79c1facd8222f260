// tests/test_hooks.cc: comm hooks through the reducer, over real processes
// (run under collie-run). Compression stays within the narrow format's
// rounding bound of the exact average; training converges under every hook
// to within 10% of plain all-reduce's loss; the registry names what it
// accepts; a user's own hook plugs in by name.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "collie/comm.h"
#include "hooks/comm_hook.h"
#include "hooks/model_averager.h"
#include "mp_common.h"
#include "mp_test.h"
#include "reducer/reducer.h"
#include "tiny_mlp.h"

namespace collie {
namespace {

Communicator& comm() {
  return testing::world();
}

using testing::error_of;

TEST(HookRegistry, UnknownNamesAndParametersListWhatIsAccepted) {
  std::string m = error_of([] { make_comm_hook("fp8"); });
  EXPECT_NE(m.find("unknown hook 'fp8'"), std::string::npos) << m;
  EXPECT_NE(m.find("allreduce"), std::string::npos) << m;
  EXPECT_NE(m.find("bf16_wrap:<hook>"), std::string::npos) << m;
  m = error_of([] { make_comm_hook("fp16:rank=2"); });
  EXPECT_NE(m.find("no parameter 'rank'"), std::string::npos) << m;
  m = error_of([] { make_comm_hook("fp16_wrap"); });
  EXPECT_NE(m.find("fp16_wrap:allreduce"), std::string::npos) << m;
  m = error_of([] { make_comm_hook("bf16_wrap:nonsense"); });
  EXPECT_NE(m.find("unknown hook 'nonsense'"), std::string::npos) << m;
  EXPECT_EQ(make_comm_hook("bf16_wrap:fp16_wrap:allreduce")->name(),
            "bf16_wrap:fp16_wrap:allreduce");
  m = error_of([] { make_comm_hook("noop")->load_state({1, 2, 3}); });
  EXPECT_NE(m.find("no state"), std::string::npos) << m;
}

// Every rank contributes random gradients; the reducer with `spec` must
// return the float64 average within `bound_units` roundings of the narrow
// format (relative to the mean magnitude), on every rank.
void check_accuracy(const std::string& spec, double unit, double bound_units) {
  const int n = comm().size(), r = comm().rank();
  const size_t count = 30011;
  std::vector<std::vector<double>> all;
  for (int q = 0; q < n; ++q) all.push_back(testing::random_values(q, count, 99));
  std::vector<float> value(count), grad(count);
  ReducerOptions opt;
  opt.comm_hook = spec;
  opt.bucket_bytes = 40000;  // several buckets
  opt.first_bucket_bytes = 4000;
  Reducer red(comm(), {{view_of(value.data(), count), view_of(grad.data(), count)}}, opt);
  EXPECT_EQ(red.comm_hook().name(), spec);
  for (size_t i = 0; i < count; ++i) grad[i] = static_cast<float>(all[r][i]);
  red.prepare_for_backward();
  red.mark_grad_ready(0);
  red.finalize_backward();
  double worst = 0;
  for (size_t i = 0; i < count; ++i) {
    double want = 0, mag = 0;
    for (int q = 0; q < n; ++q) {
      want += static_cast<float>(all[q][i]);
      mag += std::abs(all[q][i]);
    }
    want /= n;
    mag /= n;
    worst = std::max(worst, std::abs(grad[i] - want) / (bound_units * unit * mag + 1e-30));
  }
  EXPECT_LE(worst, 1.0) << spec;
  // 16-bit all-reduces: half the gradient's bytes, wrapped or not.
  EXPECT_EQ(red.last_stats().gradient_bytes, count * sizeof(float)) << spec;
  EXPECT_EQ(red.last_stats().hook_bytes, count * 2) << spec;
}

TEST(CompressionHooks, WithinTheNarrowFormatsRoundingOfTheExactAverage) {
  const int n = comm().size();
  // Compressing rounds once, each of the n-1 ring steps once, the final
  // division (wrappers) once: n + 1 roundings in all.
  const double f16 = std::ldexp(1.0, -11), bf16 = std::ldexp(1.0, -8);
  check_accuracy("fp16", f16, n + 1);
  check_accuracy("bf16", bf16, n + 1);
  check_accuracy("fp16_wrap:allreduce", f16, n + 1);
  check_accuracy("bf16_wrap:allreduce", bf16, n + 1);
}

// Trains the tiny MLP for a fixed number of steps under `spec`; returns the
// final full-batch loss (the same on every rank).
double train(const std::string& spec, uint64_t average_every = 0, uint64_t average_after = 0) {
  using testing::MlpShape;
  const int n = comm().size(), r = comm().rank();
  constexpr int kSamples = 48, kSteps = 80;
  auto params = testing::init_params<float>(7);
  auto data = testing::make_dataset(kSamples, 11);
  std::vector<Parameter> ps;
  // W1 (H x D) and W2 (O x H) are matrices: PowerSGD may compress them.
  const size_t rows[] = {MlpShape::H, 0, MlpShape::O, 0, 0};
  for (size_t i = 0; i < params.size(); ++i)
    ps.push_back({view_of(params[i].data(), params[i].size()), {}, rows[i]});
  ReducerOptions opt;
  opt.gradient_as_bucket_view = true;
  opt.comm_hook = spec;
  opt.first_bucket_bytes = 16;
  opt.bucket_bytes = 32;
  Reducer red(comm(), ps, opt);
  const int shard = kSamples / n;
  // Post-local SGD: the models drift apart between averagings.
  std::unique_ptr<PeriodicModelAverager> averager;
  std::vector<TensorView> values;
  for (auto& v : params) values.push_back(view_of(v.data(), v.size()));
  if (average_every)
    averager = std::make_unique<PeriodicModelAverager>(comm(), average_every, average_after);
  for (int step = 0; step < kSteps; ++step) {
    std::vector<float*> grads;
    for (size_t i = 0; i < params.size(); ++i) {
      TensorView g = red.grad_view(i);
      std::memset(g.data, 0, g.nbytes());
      grads.push_back(static_cast<float*>(g.data));
    }
    std::vector<const float*> pp;
    for (auto& v : params) pp.push_back(v.data());
    red.prepare_for_backward();
    testing::backward<float>(pp, grads, data, r * shard, shard, shard, true,
                             [&](size_t i) { red.mark_grad_ready(i); });
    red.finalize_backward();
    for (size_t i = 0; i < params.size(); ++i) {
      const float* g = static_cast<const float*>(red.grad_view(i).data);
      for (size_t k = 0; k < params[i].size(); ++k) params[i][k] -= 0.05f * g[k];
    }
    if (averager) averager->average_parameters(values);
  }
  return testing::full_batch_loss(params, data, true);
}

TEST(CompressionHooks, TrainingConvergesWithinTenPercentOfAllreduce) {
  double base = train("allreduce");
  double start = testing::full_batch_loss(testing::init_params<double>(7),
                                          testing::make_dataset(48, 11), true);
  EXPECT_LT(base, 0.7 * start) << "allreduce itself must train";
  for (const char* spec :
       {"fp16", "bf16", "fp16_wrap:allreduce", "bf16_wrap:allreduce", "powersgd:start_iter=10",
        "powersgd:rank=2,start_iter=2", "batched_powersgd:start_iter=10",
        "fp16_wrap:powersgd:start_iter=10", "bf16_wrap:powersgd:rank=2,start_iter=2"}) {
    if (std::string(spec).find("powersgd") != std::string::npos && !testing::have_powersgd())
      continue;
    double loss = train(spec);
    EXPECT_LE(std::abs(loss - base), 0.1 * base) << spec << ": " << loss << " vs " << base;
  }
  // Post-local SGD: local steps after iteration 10 (each rank its own
  // group), the models averaged every 4 steps (the last at step 78).
  double loss = train("post_local_sgd:start_iter=10,subgroup=1", 4, 10);
  EXPECT_LE(std::abs(loss - base), 0.1 * base) << "post_local_sgd: " << loss << " vs " << base;
}

// A user's own hook, registered by name and picked by spec like a built-in.
class SumThenScale final : public CommHook {
 public:
  explicit SumThenScale(double scale) : scale_(scale) {}
  std::string name() const override { return "sum_then_scale"; }
  Work run(Communicator& c, GradBucket& b) override {
    TensorView buf = b.buffer;
    double s = scale_;
    return c.allreduce(buf, ReduceOp::sum).then([buf, s](const Work&) {
      for (size_t i = 0; i < buf.numel; ++i)
        static_cast<float*>(buf.data)[i] *= static_cast<float>(s);
    });
  }

 private:
  double scale_;
};

TEST(UserHooks, RegisteredByNameAndPickedBySpec) {
  register_comm_hook("sum_then_scale", {"scale"}, [](const HookParams& p) {
    auto it = p.find("scale");
    return std::make_unique<SumThenScale>(it == p.end() ? 1.0 : std::stod(it->second));
  });
  const int n = comm().size(), r = comm().rank();
  std::vector<float> value(10), grad(10);
  ReducerOptions opt;
  opt.comm_hook = "sum_then_scale:scale=0.5";
  Reducer red(comm(), {{view_of(value.data(), 10), view_of(grad.data(), 10)}}, opt);
  for (int i = 0; i < 10; ++i) grad[i] = static_cast<float>(r + i);
  red.prepare_for_backward();
  red.mark_grad_ready(0);
  red.finalize_backward();
  for (int i = 0; i < 10; ++i)
    EXPECT_EQ(grad[i], 0.5f * static_cast<float>(n * (n - 1) / 2 + n * i)) << i;
}

}  // namespace
}  // namespace collie
