// tests/test_local_sgd.cc: post-local SGD and model averaging over real
// processes (run under collie-run). The averagers leave every rank of a group
// holding the float64 mean of the group's parameters (within f32 rounding) at
// exactly the steps PyTorch's averagers would, and nothing changes at the
// others; the post_local_sgd hook averages gradients over every rank before
// start_iter and over its subgroup (or nowhere) after it, so that trained
// replicas are identical, then identical per subgroup, then identical again
// after each averaging. References are computed independently: every rank
// regenerates every other rank's inputs, or collects its parameters with an
// allgather.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "collie/comm.h"
#include "hooks/comm_hook.h"
#include "hooks/model_averager.h"
#include "hooks/post_local_sgd.h"
#include "mp_common.h"
#include "mp_test.h"
#include "reducer/reducer.h"
#include "tiny_mlp.h"

namespace collie {
namespace {

Communicator& comm() {
  return testing::world();
}

std::optional<Error> error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e;
  }
  return std::nullopt;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Every rank's copy of `mine`, rank after rank.
template <typename T>
std::vector<T> gather(std::vector<T> mine) {
  std::vector<T> all(mine.size() * static_cast<size_t>(comm().size()));
  comm().allgather(view_of(mine.data(), mine.size()), view_of(all.data(), all.size())).wait();
  return all;
}

// Rank q's slice of a gathered vector.
template <typename T>
std::vector<T> slice_of(const std::vector<T>& all, int q) {
  size_t n = all.size() / static_cast<size_t>(comm().size());
  return std::vector<T>(all.begin() + static_cast<long>(n * static_cast<size_t>(q)),
                        all.begin() + static_cast<long>(n * static_cast<size_t>(q + 1)));
}

// How far an f32 average of `values` may be from their exact mean: each of
// the n - 1 additions and the division rounds once, each by at most half an
// ulp of a partial sum bounded by sum |v|.
double f32_average_bound(const std::vector<double>& values) {
  double mag = 0;
  for (double v : values) mag += std::abs(v);
  return (static_cast<double>(values.size()) + 1) * std::ldexp(1.0, -24) * mag + 1e-30;
}

// --- a model of several tensors and dtypes -----------------------------------

// Two f32 tensors and one f64 tensor, so that averaging must group by dtype.
// Every rank can regenerate any rank's values at any step.
struct Model {
  std::vector<float> a, b;
  std::vector<double> c;

  static constexpr size_t kA = 7, kB = 1000, kC = 13;

  static Model of(int rank, uint64_t step) {
    auto v = testing::random_values(rank, kA + kB + kC, 1000 + step);
    Model m;
    for (size_t i = 0; i < kA; ++i) m.a.push_back(static_cast<float>(v[i]));
    for (size_t i = 0; i < kB; ++i) m.b.push_back(static_cast<float>(v[kA + i]));
    for (size_t i = 0; i < kC; ++i) m.c.push_back(v[kA + kB + i]);
    return m;
  }
  std::vector<TensorView> views() {
    return {view_of(a.data(), a.size()), view_of(b.data(), b.size()), view_of(c.data(), c.size())};
  }
  // Every element as a double, a then b then c.
  std::vector<double> flat() const {
    std::vector<double> f(a.begin(), a.end());
    f.insert(f.end(), b.begin(), b.end());
    f.insert(f.end(), c.begin(), c.end());
    return f;
  }
};

// Checks that `got` (this rank's model after the averager ran at `step`)
// holds the mean over `members` of every member's model at that step, within
// the rounding of its dtype.
void expect_mean_of(const Model& got, const std::vector<int>& members, uint64_t step,
                    const std::string& what) {
  std::vector<std::vector<double>> inputs;
  for (int q : members) inputs.push_back(Model::of(q, step).flat());
  auto g = got.flat();
  size_t bad = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    std::vector<double> vals;
    double mean = 0;
    for (const auto& in : inputs) {
      vals.push_back(in[i]);
      mean += in[i];
    }
    mean /= static_cast<double>(members.size());
    double bound = f32_average_bound(vals);
    if (i >= Model::kA + Model::kB) bound = bound * std::ldexp(1.0, -29);  // f64 tensor
    if (std::abs(g[i] - mean) > bound && bad++ < 5)
      ADD_FAILURE() << what << ", step " << step << ", element " << i << ": " << g[i] << " vs mean "
                    << mean;
  }
  EXPECT_EQ(bad, 0u) << what << ", step " << step;
}

