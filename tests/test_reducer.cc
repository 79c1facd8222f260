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

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <random>
#include <string>
#include <thread>

#include "base/cuda_api.h"
#include "collie/comm.h"
#include "fake_device.h"
#include "mp_common.h"
#include "mp_test.h"
#include "reducer/reducer.h"
#include "tiny_mlp.h"

namespace collie {
namespace {

using testing::MlpShape;

// COLLIE_TEST_FAKE_CUDA=1: parameters, gradients and buckets on "CUDA",
// in a fake device's memory (tests/fake_device.h), installed before the
// communicator is made; the bucket all-reduces are then staged
// (COLLIE_CUDA_BACKEND=staged), and the reducer's copies and zeroing go
// through the device's streams.
bool fake_cuda() {
  static const bool on = [] {
    const char* v = std::getenv("COLLIE_TEST_FAKE_CUDA");
    if (!v || std::string(v) != "1") return false;
    cuda::set_device_api(std::make_shared<fake::FakeCuda>());
    return true;
  }();
  return on;
}

Communicator& comm() {
  fake_cuda();
  return testing::world();
}

// A parameter's or gradient's view: on the (fake) device in that mode.
TensorView pv(float* p, size_t n) {
  TensorView t = view_of(p, n);
  if (fake_cuda()) t.device = Device::cuda(0);
  return t;
}

// What the reducer queued on this thread's stream has run: as a program
// that reads gradients on the host waits for its stream.
void settle() {
  if (fake_cuda()) cuda::wait_queued(Device::cuda(0));
}

// Each rank trains on its own kPerRank samples (a multiple of the 4 no_sync
// micro-batches), and the reference on all of them: with a fixed total the
// shards left samples out at world sizes that do not divide it (5 ranks).
constexpr int kPerRank = 12, kSteps = 6;
int samples() {
  return kPerRank * comm().size();
}
constexpr double kLr = 0.05;

struct Config {
  bool bucket_view, static_graph, unused, no_sync;
  // Copy mode with gradients that move: every step the engine frees its
  // gradient buffers and makes new ones (PyTorch's zero_grad(set_to_none)),
  // passes each at mark_grad_ready, and says an unused one has none.
  bool moving = false;
  std::string name() const {
    return std::string(bucket_view ? "view" : "copy") + (static_graph ? "+static" : "") +
           (unused ? "+unused" : "") + (no_sync ? "+no_sync" : "") + (moving ? "+moving" : "");
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
  const int total = samples();
  auto data = testing::make_dataset(total, 11);
  for (int step = 0; step < kSteps; ++step) {
    std::vector<std::vector<double>> g;
    for (auto& v : p) g.emplace_back(v.size(), 0.0);
    std::vector<const double*> pp;
    std::vector<double*> gp;
    for (size_t i = 0; i < p.size(); ++i) {
      pp.push_back(p[i].data());
      gp.push_back(g[i].data());
    }
    testing::backward<double>(pp, gp, data, 0, total, total, uses_e(c, step), [](size_t) {});
    for (size_t i = 0; i < p.size(); ++i)
      for (size_t k = 0; k < p[i].size(); ++k) p[i][k] -= kLr * g[i][k];
  }
  return p;
}

void train_and_compare(const Config& c) {
  const int n = comm().size(), r = comm().rank();
  auto params = testing::init_params<float>(r == 0 ? 7 : 1000 + r);  // rank 0's values win
  auto data = testing::make_dataset(samples(), 11);
  std::vector<std::vector<float>> own_grads;
  for (auto& v : params) own_grads.emplace_back(v.size(), 0.0f);
  std::vector<Parameter> ps;
  for (size_t i = 0; i < params.size(); ++i)
    ps.push_back({pv(params[i].data(), params[i].size()),
                  c.moving ? TensorView{} : pv(own_grads[i].data(), own_grads[i].size())});
  ReducerOptions opt;
  opt.first_bucket_bytes = 16;  // 3-4 buckets out of 56 floats of parameters
  opt.bucket_bytes = 32;
  opt.gradient_as_bucket_view = c.bucket_view;
  opt.static_graph = c.static_graph;
  opt.find_unused_parameters = c.unused;
  Reducer red(comm(), ps, opt);

  const int shard = kPerRank, first = r * shard;
  const int micro = c.no_sync ? 4 : 1;
  for (int step = 0; step < kSteps; ++step) {
    std::vector<float*> grads;
    if (c.moving) {
      // New buffers every step, the old ones freed: the reducer must never
      // write where a gradient was (asan reports it if it does).
      std::vector<std::vector<float>> fresh;
      for (auto& v : params) fresh.emplace_back(v.size(), 0.0f);
      own_grads.swap(fresh);
    }
    for (size_t i = 0; i < params.size(); ++i) {
      TensorView g = c.moving ? pv(own_grads[i].data(), own_grads[i].size()) : red.grad_view(i);
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
      if (c.moving && !use_e) red.set_grad(4, {});  // set_to_none: no buffer for e
      int count = shard / micro;
      testing::backward<float>(pp, grads, data, first + m * count, count, shard, use_e,
                               [&](size_t i) {
                                 if (c.moving)
                                   red.mark_grad_ready(i, pv(grads[i], params[i].size()));
                                 else
                                   red.mark_grad_ready(i);
                               });
      red.finalize_backward();
      settle();
    }
    for (size_t i = 0; i < params.size(); ++i) {
      // Re-read: rebuilds move bucket views; with moving gradients an unused
      // one has no buffer (its update would add zero).
      const float* g = static_cast<const float*>(red.grad_view(i).data);
      if (!g) continue;
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
        for (bool no_sync : {false, true}) {
          train_and_compare({view, stat, unused, no_sync});
          if (!view) train_and_compare({view, stat, unused, no_sync, true});
        }
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

// An engine's allocator that keeps the books: what it handed out, and when
// it got it back.
class CountingAllocator final : public BucketAllocator {
 public:
  void* allocate(size_t bytes, DType t, Device d) override {
    void* p = host_bucket_allocator()->allocate(bytes, t, d);
    std::lock_guard lk(mu);
    live.push_back({p, bytes});
    ++allocations;
    return p;
  }
  void release(void* p, size_t bytes, Device d) noexcept override {
    {
      std::lock_guard lk(mu);
      ++releases;
      for (size_t i = 0; i < live.size(); ++i)
        if (live[i].first == p) live.erase(live.begin() + static_cast<long>(i));
    }
    host_bucket_allocator()->release(p, bytes, d);
  }
  bool owns(const TensorView& v) {
    std::lock_guard lk(mu);
    auto* b = static_cast<uint8_t*>(v.data);
    for (auto [p, n] : live)
      if (b >= static_cast<uint8_t*>(p) && b + v.nbytes() <= static_cast<uint8_t*>(p) + n)
        return true;
    return false;
  }
  bool none_live() {
    std::lock_guard lk(mu);
    return live.empty();
  }
  std::mutex mu;
  std::vector<std::pair<void*, size_t>> live;
  // The last release may come from the continuation thread.
  std::atomic<int> allocations{0}, releases{0};
};

// Parameters of two dtypes, marked in registration order, so that the
// rebuild after the first iteration changes the layout.
struct TwoDtypeModel {
  std::vector<std::vector<float>> f{std::vector<float>(5), std::vector<float>(7),
                                    std::vector<float>(3), std::vector<float>(9)};
  std::vector<double> d = std::vector<double>(6);
  std::vector<Parameter> params() {
    std::vector<Parameter> ps;
    for (auto& v : f) ps.push_back({view_of(v.data(), v.size()), {}});
    ps.push_back({view_of(d.data(), d.size()), {}});
    return ps;
  }
};

// One synchronised step in bucket-view mode: gradient i, element k of rank r
// is (r + 1) * (i + 1) + k; returns the worst error against the average.
double view_step(Reducer& red, size_t nparams, const std::vector<TensorView>& write_to) {
  const int n = comm().size(), r = comm().rank();
  red.prepare_for_backward();
  for (size_t i = 0; i < nparams; ++i) {
    TensorView g = write_to[i];
    for (size_t k = 0; k < g.numel; ++k)
      testing::put(g.dtype, g.data, k, (r + 1.0) * (i + 1.0) + static_cast<double>(k));
    red.mark_grad_ready(i, g);
  }
  red.finalize_backward();
  double worst = 0;
  for (size_t i = 0; i < nparams; ++i) {
    TensorView g = red.grad_view(i);
    for (size_t k = 0; k < g.numel; ++k) {
      double want = (n + 1.0) / 2.0 * (i + 1.0) + static_cast<double>(k);
      worst = std::max(worst, std::abs(testing::get(g.dtype, g.data, k) - want));
    }
  }
  return worst;
}

std::vector<TensorView> views_of(Reducer& red, size_t n) {
  std::vector<TensorView> v;
  for (size_t i = 0; i < n; ++i) v.push_back(red.grad_view(i));
  return v;
}

// Bucket memory comes from the engine's allocator, once per (dtype,
// device); the rebuild moves gradients inside it without allocating; the
// memory goes back only when the reducer is gone.
TEST(Reducer, BucketMemoryComesFromTheEnginesAllocatorAndIsNeverReallocated) {
  TwoDtypeModel m;
  auto alloc = std::make_shared<CountingAllocator>();
  {
    ReducerOptions opt;
    opt.gradient_as_bucket_view = true;
    opt.first_bucket_bytes = 16;
    opt.bucket_bytes = 32;
    opt.bucket_allocator = alloc;
    Reducer red(comm(), m.params(), opt);
    EXPECT_EQ(alloc->allocations, 2);  // f32 and f64
    for (size_t i = 0; i < 5; ++i) EXPECT_TRUE(alloc->owns(red.grad_view(i))) << i;
    EXPECT_EQ(red.layout_generation(), 0u);
    EXPECT_LE(view_step(red, 5, views_of(red, 5)), 1e-12);  // marked 0..4: another order
    EXPECT_EQ(red.layout_generation(), 1u);
    // After the rebuild the averages are still there, in the new places.
    for (int step = 0; step < 3; ++step)
      EXPECT_LE(view_step(red, 5, views_of(red, 5)), 1e-12) << step;
    for (size_t i = 0; i < 5; ++i) EXPECT_TRUE(alloc->owns(red.grad_view(i))) << i;
    EXPECT_EQ(alloc->allocations, 2);
    EXPECT_EQ(alloc->releases, 0);
  }
  // The last bucket's continuation holds its memory until it has run to its
  // end, on the continuation thread, just after finalize saw the bucket done.
  for (int i = 0; i < 5000 && alloc->releases < 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(alloc->releases, 2);
  EXPECT_TRUE(alloc->none_live());
}

// An engine that keeps a gradient view from before the rebuild is told so
// when it marks the gradient with it, naming the generation, instead of
// writing into whatever gradient now lives there.
TEST(Reducer, AViewFromBeforeTheRebuildIsRefusedNamingTheGeneration) {
  TwoDtypeModel m;
  ReducerOptions opt;
  opt.gradient_as_bucket_view = true;
  opt.first_bucket_bytes = 16;
  opt.bucket_bytes = 32;
  Reducer red(comm(), m.params(), opt);
  auto before = views_of(red, 5);
  view_step(red, 5, before);
  ASSERT_EQ(red.layout_generation(), 1u);
  auto after = views_of(red, 5);
  size_t moved = 5;
  for (size_t i = 0; i < 5 && moved == 5; ++i)
    if (before[i].data != after[i].data) moved = i;
  ASSERT_LT(moved, 5u) << "the rebuild moved nothing";
  red.prepare_for_backward();
  std::string msg = testing::error_of([&] { red.mark_grad_ready(moved, before[moved]); });
  EXPECT_NE(msg.find("layout generation 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("re-read grad_view()"), std::string::npos) << msg;
  // A buffer that never was a bucket view is refused too.
  std::vector<float> elsewhere(after[0].numel);
  msg = testing::error_of(
      [&] { red.mark_grad_ready(0, view_of(elsewhere.data(), elsewhere.size())); });
  EXPECT_NE(msg.find("not its bucket view"), std::string::npos) << msg;
  // With the current views the step goes through on every rank.
  for (size_t i = 0; i < 5; ++i) red.mark_grad_ready(i, after[i]);
  red.finalize_backward();
}

// mark_grad_ready from several threads at once (engines run backward on
// worker threads): 4 threads mark a quarter of the gradients each, in a
// different order every iteration; the tsan build runs this.
TEST(Reducer, MarkGradReadyFromFourThreadsAtOnce) {
  const int n = comm().size(), r = comm().rank();
  constexpr size_t kParams = 24;
  constexpr int kIterations = 40;
  for (bool view : {false, true}) {
    std::vector<std::vector<float>> values(kParams), grads(kParams);
    std::vector<Parameter> ps;
    for (size_t i = 0; i < kParams; ++i) {
      values[i].assign(3 + 5 * i, 0.0f);
      grads[i].assign(values[i].size(), 0.0f);
      ps.push_back({view_of(values[i].data(), values[i].size()),
                    view ? TensorView{} : view_of(grads[i].data(), grads[i].size())});
    }
    ReducerOptions opt;
    opt.gradient_as_bucket_view = view;
    opt.first_bucket_bytes = 64;
    opt.bucket_bytes = 256;
    Reducer red(comm(), ps, opt);
    double worst = 0;
    for (int it = 0; it < kIterations; ++it) {
      std::vector<float*> g(kParams);
      for (size_t i = 0; i < kParams; ++i) {
        g[i] = static_cast<float*>(red.grad_view(i).data);
        for (size_t k = 0; k < values[i].size(); ++k)
          g[i][k] = static_cast<float>((r + 1) * (i + 1) + it + k % 5);
      }
      red.prepare_for_backward();
      std::vector<std::thread> threads;
      for (int t = 0; t < 4; ++t)
        threads.emplace_back([&, t] {
          std::vector<size_t> mine;
          for (size_t i = t; i < kParams; i += 4) mine.push_back(i);
          std::mt19937 rng(static_cast<unsigned>(it * 4 + t));
          std::shuffle(mine.begin(), mine.end(), rng);
          for (size_t i : mine) red.mark_grad_ready(i);
        });
      for (auto& t : threads) t.join();
      red.finalize_backward();
      for (size_t i = 0; i < kParams; ++i) {
        const float* avg = static_cast<const float*>(red.grad_view(i).data);
        for (size_t k = 0; k < values[i].size(); ++k) {
          double want = (n + 1.0) / 2.0 * (i + 1.0) + it + static_cast<double>(k % 5);
          worst = std::max(worst, std::abs(avg[k] - want) / want);
        }
      }
    }
    EXPECT_LE(worst, 1e-6) << (view ? "bucket view" : "copy");
  }
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
  EXPECT_NE(message([&] { red.mark_grad_ready(5); }).find("there are 2 parameters"),
            std::string::npos);
  std::string early = message([&] { red.finalize_backward(); });
  EXPECT_NE(early.find("parameters 0"), std::string::npos) << early;
  EXPECT_NE(early.find("find_unused_parameters"), std::string::npos) << early;
  // Nothing was launched (the one bucket still waited for parameter 0), so
  // the ranks are still in step for whatever comes next.
  comm().barrier().wait();
}

// What a test's reducer step ends with: the error's text, or "".
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A weight shared by two layers, or a checkpointed segment recomputed:
// gradient "a" arrives twice per backward. Its bucket must carry the sum of
// both arrivals, sent once; on a later step one more arrival after the
// bucket left is an error naming it, reported when every rank has finished
// the step's collectives (the next step is then in step and right).
TEST(Reducer, AGradientThatArrivesTwiceIsSentOnceAfterItsLastArrival) {
  const int n = comm().size(), r = comm().rank();
  for (bool view : {false, true}) {
    std::vector<float> a(8, 0.0f), b(8, 0.0f), ga(8), gb(8);
    ReducerOptions opt;
    opt.first_bucket_bytes = opt.bucket_bytes = 8 * sizeof(float);  // a bucket each
    opt.gradient_as_bucket_view = view;
    opt.param_names = {"a", "b"};
    Reducer red(comm(),
                {{view_of(a.data(), 8), view_of(ga.data(), 8)},
                 {view_of(b.data(), 8), view_of(gb.data(), 8)}},
                opt);
    auto grad = [&](size_t i) { return static_cast<float*>(red.grad_view(i).data); };
    // `late`: the arrivals past the second come after a's bucket has
    // left. With bucket views their writes would race with its all-reduce
    // (the misuse the error reports); the test marks them without writing.
    auto step = [&](int a_arrivals, int it, bool late = false) {
      red.prepare_for_backward();
      std::fill_n(grad(0), 8, 0.0f);
      std::fill_n(grad(1), 8, 0.0f);
      for (int k = 0; k < 8; ++k) grad(1)[k] = static_cast<float>(r + k + it);
      red.mark_grad_ready(1);
      for (int f = 0; f < a_arrivals; ++f) {
        if (!(late && view && f >= 2))
          for (int k = 0; k < 8; ++k) grad(0)[k] += static_cast<float>((r + 1) * (f + 1) + it);
        red.mark_grad_ready(0);
      }
      return error_of([&] { red.finalize_backward(); });
    };
    auto expect_average = [&](int a_arrivals, int it, const char* when) {
      double want_a = 0, want_b = 0;
      for (int q = 0; q < n; ++q) {
        for (int f = 0; f < a_arrivals; ++f) want_a += (q + 1) * (f + 1) + it;
        want_b += q + it;
      }
      for (int k = 0; k < 8; ++k) {
        EXPECT_DOUBLE_EQ(grad(0)[k], want_a / n) << when << (view ? " (view)" : " (copy)");
        EXPECT_DOUBLE_EQ(grad(1)[k], (want_b + n * k) / n) << when;
      }
    };
    for (int it = 0; it < 3; ++it) {  // the first learns, the others send early
      EXPECT_EQ(step(2, it), "") << "step " << it;
      expect_average(2, it, "twice");
    }
    std::string late = step(3, 3, true);
    EXPECT_NE(late.find("parameters a received a gradient after"), std::string::npos) << late;
    EXPECT_NE(late.find("rank " + std::to_string(r)), std::string::npos) << late;
    // Learnt: three arrivals from now on, sent after the third.
    EXPECT_EQ(step(3, 4), "");
    expect_average(3, 4, "three times");
    EXPECT_EQ(red.iterations(), 5u);
  }
}

// find_unused_parameters with no mask given: rank 0 uses every parameter,
// the others not "c"; no rank uses "b". The ranks exchange which they used:
// "c" gets rank 0's gradient divided by the world, even where this rank had
// no buffer for it; "b" is left as it was (copy mode).
TEST(Reducer, UnusedParametersAreFoundAndExchangedAtFinalize) {
  const int n = comm().size(), r = comm().rank();
  std::vector<float> a(4, 0.0f), b(4, 0.0f), c(4, 0.0f), ga(4), gb(4, 7.0f), gc(4, 9.0f);
  ReducerOptions opt;
  opt.find_unused_parameters = true;
  opt.param_names = {"a", "b", "c"};
  Reducer red(comm(),
              {{view_of(a.data(), 4), view_of(ga.data(), 4)},
               {view_of(b.data(), 4), view_of(gb.data(), 4)},
               {view_of(c.data(), 4), {}}},
              opt);
  for (int it = 0; it < 2; ++it) {
    red.prepare_for_backward();
    std::fill(ga.begin(), ga.end(), static_cast<float>(r + 1));
    red.mark_grad_ready(0);
    std::vector<float> mine(4, 3.0f);
    if (r == 0) red.mark_grad_ready(2, view_of(mine.data(), 4));
    red.finalize_backward();
    EXPECT_EQ(red.param_use(0), ParamUse::here);
    EXPECT_EQ(red.param_use(1), ParamUse::nowhere);
    EXPECT_EQ(red.param_use(2), n == 1 || r == 0 ? ParamUse::here : ParamUse::elsewhere);
    auto avg_c = static_cast<const float*>(red.bucket_grad(2).data);
    for (int k = 0; k < 4; ++k) {
      EXPECT_FLOAT_EQ(ga[k], (n + 1) / 2.0f);
      EXPECT_EQ(gb[k], 7.0f) << "a gradient no rank used is left as it was";
      EXPECT_FLOAT_EQ(avg_c[k], 3.0f / n);
      if (r == 0) {
        EXPECT_FLOAT_EQ(mine[k], 3.0f / n);
      }
    }
  }
}

// static_graph: the first step's unused set is kept; a gradient for one of
// its parameters later is an error saying why.
TEST(Reducer, StaticGraphKeepsTheFirstStepsUnusedSet) {
  std::vector<float> a(4, 0.0f), b(4, 0.0f), ga(4), gb(4);
  ReducerOptions opt;
  opt.static_graph = true;
  opt.param_names = {"a", "b"};
  Reducer red(comm(),
              {{view_of(a.data(), 4), view_of(ga.data(), 4)},
               {view_of(b.data(), 4), view_of(gb.data(), 4)}},
              opt);
  for (int it = 0; it < 2; ++it) {
    red.prepare_for_backward();
    red.mark_grad_ready(0);
    red.finalize_backward();
    EXPECT_EQ(red.param_use(1), ParamUse::nowhere);
  }
  red.prepare_for_backward();
  std::string e = error_of([&] { red.mark_grad_ready(1); });
  EXPECT_NE(e.find("parameter b arrived"), std::string::npos) << e;
  EXPECT_NE(e.find("static_graph"), std::string::npos) << e;
  red.mark_grad_ready(0);
  red.finalize_backward();
}

// A gradient that arrived only in no_sync micro-batches is sent by the
// synchronising step, without find_unused_parameters.
TEST(Reducer, AGradientAccumulatedOnlyUnderNoSyncIsSent) {
  const int n = comm().size(), r = comm().rank();
  std::vector<float> a(4, 0.0f), b(4, 0.0f), ga(4, 0.0f), gb(4, 0.0f);
  Reducer red(comm(),
              {{view_of(a.data(), 4), view_of(ga.data(), 4)},
               {view_of(b.data(), 4), view_of(gb.data(), 4)}},
              {});
  red.set_no_sync(true);
  red.prepare_for_backward();
  std::fill(gb.begin(), gb.end(), static_cast<float>(r + 1));
  red.mark_grad_ready(1);
  red.finalize_backward();
  red.set_no_sync(false);
  red.prepare_for_backward();
  std::fill(ga.begin(), ga.end(), 1.0f);
  red.mark_grad_ready(0);
  red.finalize_backward();
  for (int k = 0; k < 4; ++k) {
    EXPECT_FLOAT_EQ(ga[k], 1.0f);
    EXPECT_FLOAT_EQ(gb[k], (n + 1) / 2.0f);
  }
}

// Uneven inputs: the last rank has run out of data and shadows the others'
// step with zeros; their average is over the whole world, and its own
// gradients are left alone.
TEST(Reducer, AJoinedRankShadowsTheStepWithZeros) {
  const int n = comm().size(), r = comm().rank();
  for (bool view : {false, true}) {
    std::vector<float> a(6, 0.0f), ga(6, 0.0f);
    ReducerOptions opt;
    opt.gradient_as_bucket_view = view;
    opt.find_unused_parameters = true;  // the used-mask exchange must match too
    Reducer red(comm(), {{view_of(a.data(), 6), view_of(ga.data(), 6)}}, opt);
    float* g = static_cast<float*>(red.grad_view(0).data);
    for (int it = 0; it < 2; ++it) {
      if (r == n - 1 && n > 1) {
        std::fill_n(g, 6, 5.0f);
        red.join_step();
        if (!view) {
          for (int k = 0; k < 6; ++k) EXPECT_EQ(g[k], 5.0f);
        }
        continue;
      }
      red.prepare_for_backward();
      std::fill_n(g, 6, static_cast<float>(r + 1));
      red.mark_grad_ready(0);
      red.finalize_backward();
      g = static_cast<float*>(red.grad_view(0).data);
      const int trained = n > 1 ? n - 1 : 1;
      for (int k = 0; k < 6; ++k)
        EXPECT_FLOAT_EQ(g[k], trained * (trained + 1) / 2.0f / n) << (view ? "view" : "copy");
    }
  }
}

// Options that decide an iteration's collectives must be every rank's.
// COLLIE_CHECK_NONFINITE on this backend: a NaN or Inf in one rank's
// gradient is named with that rank, the parameter and the element, whichever
// part of the reduction reads it. Three buckets: a tiny one (shm's one-line
// path, tcp's recursive doubling), 16 KiB (shm's one step) and 1 MiB (shm's
// direct reads, shared buffers or segment rounds; tcp's ring), poisoned at
// both ends of the large one (the first and the last rank's slice, the
// first and the last ring segment). The expected message is built from
// where this test put the values; the averages stay NaN and Inf, and the
// next iteration goes on in step.
TEST(Reducer, NonfiniteGradientsAreNamedWhereverTheReductionReadsThem) {
  if (fake_cuda()) GTEST_SKIP() << "the search reads host memory";
  Communicator& c = comm();
  const int n = c.size(), r = c.rank(), last = n - 1;
  const std::vector<std::string> names = {"big", "mid", "small_a", "small_b"};
  const std::vector<size_t> sizes = {size_t{1} << 18, 4096, 5, 3};
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = INFINITY;
  // Rank 0's and the last rank's poison (one rank: all of it on rank 0).
  auto poison = [&](int rank, const std::function<float*(size_t)>& g) {
    if (rank == 0) g(2)[3] = inf;
    if (rank == last) {
      g(0)[0] = nan;
      g(0)[sizes[0] - 1] = -inf;
      g(1)[100] = inf;
    }
  };
  const std::string want =
      n == 1 ? "rank 0: parameter big has NaN at element 0 (4 non-finite elements in 3 "
               "parameters)"
             : "rank 0: parameter small_a has +Inf at element 3 (1 non-finite element in 1 "
               "parameter); rank " +
                   std::to_string(last) +
                   ": parameter big has NaN at element 0 (3 non-finite elements in 2 parameters)";
  for (bool view : {false, true}) {
    SCOPED_TRACE(view ? "bucket views" : "copy mode");
    std::vector<std::vector<float>> w, g;
    std::vector<Parameter> ps;
    for (size_t i = 0; i < sizes.size(); ++i) {
      w.emplace_back(sizes[i], 1.0f);
      g.emplace_back(sizes[i], 0.0f);
    }
    for (size_t i = 0; i < sizes.size(); ++i)
      ps.push_back({view_of(w[i].data(), w[i].size()), view_of(g[i].data(), g[i].size())});
    ReducerOptions opt;
    opt.param_names = names;
    opt.check_nonfinite = 1;
    opt.gradient_as_bucket_view = view;
    opt.first_bucket_bytes = 16;   // small_b and small_a (a bucket closes at its cap)
    opt.bucket_bytes = 16 * 1024;  // mid; big alone
    opt.rebuild_buckets = false;
    Reducer red(c, ps, opt);
    ASSERT_EQ(red.plan().buckets().size(), 3u);
    auto grad = [&](size_t i) {
      return view ? static_cast<float*>(red.grad_view(i).data) : g[i].data();
    };
    for (int it = 0; it < 3; ++it) {
      red.prepare_for_backward();
      for (size_t i = 0; i < sizes.size(); ++i)
        for (size_t k = 0; k < sizes[i]; ++k)
          grad(i)[k] = 0.001f * static_cast<float>((r + 1) * ((k + i + it) % 5));
      if (it == 1) poison(r, grad);
      for (size_t i = sizes.size(); i-- > 0;) red.mark_grad_ready(i);
      const std::string e = error_of([&] { red.finalize_backward(); });
      if (it != 1) {
        EXPECT_EQ(e, "") << "iteration " << it;
        continue;
      }
      EXPECT_NE(e.find("non-finite gradients at iteration 1, found before averaging: " + want +
                       "; so their averages"),
                std::string::npos)
          << e << "\nwanted: " << want;
      EXPECT_TRUE(std::isnan(grad(0)[0]) && std::isinf(grad(0)[sizes[0] - 1]) &&
                  std::isinf(grad(2)[3]))
          << "the averages were changed";
    }
  }
}

TEST(Reducer, OptionsThatDifferAcrossRanksAreAnErrorNamingTheRank) {
  if (comm().size() < 2) GTEST_SKIP() << "needs two ranks";
  std::vector<float> a(4, 0.0f), ga(4);
  ReducerOptions opt;
  opt.find_unused_parameters = comm().rank() == 1;
  std::string e = error_of([&] {
    Reducer red(comm(), {{view_of(a.data(), 4), view_of(ga.data(), 4)}}, opt);
  });
  EXPECT_NE(e.find("rank 1 builds its reducer with find_unused_parameters=true"), std::string::npos)
      << e;
}

}  // namespace
}  // namespace collie
