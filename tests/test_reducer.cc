// tests/test_reducer.cc: data-parallel training through the reducer equals
// serial training on the whole batch.
//
// Run under collie-run. Each rank trains tiny_mlp.h on its shard of a batch
// for K SGD steps with the reducer averaging gradients; a float64 serial
// run over the whole batch is the reference. Every option combination:
// gradient_as_bucket_view, static_graph, a parameter that some iterations do
// not use (find_unused_parameters), no_sync over 4 micro-batches, with tiny
// bucket caps so that there are several buckets and the first-iteration
// rebuild really moves gradients.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "collie/comm.h"
#include "mp_test.h"
#include "reducer/reducer.h"
#include "tiny_mlp.h"

namespace collie {
namespace {

using testing::MlpShape;

Communicator& comm() {
  return testing::world();
}

constexpr int kSamples = 48, kSteps = 6;
constexpr double kLr = 0.05;

struct Config {
  bool bucket_view, static_graph, unused, no_sync;
  std::string name() const {
    return std::string(bucket_view ? "view" : "copy") + (static_graph ? "+static" : "") +
           (unused ? "+unused" : "") + (no_sync ? "+no_sync" : "");
  }
};

// Whether parameter e (index 4) takes part at `step`. With a static graph
// the set never changes: e is then never used.
bool uses_e(const Config& c, int step) {
  if (!c.unused) return true;
  return c.static_graph ? false : step % 2 == 1;
}

std::vector<std::vector<double>> reference(const Config& c) {
  auto p = testing::init_params<double>(7);
  auto data = testing::make_dataset(kSamples, 11);
  for (int step = 0; step < kSteps; ++step) {
    std::vector<std::vector<double>> g;
    for (auto& v : p) g.emplace_back(v.size(), 0.0);
    std::vector<const double*> pp;
    std::vector<double*> gp;
    for (size_t i = 0; i < p.size(); ++i) {
      pp.push_back(p[i].data());
      gp.push_back(g[i].data());
    }
    testing::backward<double>(pp, gp, data, 0, kSamples, kSamples, uses_e(c, step), [](size_t) {});
    for (size_t i = 0; i < p.size(); ++i)
      for (size_t k = 0; k < p[i].size(); ++k) p[i][k] -= kLr * g[i][k];
  }
  return p;
}

void train_and_compare(const Config& c) {
  const int n = comm().size(), r = comm().rank();
  auto params = testing::init_params<float>(r == 0 ? 7 : 1000 + r);  // rank 0's values win
  auto data = testing::make_dataset(kSamples, 11);
  std::vector<std::vector<float>> own_grads;
  for (auto& v : params) own_grads.emplace_back(v.size(), 0.0f);
  std::vector<Parameter> ps;
  for (size_t i = 0; i < params.size(); ++i)
    ps.push_back({view_of(params[i].data(), params[i].size()),
                  view_of(own_grads[i].data(), own_grads[i].size())});
  ReducerOptions opt;
  opt.first_bucket_bytes = 16;  // 3-4 buckets out of 56 floats of parameters
  opt.bucket_bytes = 32;
  opt.gradient_as_bucket_view = c.bucket_view;
  opt.static_graph = c.static_graph;
  opt.find_unused_parameters = c.unused;
  Reducer red(comm(), ps, opt);

  const int shard = kSamples / n, first = r * shard;
  const int micro = c.no_sync ? 4 : 1;
  for (int step = 0; step < kSteps; ++step) {
    std::vector<float*> grads;
    for (size_t i = 0; i < params.size(); ++i) {
      TensorView g = red.grad_view(i);
      std::memset(g.data, 0, g.nbytes());  // zero_grad
      grads.push_back(static_cast<float*>(g.data));
    }
    std::vector<const float*> pp;
    for (auto& v : params) pp.push_back(v.data());
    bool use_e = uses_e(c, step);
    std::vector<bool> used(params.size(), true);
    used[4] = use_e;
    for (int m = 0; m < micro; ++m) {
      red.set_no_sync(m + 1 < micro);
      red.prepare_for_backward(used);
      int count = shard / micro;
      testing::backward<float>(pp, grads, data, first + m * count, count, shard, use_e,
                               [&](size_t i) { red.mark_grad_ready(i); });
      red.finalize_backward();
    }
    for (size_t i = 0; i < params.size(); ++i) {
      const float* g =
          static_cast<const float*>(red.grad_view(i).data);  // re-read: rebuilds move it
      for (size_t k = 0; k < params[i].size(); ++k) params[i][k] -= static_cast<float>(kLr) * g[k];
    }
  }

  auto ref = reference(c);
  double worst = 0;
  for (size_t i = 0; i < params.size(); ++i)
    for (size_t k = 0; k < params[i].size(); ++k)
      worst =
          std::max(worst, std::abs(params[i][k] - ref[i][k]) / std::max(1.0, std::abs(ref[i][k])));
  EXPECT_LE(worst, 1e-5) << c.name();

  // Every rank holds the same bits.
  std::vector<float> flat;
  for (auto& v : params) flat.insert(flat.end(), v.begin(), v.end());
  std::vector<float> all(flat.size() * n);
  comm().allgather(view_of(flat.data(), flat.size()), view_of(all.data(), all.size())).wait();
  for (int q = 0; q < n; ++q)
    EXPECT_EQ(0,
              std::memcmp(all.data() + q * flat.size(), flat.data(), flat.size() * sizeof(float)))
        << c.name() << ": rank " << q << " differs from rank " << r;
  EXPECT_EQ(red.iterations(), static_cast<uint64_t>(kSteps)) << c.name();
  EXPECT_GE(red.plan().buckets().size(), 3u) << c.name();
}

TEST(Reducer, DataParallelEqualsSerialForEveryOptionCombination) {
  for (bool view : {false, true})
    for (bool stat : {false, true})
      for (bool unused : {false, true})
        for (bool no_sync : {false, true}) train_and_compare({view, stat, unused, no_sync});
}

TEST(Reducer, BucketViewsAreTheBucketsNoCopies) {
  std::vector<float> a(10), b(20);
  std::vector<Parameter> ps{{view_of(a.data(), 10), {}}, {view_of(b.data(), 20), {}}};
  ReducerOptions opt;
  opt.gradient_as_bucket_view = true;
  Reducer red(comm(), ps, opt);
  ASSERT_EQ(red.plan().buckets().size(), 1u);
  // Both gradients live in one bucket, back to back, last parameter first.
  auto g0 = red.grad_view(0), g1 = red.grad_view(1);
  EXPECT_EQ(static_cast<float*>(g1.data) + 20, static_cast<float*>(g0.data));
}

TEST(Reducer, MisuseIsAClearError) {
  std::vector<float> a(4, 1.0f), ga(4), b(3, 1.0f), gb(3);
  std::vector<Parameter> ps{{view_of(a.data(), 4), view_of(ga.data(), 4)},
                            {view_of(b.data(), 3), view_of(gb.data(), 3)}};
  Reducer red(comm(), ps, {});
  auto message = [](const std::function<void()>& fn) -> std::string {
    try {
      fn();
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_NE(message([&] { red.mark_grad_ready(0); }).find("prepare_for_backward"),
            std::string::npos);
  red.prepare_for_backward();
  EXPECT_NE(message([&] { red.prepare_for_backward(); }).find("still pending"), std::string::npos);
  red.mark_grad_ready(1);
  EXPECT_NE(message([&] { red.mark_grad_ready(1); }).find("marked ready twice"), std::string::npos);
  EXPECT_NE(message([&] { red.mark_grad_ready(5); }).find("there are 2 parameters"),
            std::string::npos);
  std::string early = message([&] { red.finalize_backward(); });
  EXPECT_NE(early.find("parameters 0"), std::string::npos) << early;
  EXPECT_NE(early.find("find_unused_parameters"), std::string::npos) << early;
  // Nothing was launched (the one bucket still waited for parameter 0), so
  // the ranks are still in step for whatever comes next.
  comm().barrier().wait();
}

}  // namespace
}  // namespace collie