void expect_unchanged(const Model& got, int rank, uint64_t step, const std::string& what) {
  Model want = Model::of(rank, step);
  EXPECT_EQ(got.a, want.a) << what << ", step " << step;
  EXPECT_EQ(got.b, want.b) << what << ", step " << step;
  EXPECT_EQ(got.c, want.c) << what << ", step " << step;
}

std::vector<int> all_ranks() {
  std::vector<int> v;
  for (int q = 0; q < comm().size(); ++q) v.push_back(q);
  return v;
}

// The ranks of `rank`'s group of `size` consecutive ranks.
std::vector<int> group_of(int rank, int size) {
  std::vector<int> v;
  for (int q = rank / size * size; q < (rank / size + 1) * size; ++q) v.push_back(q);
  return v;
}

// --- PeriodicModelAverager ---------------------------------------------------

TEST(PeriodicModelAverager, AveragesEveryPeriodStepsAfterWarmup) {
  const int r = comm().rank();
  constexpr uint64_t kPeriod = 3, kWarmup = 2;
  PeriodicModelAverager avg(comm(), kPeriod, kWarmup);
  int averaged = 0;
  for (uint64_t step = 0; step < 12; ++step) {
    Model m = Model::of(r, step);
    EXPECT_EQ(avg.step(), step);
    avg.average_parameters(m.views());
    EXPECT_EQ(avg.step(), step + 1);
    // PyTorch: step >= warmup_steps and (step - warmup_steps) % period == 0.
    const bool due = step == 2 || step == 5 || step == 8 || step == 11;
    if (due) {
      ++averaged;
      expect_mean_of(m, all_ranks(), step, "periodic");
      auto all = gather(m.flat());
      for (int q = 1; q < comm().size(); ++q)
        EXPECT_EQ(slice_of(all, q), slice_of(all, 0)) << "rank " << q << " at step " << step;
    } else {
      expect_unchanged(m, r, step, "periodic, not due");
    }
  }
  EXPECT_EQ(averaged, 4);
}

TEST(PeriodicModelAverager, PeriodZeroIsRefused) {
  auto e = error_of([] { PeriodicModelAverager avg(comm(), 0); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), ErrorCode::invalid_argument);
  EXPECT_TRUE(contains(e->what(), "period must be at least 1")) << e->what();
  EXPECT_TRUE(contains(e->what(), "rank " + std::to_string(comm().rank()))) << e->what();
}

TEST(PeriodicModelAverager, StepCountSurvivesACheckpoint) {
  const int r = comm().rank();
  PeriodicModelAverager first(comm(), 4, 1);
  for (uint64_t step = 0; step < 3; ++step) {
    Model m = Model::of(r, step);
    first.average_parameters(m.views());
  }
  PeriodicModelAverager resumed(comm(), 4, 1);
  resumed.load_state(first.save_state());
  EXPECT_EQ(resumed.step(), 3u);
  // Step 3 is not due ((3 - 1) % 4 != 0), step 5 is.
  Model m3 = Model::of(r, 3);
  resumed.average_parameters(m3.views());
  expect_unchanged(m3, r, 3, "resumed");
  Model m4 = Model::of(r, 4);
  resumed.average_parameters(m4.views());
  expect_unchanged(m4, r, 4, "resumed");
  Model m5 = Model::of(r, 5);
  resumed.average_parameters(m5.views());
  expect_mean_of(m5, all_ranks(), 5, "resumed");

  auto e = error_of([&] { resumed.load_state({1, 2, 3}); });
  ASSERT_TRUE(e);
  EXPECT_TRUE(contains(e->what(), "8 bytes")) << e->what();
}

TEST(PeriodicModelAverager, IntegerParametersAreRefused) {
  std::vector<int32_t> counts(4, 1);
  PeriodicModelAverager avg(comm(), 1);
  auto e = error_of([&] { avg.average_parameters({view_of(counts.data(), counts.size())}); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), ErrorCode::invalid_argument);
  EXPECT_TRUE(contains(e->what(), "parameter 0 is i32")) << e->what();
}

// --- HierarchicalModelAverager -------------------------------------------------

TEST(HierarchicalModelAverager, HalvesEveryTwoStepsTheWorldEveryFour) {
  const int n = comm().size(), r = comm().rank();
  if (n % 2) GTEST_SKIP() << "needs an even number of ranks";
  const int half = n / 2;
  constexpr uint64_t kWarmup = 1;
  HierarchicalModelAverager avg(comm(), {{2, half}, {4, n}}, kWarmup);
  EXPECT_EQ(avg.group_size(0), half);
  EXPECT_EQ(avg.group_size(1), n);
  for (uint64_t step = 0; step < 10; ++step) {
    Model m = Model::of(r, step);
    avg.average_parameters(m.views());
    auto all = gather(m.flat());
    // PyTorch: the largest period dividing `step` (not step - warmup).
    if (step >= kWarmup && step % 4 == 0) {
      expect_mean_of(m, all_ranks(), step, "world level");
      for (int q = 1; q < n; ++q) EXPECT_EQ(slice_of(all, q), slice_of(all, 0)) << q;
    } else if (step >= kWarmup && step % 2 == 0) {
      expect_mean_of(m, group_of(r, half), step, "half level");
      for (int q = 0; q < n; ++q) {
        if (q / half == r / half) {
          EXPECT_EQ(slice_of(all, q), slice_of(all, r)) << "rank " << q << " is in my half";
        } else {
          EXPECT_NE(slice_of(all, q), slice_of(all, r)) << "rank " << q << " is in the other half";
        }
      }
    } else {
      expect_unchanged(m, r, step, "hierarchical, not due");
    }
  }
  EXPECT_EQ(avg.step(), 10u);
}

TEST(HierarchicalModelAverager, BadLevelsNameTheProblemAndTheRank) {
  const int n = comm().size();
  const std::string rank = "rank " + std::to_string(comm().rank());
  auto refused = [&](std::vector<AveragingLevel> levels, const std::string& problem) {
    auto e = error_of([&] { HierarchicalModelAverager avg(comm(), levels); });
    ASSERT_TRUE(e) << problem;
    EXPECT_EQ(e->code(), ErrorCode::invalid_argument) << e->what();
    EXPECT_TRUE(contains(e->what(), problem)) << e->what();
    EXPECT_TRUE(contains(e->what(), rank)) << e->what();
  };
  refused({}, "no levels given");
  refused({{0, n}}, "period must be at least 1");
  refused({{4, 1}, {2, n}}, "strictly ascending");
  const int nondivisor = n % 3 ? 3 : n + 1;
  refused({{2, nondivisor}, {4, n}}, "must divide the world size");
  if (n > 1) refused({{2, 1}, {4, 1}}, "must be the world size");
}

// Ranks of one machine stand for two hosts through COLLIE_HOSTNAME.
TEST(HierarchicalModelAverager, HostLevelGroupsRanksByHostName) {
  const int n = comm().size(), r = comm().rank();
  ASSERT_EQ(unsetenv("COLLIE_HOSTNAME"), 0);
  EXPECT_EQ(host_colors(comm()), std::vector<int>(static_cast<size_t>(n), 0))
      << "every rank of this test runs on one machine";

  const int half = (n + 1) / 2;  // ranks [0, half) on host a, the rest on host b
  ASSERT_EQ(setenv("COLLIE_HOSTNAME", r < half ? "sim-host-a" : "sim-host-b", 1), 0);
  std::vector<int> want, host;
  for (int q = 0; q < n; ++q) want.push_back(q < half ? 0 : half);
  EXPECT_EQ(host_colors(comm()), want);
  EXPECT_EQ(host_color(comm()), want[static_cast<size_t>(r)]);
  for (int q = 0; q < n; ++q)
    if (want[static_cast<size_t>(q)] == want[static_cast<size_t>(r)]) host.push_back(q);

  HierarchicalModelAverager avg(comm(), {{1, 0}, {3, n}});
  ASSERT_EQ(unsetenv("COLLIE_HOSTNAME"), 0);
  EXPECT_EQ(avg.group_size(0), static_cast<int>(host.size()));
  for (uint64_t step = 0; step < 4; ++step) {
    Model m = Model::of(r, step);
    avg.average_parameters(m.views());
    if (step % 3 == 0)
      expect_mean_of(m, all_ranks(), step, "world level");
    else
      expect_mean_of(m, host, step, "host level");
  }
}

// --- post_local_sgd through the reducer ---------------------------------------

using Params = std::vector<std::vector<float>>;

std::vector<float> flatten(const Params& p) {
  std::vector<float> f;
  for (const auto& v : p) f.insert(f.end(), v.begin(), v.end());
  return f;
}

std::vector<TensorView> views_of(Params& p) {
  std::vector<TensorView> v;
  for (auto& t : p) v.push_back(view_of(t.data(), t.size()));
  return v;
}

constexpr int kSamples = 48;
constexpr float kLr = 0.05f;

// This rank's gradient of the tiny MLP on its own shard, summed into `grads`
// (zeroed first): the arithmetic the reducer path and the local reference
// share, so that their results can be compared bit for bit.
void shard_backward(const Params& params, const std::vector<float*>& grads,
                    const testing::Dataset& data, const std::function<void(size_t)>& ready) {
  const int n = comm().size(), r = comm().rank();
  const int shard = kSamples / n;
  for (size_t i = 0; i < params.size(); ++i)
    std::memset(grads[i], 0, params[i].size() * sizeof(float));
  std::vector<const float*> pp;
  for (const auto& v : params) pp.push_back(v.data());
  testing::backward<float>(pp, grads, data, r * shard, shard, shard, true, ready);
}

void sgd_step(Params& params, const std::vector<const float*>& grads) {
  for (size_t i = 0; i < params.size(); ++i)
    for (size_t k = 0; k < params[i].size(); ++k) params[i][k] -= kLr * grads[i][k];
}

// The tiny MLP trained through a reducer with the given comm hook.
struct Trainer {
  Params params = testing::init_params<float>(7);
  testing::Dataset data = testing::make_dataset(kSamples, 11);
  std::unique_ptr<Reducer> red;

  explicit Trainer(const std::string& hook) {
    std::vector<Parameter> ps;
    for (auto& v : params) ps.push_back({view_of(v.data(), v.size()), {}});
    ReducerOptions opt;
    opt.gradient_as_bucket_view = true;
    opt.comm_hook = hook;
    opt.first_bucket_bytes = 16;  // several buckets, so is_last matters
    opt.bucket_bytes = 64;
    red = std::make_unique<Reducer>(comm(), ps, opt);
  }

  void step() {
    std::vector<float*> grads;
    for (size_t i = 0; i < params.size(); ++i)
      grads.push_back(static_cast<float*>(red->grad_view(i).data));
    red->prepare_for_backward();
    shard_backward(params, grads, data, [&](size_t i) { red->mark_grad_ready(i); });
    red->finalize_backward();
    std::vector<const float*> g;
    for (size_t i = 0; i < params.size(); ++i)
      g.push_back(static_cast<const float*>(red->grad_view(i).data));
    sgd_step(params, g);
  }
};

// Post-local SGD as PyTorch documents it: the hook with start_iter and a
// periodic averager with warmup_steps = start_iter, after each SGD step.
TEST(PostLocalSgd, ReplicasAgreeThenPerSubgroupThenAfterEachAveraging) {
  const int n = comm().size(), r = comm().rank();
  if (n < 2) GTEST_SKIP() << "needs two ranks";
  const int k = n / 2;  // two subgroups
  constexpr uint64_t kStart = 3, kPeriod = 4;
  Trainer t("post_local_sgd:start_iter=" + std::to_string(kStart) +
            ",subgroup=" + std::to_string(k));
  PeriodicModelAverager avg(comm(), kPeriod, kStart);
  int local_steps = 0, averagings = 0;
  for (uint64_t step = 0; step < 12; ++step) {
    t.step();
    auto before = gather(flatten(t.params));
    avg.average_parameters(views_of(t.params));
    auto after = gather(flatten(t.params));
    const std::string at = "step " + std::to_string(step);
    if (step < kStart) {
      // Gradients averaged over every rank: the replicas never part.
      for (int q = 1; q < n; ++q)
        EXPECT_EQ(slice_of(after, q), slice_of(after, 0)) << at << ", rank " << q;
      EXPECT_EQ(before, after) << at << ": no averaging during warmup";
    } else if ((step - kStart) % kPeriod == 0) {
      ++averagings;
      // The iteration before was local: the subgroups had drifted apart...
      EXPECT_NE(slice_of(before, 0), slice_of(before, n - 1)) << at;
      // ...and now every rank holds the mean of what they held.
      for (int q = 1; q < n; ++q)
        EXPECT_EQ(slice_of(after, q), slice_of(after, 0)) << at << ", rank " << q;
      auto mine = slice_of(after, r);
      size_t bad = 0;
      for (size_t i = 0; i < mine.size(); ++i) {
        std::vector<double> vals;
        double mean = 0;
        for (int q = 0; q < n; ++q) {
          vals.push_back(before[static_cast<size_t>(q) * mine.size() + i]);
          mean += vals.back();
        }
        mean /= n;
        if (std::abs(mine[i] - mean) > f32_average_bound(vals)) ++bad;
      }
      EXPECT_EQ(bad, 0u) << at << ": parameters are not the mean of the ranks' parameters";
    } else {
      ++local_steps;
      EXPECT_EQ(before, after) << at << ": not an averaging step";
      for (int q = 0; q < n; ++q) {
        if (q / k == r / k) {
          EXPECT_EQ(slice_of(after, q), slice_of(after, r))
              << at << ": rank " << q << " shares my subgroup";
        } else {
          EXPECT_NE(slice_of(after, q), slice_of(after, r))
              << at << ": rank " << q << " is in another subgroup";
        }
      }
    }
  }
  EXPECT_EQ(averagings, 3);   // steps 3, 7, 11
  EXPECT_EQ(local_steps, 6);  // 4, 5, 6, 8, 9, 10
  EXPECT_EQ(counter_from_state(t.red->comm_hook().save_state(), "test"), 12u);
}

// subgroup=none: after start_iter each rank follows its own gradients only,
// exactly as the same SGD without any reducer would.
TEST(PostLocalSgd, SubgroupNoneStepsLocallyAfterStart) {
  const int n = comm().size();
  constexpr uint64_t kStart = 2;
  Trainer t("post_local_sgd:start_iter=" + std::to_string(kStart) + ",subgroup=none");
  Params ref;
  for (uint64_t step = 0; step < 7; ++step) {
    if (step == kStart) ref = t.params;  // from here on, a local reference
    t.step();
    auto all = gather(flatten(t.params));
    if (step < kStart) {
      for (int q = 1; q < n; ++q) EXPECT_EQ(slice_of(all, q), slice_of(all, 0)) << "step " << step;
      continue;
    }
    std::vector<std::vector<float>> g;
    std::vector<float*> gp;
    for (auto& v : ref) g.emplace_back(v.size());
    for (auto& v : g) gp.push_back(v.data());
    shard_backward(ref, gp, t.data, [](size_t) {});
    sgd_step(ref, std::vector<const float*>(gp.begin(), gp.end()));
    EXPECT_EQ(t.params, ref) << "step " << step << ": not the local SGD step";
    for (int q = 1; q < n; ++q) EXPECT_NE(slice_of(all, q), slice_of(all, 0)) << "step " << step;
  }
}

// One iteration of a reducer over one parameter whose gradient is
// 8 * rank + i (exact in f32, and so are its means over 2 or 4 ranks): what
// the hook left in the gradient.
std::vector<float> reduce_once(std::shared_ptr<CommHook> hook) {
  const int r = comm().rank();
  std::vector<float> value(6, 0.f), grad(6);
  ReducerOptions opt;
  opt.hook = std::move(hook);
  Reducer red(comm(), {{view_of(value.data(), value.size()), view_of(grad.data(), grad.size())}},
              opt);
  for (size_t i = 0; i < grad.size(); ++i)
    grad[i] = static_cast<float>(8 * r + static_cast<int>(i));
  red.prepare_for_backward();
  red.mark_grad_ready(0);
  red.finalize_backward();
  return grad;
}

std::vector<float> mean_over(const std::vector<int>& members) {
  std::vector<float> m(6);
  for (size_t i = 0; i < m.size(); ++i) {
    double s = 0;
    for (int q : members) s += 8 * q + static_cast<double>(i);
    m[i] = static_cast<float>(s / static_cast<double>(members.size()));
  }
  return m;
}

// The iteration count decides, and it is the hook's state: a hook that
// loads a count past start_iter averages within its subgroup from its first
// bucket on.
TEST(PostLocalSgd, LoadedIterationCountDecidesTheGroup) {
  const int n = comm().size(), r = comm().rank();
  const int k = std::max(1, n / 2);
  const std::string spec = "post_local_sgd:start_iter=2,subgroup=" + std::to_string(k);

  std::shared_ptr<CommHook> fresh = make_comm_hook(spec);
  EXPECT_EQ(fresh->name(), spec);
  EXPECT_EQ(reduce_once(fresh), mean_over(all_ranks()));
  EXPECT_EQ(counter_from_state(fresh->save_state(), "test"), 1u);

  std::shared_ptr<CommHook> resumed = make_comm_hook(spec);
  resumed->load_state(counter_state(5));
  EXPECT_EQ(reduce_once(resumed), mean_over(group_of(r, k)));
  EXPECT_EQ(counter_from_state(resumed->save_state(), "test"), 6u);

  auto e = error_of([&] { resumed->load_state({1, 2, 3}); });
  ASSERT_TRUE(e);
  EXPECT_TRUE(contains(e->what(), "8 bytes")) << e->what();
}

// subgroup=host (the default) follows the host names.
TEST(PostLocalSgd, HostSubgroupFollowsHostNames) {
  const int n = comm().size(), r = comm().rank();
  ASSERT_EQ(unsetenv("COLLIE_HOSTNAME"), 0);
  // One real machine: the host group is everyone.
  EXPECT_EQ(reduce_once(make_comm_hook("post_local_sgd:start_iter=0")), mean_over(all_ranks()));

  const int half = (n + 1) / 2;
  ASSERT_EQ(setenv("COLLIE_HOSTNAME", r < half ? "sim-host-a" : "sim-host-b", 1), 0);
  std::vector<int> host;
  for (int q = 0; q < n; ++q)
    if ((q < half) == (r < half)) host.push_back(q);
  std::vector<float> got = reduce_once(make_comm_hook("post_local_sgd:start_iter=0,subgroup=host"));
  ASSERT_EQ(unsetenv("COLLIE_HOSTNAME"), 0);
  EXPECT_EQ(got, mean_over(host));
}

TEST(PostLocalSgd, BadSpecsNameTheParameter) {
  const int n = comm().size();
  auto refused = [](const std::string& spec, const std::vector<std::string>& parts) {
    auto e = error_of([&] { make_comm_hook(spec); });
    ASSERT_TRUE(e) << spec;
    EXPECT_EQ(e->code(), ErrorCode::invalid_argument) << e->what();
    for (const auto& p : parts) EXPECT_TRUE(contains(e->what(), p)) << spec << ": " << e->what();
  };
  refused("post_local_sgd:start_iter=x", {"start_iter", "'x'", "integer"});
  refused("post_local_sgd:start_iter=-1", {"start_iter", "'-1'"});
  refused("post_local_sgd:subgroup=0", {"subgroup='0'", "host", "none"});
  refused("post_local_sgd:subgroup=rack", {"subgroup='rack'", "host", "none"});
  refused("post_local_sgd:period=4", {"no parameter 'period'", "start_iter, subgroup"});
  EXPECT_EQ(make_comm_hook("post_local_sgd")->name(),
            "post_local_sgd:start_iter=100,subgroup=host");

  // A group size that does not divide the world is found on the first
  // bucket (which the first iteration sends at finalize), on every rank
  // alike.
  const int bad = n % 3 ? 3 : n + 1;
  const std::string spec = "post_local_sgd:subgroup=" + std::to_string(bad);
  std::vector<float> value(4, 0.f), grad(4, 1.f);
  ReducerOptions opt;
  opt.comm_hook = spec;
  Reducer red(comm(), {{view_of(value.data(), value.size()), view_of(grad.data(), grad.size())}},
              opt);
  red.prepare_for_backward();
  auto e = error_of([&] {
    red.mark_grad_ready(0);
    red.finalize_backward();
  });
  ASSERT_TRUE(e) << spec;
  EXPECT_EQ(e->code(), ErrorCode::invalid_argument) << e->what();
  EXPECT_TRUE(contains(e->what(), "subgroup=" + std::to_string(bad))) << e->what();
  EXPECT_TRUE(contains(e->what(), "world size " + std::to_string(n))) << e->what();
}

}  // namespace
}  // namespace collie
