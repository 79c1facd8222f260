// tests/test_powersgd_cuda.cc: PowerSGD on CUDA buckets, with a fake device
// and a fake cuBLAS (tests/fake_device.h) in every process, so that CI runs
// the CUDA path: its arithmetic (CudaLowRankMath, through cuda::BlasApi),
// its state in device memory, and its order on the caller's stream.
//
//   CudaLowRankMath.*: against CpuLowRankMath on random matrices (one
//     process, no communicator).
//   PowerSgdOnFakeCuda.*: under collie-run, the hook on CUDA buckets against
//     the CPU hook on the same data, and a resumed checkpoint against an
//     uninterrupted run (tests/powersgd_device_check.h; test_gpu runs the
//     same checks on a real GPU). The CUDA all-reduces are staged
//     (COLLIE_CUDA_BACKEND=staged).
//   CompressOnFakeCuda.*: under collie-run too, the fp16/bf16 hooks'
//     steps on the bucket's stream and device, whichever thread runs them.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <random>
#include <thread>

#include "base/blas_api.h"
#include "base/cuda_api.h"
#include "base/reduce.h"
#include "collie/comm.h"
#include "fake_device.h"
#include "hooks/comm_hook.h"
#include "hooks/powersgd.h"
#include "hooks/stream_scope.h"
#include "mp_test.h"
#include "powersgd_device_check.h"
#include "reducer/reducer.h"

namespace collie {
namespace {

struct Fakes {
  std::shared_ptr<fake::FakeCuda> cuda;
  std::shared_ptr<fake::FakeBlas> blas;
};

// Installed once, before the communicator is made (which stages CUDA
// tensors through the installed device).
const Fakes& fakes() {
  static const Fakes f = [] {
    Fakes made;
    made.cuda = std::make_shared<fake::FakeCuda>(2);
    made.blas = std::make_shared<fake::FakeBlas>(made.cuda);
    cuda::set_device_api(made.cuda);
    cuda::set_blas_api(made.blas);
    return made;
  }();
  return f;
}

Communicator& comm() {
  fakes();
  return testing::world();
}

// The caller's stream: one of the fake's own, not the legacy default, so
// that work the hook queued elsewhere would race with the test's copies.
class OnStream {
 public:
  OnStream() : s_(fakes().cuda->create_stream()) { set_cuda_stream(s_); }
  ~OnStream() {
    set_cuda_stream(nullptr);
    fakes().cuda->destroy_stream(s_);
  }
  cuda::Stream get() const { return s_; }

 private:
  cuda::Stream s_;
};

// --- CudaLowRankMath against CpuLowRankMath -------------------------------------

// A matrix on the host and its copy on the fake device.
struct Twin {
  Twin(DType t, size_t n) : t(t), n(n), host(n * dtype_size(t)) {
    dev = fakes().cuda->device_alloc(host.size());
  }
  ~Twin() { fakes().cuda->device_free(dev); }
  Twin(const Twin&) = delete;
  Twin& operator=(const Twin&) = delete;
  TensorView h() { return TensorView{host.data(), t, n, Device::cpu()}; }
  TensorView d() { return TensorView{dev, t, n, Device::cuda(0)}; }
  double at(size_t i) const {
    return t == DType::f32 ? reinterpret_cast<const float*>(host.data())[i]
                           : reinterpret_cast<const double*>(host.data())[i];
  }
  void set(size_t i, double v) {
    if (t == DType::f32)
      reinterpret_cast<float*>(host.data())[i] = static_cast<float>(v);
    else
      reinterpret_cast<double*>(host.data())[i] = v;
  }
  void random(uint64_t seed) {
    std::mt19937_64 g(seed);
    std::normal_distribution<double> nd;
    for (size_t i = 0; i < n; ++i) set(i, nd(g));
  }
  // Waits: the copy reads `host` when the stream gets to it, and the CPU
  // twin then computes in place there.
  void upload() {
    cuda::copy(dev, host.data(), host.size(), Device::cuda(0));
    cuda::wait_queued(Device::cuda(0));
  }
  std::vector<double> download() const {
    std::vector<uint8_t> b(host.size());
    cuda::copy(b.data(), dev, b.size(), Device::cuda(0));
    cuda::wait_queued(Device::cuda(0));
    std::vector<double> v(n);
    for (size_t i = 0; i < n; ++i)
      v[i] = t == DType::f32 ? reinterpret_cast<const float*>(b.data())[i]
                             : reinterpret_cast<const double*>(b.data())[i];
    return v;
  }
  DType t;
  size_t n;
  std::vector<uint8_t> host;
  void* dev;
};

// The device's result against the host's, relative to the largest value.
void expect_close(const Twin& x, double tol, const std::string& what) {
  auto got = x.download();
  double worst = 0, scale = 0;
  for (size_t i = 0; i < x.n; ++i) {
    ASSERT_FALSE(std::isnan(got[i])) << what << " element " << i;
    worst = std::max(worst, std::abs(got[i] - x.at(i)));
    scale = std::max(scale, std::abs(x.at(i)));
  }
  EXPECT_LE(worst, tol * std::max(scale, 1.0)) << what;
}

double tol_of(DType t) {
  return t == DType::f32 ? 1e-5 : 1e-12;
}

TEST(CudaLowRankMath, GemmMatchesTheCpuInEveryTransposeCombination) {
  OnStream on;
  LowRankMath& cpu = cpu_low_rank_math();
  LowRankMath& gpu = low_rank_math_for(Device::cuda(0));
  for (DType t : {DType::f32, DType::f64}) {
    // m, n, k all different, so that a swapped dimension or leading
    // dimension reads the wrong elements; n = 1 is the CPU's gemv path.
    for (auto [m, n, k] : {std::array<size_t, 3>{7, 5, 4}, {6, 1, 9}, {1, 8, 3}}) {
      for (bool ta : {false, true}) {
        for (bool tb : {false, true}) {
          Twin a(t, m * k), b(t, k * n), c(t, m * n);
          a.random(1 + m + ta);
          b.random(2 + n + tb);
          c.random(3);  // overwritten: gemm's beta is 0
          a.upload();
          b.upload();
          c.upload();
          cpu.gemm(ta, tb, m, n, k, a.h(), b.h(), c.h());
          gpu.gemm(ta, tb, m, n, k, a.d(), b.d(), c.d());
          expect_close(c, tol_of(t),
                       std::string(to_string(t)) + " gemm ta=" + std::to_string(ta) +
                           " tb=" + std::to_string(tb) + " " + std::to_string(m) + "x" +
                           std::to_string(n) + "x" + std::to_string(k));
        }
      }
    }
  }
}

TEST(CudaLowRankMath, OrthogonalizeMatchesTheCpuAndKeepsAZeroColumnZero) {
  OnStream on;
  LowRankMath& cpu = cpu_low_rank_math();
  LowRankMath& gpu = low_rank_math_for(Device::cuda(0));
  const size_t rows = 11, cols = 4;
  for (DType t : {DType::f32, DType::f64}) {
    for (double eps : {0.0, 1e-3}) {
      Twin x(t, rows * cols);
      x.random(17);
      for (size_t r = 0; r < rows; ++r) x.set(r * cols + 2, 0.0);  // a zero column
      x.upload();
      cpu.orthogonalize(x.h(), rows, cols, eps);
      gpu.orthogonalize(x.d(), rows, cols, eps);
      const std::string what =
          std::string(to_string(t)) + " orthogonalize eps=" + std::to_string(eps);
      expect_close(x, tol_of(t), what);
      auto got = x.download();
      for (size_t r = 0; r < rows; ++r) EXPECT_EQ(got[r * cols + 2], 0.0) << what << " row " << r;
      // With eps = 0 the other columns come back of unit length.
      if (eps == 0) {
        double norm2 = 0;
        for (size_t r = 0; r < rows; ++r) norm2 += got[r * cols] * got[r * cols];
        EXPECT_NEAR(norm2, 1.0, tol_of(t) * 10) << what;
      }
    }
  }
}

TEST(CudaLowRankMath, AxpbyMatchesTheCpuAndIgnoresNanWhenBIsZero) {
  OnStream on;
  LowRankMath& cpu = cpu_low_rank_math();
  LowRankMath& gpu = low_rank_math_for(Device::cuda(0));
  const size_t n = 33;
  for (DType t : {DType::f32, DType::f64}) {
    for (auto [a, b] : {std::pair{1.0, 1.0}, {0.5, -2.0}, {-1.0, 1.0}, {0.25, 0.0}, {0.0, 0.5}}) {
      Twin x(t, n), y(t, n);
      x.random(5);
      y.random(6);
      if (b == 0) y.set(3, std::numeric_limits<double>::quiet_NaN());
      x.upload();
      y.upload();
      cpu.axpby(a, x.h(), b, y.h());
      gpu.axpby(a, x.d(), b, y.d());
      expect_close(
          y, tol_of(t),
          std::string(to_string(t)) + " axpby a=" + std::to_string(a) + " b=" + std::to_string(b));
    }
    // x and y the same memory, as the hook divides Q by the world size.
    Twin q(t, n);
    q.random(8);
    q.upload();
    cpu.axpby(0.0, q.h(), 1.0 / 3, q.h());
    gpu.axpby(0.0, q.d(), 1.0 / 3, q.d());
    expect_close(q, tol_of(t), std::string(to_string(t)) + " axpby in place");
  }
}

TEST(CudaLowRankMath, FillNormalDrawsTheCpusValues) {
  OnStream on;
  for (DType t : {DType::f32, DType::f64}) {
    Twin x(t, 50);
    cpu_low_rank_math().fill_normal(x.h(), 99);
    low_rank_math_for(Device::cuda(0)).fill_normal(x.d(), 99);
    auto got = x.download();
    for (size_t i = 0; i < x.n; ++i) ASSERT_EQ(got[i], x.at(i)) << to_string(t) << " " << i;
  }
}

TEST(CudaLowRankMath, EachThreadHasItsOwnHandleBoundToItsStream) {
  const int before = fakes().blas->live_handles;
  std::thread([] {
    OnStream on;
    Twin x(DType::f32, 8), y(DType::f32, 8);
    x.random(1);
    x.upload();
    low_rank_math_for(Device::cuda(0)).axpby(2.0, x.d(), 0.0, y.d());
    cpu_low_rank_math().axpby(2.0, x.h(), 0.0, y.h());
    expect_close(y, 1e-6, "axpby on another thread");
  }).join();
  // The thread's handle went with it.
  EXPECT_EQ(fakes().blas->live_handles, before);
}

// --- the hook on CUDA buckets, over real processes ------------------------------

// The CUDA hook's results within float rounding of the CPU hook's: the
// same Q draws, the same steps; they differ where the fake cuBLAS sums in
// another order than OpenBLAS and rounds norms and dot products to the
// type (the CPU Gram-Schmidt keeps them in f64), and error feedback carries
// that on. Measured over 7 steps at 2 and 3 ranks, tcp and shm: at most
// 9.4e-7 (f32) and 4.5e-15 (f64) of the largest value; ten and twenty
// times that are allowed.
double tol_for(DType t) {
  return t == DType::f32 ? 1e-5 : 1e-13;
}

class PowerSgdOnFakeCuda : public ::testing::TestWithParam<std::string> {};

TEST_P(PowerSgdOnFakeCuda, MatchesTheCpuHookStepByStep) {
  if (!testing::have_powersgd()) GTEST_SKIP() << "this build has no BLAS";
  OnStream on;
  const int live = fakes().cuda->live_allocations;
  for (DType t : {DType::f32, DType::f64}) {
    const double worst = testing::cuda_powersgd_against_cpu(comm(), GetParam(), t, 7, tol_for(t));
    if (comm().rank() == 0)
      std::printf("%s %s: worst relative distance from the CPU hook %.3g\n", GetParam().c_str(),
                  std::string(to_string(t)).c_str(), worst);
  }
  // The hooks' device state went with them.
  EXPECT_EQ(fakes().cuda->live_allocations, live);
}

TEST_P(PowerSgdOnFakeCuda, AResumedCheckpointEqualsAnUninterruptedRun) {
  if (!testing::have_powersgd()) GTEST_SKIP() << "this build has no BLAS";
  OnStream on;
  for (DType t : {DType::f32, DType::f64})
    testing::cuda_powersgd_resume_matches(comm(), GetParam(), t, 7, 4);
}

INSTANTIATE_TEST_SUITE_P(
    Specs, PowerSgdOnFakeCuda,
    ::testing::Values("powersgd:rank=2,start_iter=2", "batched_powersgd:rank=2,start_iter=2",
                      "powersgd:rank=1,start_iter=2,orthogonalization_epsilon=1e-4",
                      "powersgd:rank=2,start_iter=0,warm_start=0,error_feedback=0"));

// Every step of every bucket's chain, whichever thread runs it, queues its
// work on the stream the bucket was handed over on, none on the legacy
// default stream (which a program's other work may sit behind).
TEST(PowerSgdOnFakeCudaStreams, EveryStepIsQueuedOnTheCallersStream) {
  if (!testing::have_powersgd()) GTEST_SKIP() << "this build has no BLAS";
  fake::Stream& legacy = fakes().cuda->stream(nullptr);
  OnStream on;
  const cuda::Stream mine = on.get();
  for (const char* spec :
       {"powersgd:rank=2,start_iter=2", "batched_powersgd:rank=2,start_iter=2"}) {
    auto hook = make_comm_hook(spec);
    auto dev = testing::device_check_make(DType::f32, Device::cuda(0));
    for (int step = 0; step < 4; ++step) {
      const uint64_t on_legacy = legacy.enqueued(), on_mine = fakes().cuda->stream(mine).enqueued();
      testing::device_check_step(comm(), *hook, dev, DType::f32, step);
      EXPECT_EQ(legacy.enqueued(), on_legacy) << spec << " step " << step;
      EXPECT_GT(fakes().cuda->stream(mine).enqueued(), on_mine) << spec << " step " << step;
    }
  }
}

// The compression hooks' last step, decompressing the reduced bucket, runs
// on the communicator's continuation thread, which starts on device 0 with
// the legacy default stream. It must run on the stream the bucket was
// handed over on, and on the bucket's device, as the first step did on the
// caller's thread. A HookMath over the fake device records where each call
// ran, and computes on the host once that stream has reached the call.
class RecordingHookMath final : public HookMath {
 public:
  struct Call {
    bool decompress;
    void* stream;
    int device;
  };
  void compress(TensorView src, TensorView dst, int divisor) override {
    run(false, src, dst, divisor);
  }
  void decompress(TensorView src, TensorView dst) override { run(true, src, dst, 1); }
  std::vector<Call> calls() {
    std::lock_guard lk(mu_);
    return calls_;
  }

 private:
  void run(bool decompress, TensorView src, TensorView dst, int divisor) {
    {
      std::lock_guard lk(mu_);
      calls_.push_back({decompress, cuda_stream(), fakes().cuda->current_device()});
    }
    fakes().cuda->synchronize(cuda_stream());
    kernels::convert(src.dtype, src.data, dst.dtype, dst.data, src.numel, divisor);
  }
  std::mutex mu_;
  std::vector<Call> calls_;
};

TEST(CompressOnFakeCuda, DecompressRunsOnTheBucketsStreamAndDevice) {
  Communicator& c = comm();
  RecordingHookMath math;
  // Installed, and device 1 current, until the test ends however it ends.
  struct Installed {
    explicit Installed(HookMath& m) {
      set_cuda_hook_math(&m);
      fakes().cuda->set_device(1);
    }
    ~Installed() {
      fakes().cuda->set_device(0);
      set_cuda_hook_math(nullptr);
    }
  } installed(math);
  {
    OnStream on;  // a stream of device 1
    const size_t n = 37;
    const int ranks = c.size(), r = c.rank();
    for (const char* spec : {"fp16", "bf16_wrap:allreduce"}) {
      // Multiples of 0.25 up to 7 x ranks: exact in f16 and bf16.
      std::vector<float> host(n);
      for (size_t i = 0; i < n; ++i) host[i] = 0.25f * static_cast<float>((r + 1) * (i % 8));
      void* dev = fakes().cuda->device_alloc(n * sizeof(float));
      cuda::copy(dev, host.data(), n * sizeof(float), Device::cuda(1));
      GradBucket b;
      b.buffer = TensorView{dev, DType::f32, n, Device::cuda(1)};
      b.grads = {b.buffer};
      b.params = {b.buffer};
      b.rows = {0};
      b.is_last = true;
      auto hook = make_comm_hook(spec);
      const size_t before = math.calls().size();
      hook->run(c, b).wait();
      std::vector<float> got(n);
      cuda::copy(got.data(), dev, n * sizeof(float), Device::cuda(1));
      cuda::wait_queued(Device::cuda(1));
      fakes().cuda->device_free(dev);

      auto calls = math.calls();
      int decompressed = 0;
      for (size_t k = before; k < calls.size(); ++k) {
        EXPECT_EQ(calls[k].stream, on.get())
            << spec << (calls[k].decompress ? " decompress" : " compress");
        EXPECT_EQ(calls[k].device, 1)
            << spec << (calls[k].decompress ? " decompress" : " compress");
        decompressed += calls[k].decompress;
      }
      EXPECT_EQ(decompressed, 1) << spec;
      // The average over ranks, within a 16-bit rounding.
      for (size_t i = 0; i < n; ++i) {
        const double want = 0.25 * static_cast<double>(i % 8) * (ranks + 1) / 2.0;
        EXPECT_NEAR(got[i], want, 1e-2 * std::max(want, 1.0)) << spec << " element " << i;
      }
    }
  }
}

// A hook step that runs on the caller's thread (its Work had ended before
// then() was called) must leave that thread's device and stream as they
// were: StreamScope puts both back.
TEST(CompressOnFakeCuda, AStepsScopePutsTheThreadsDeviceAndStreamBack) {
  comm();
  fakes().cuda->set_device(1);
  cuda::Stream s1 = fakes().cuda->create_stream();
  fakes().cuda->set_device(0);
  void* before = cuda_stream();
  {
    StreamScope on(s1, Device::cuda(1));
    EXPECT_EQ(fakes().cuda->current_device(), 1);
    EXPECT_EQ(cuda_stream(), s1);
  }
  EXPECT_EQ(fakes().cuda->current_device(), 0);
  EXPECT_EQ(cuda_stream(), before);
  fakes().cuda->destroy_stream(s1);
}

// Through the reducer: parameters, gradients and buckets on the fake
// device (the reducer copies gradients into buckets and results back on the
// caller's stream, and rebuilds its buckets after the first iteration)
// against the same model on the host, several buckets, rows given per
// parameter, PowerSGD from the third iteration.
template <typename T>
void reducer_on_device_matches_host(const std::string& spec) {
  const std::vector<size_t> sizes = {120, 5, 72, 12}, rows = {12, 0, 9, 3};
  struct Side {
    std::vector<std::vector<T>> values, grads;  // host memory (the CPU side's own)
    std::vector<void*> dev_values, dev_grads;   // the device side's
    std::unique_ptr<Reducer> red;
  };
  auto make = [&](bool on_device) {
    Side side;
    std::vector<Parameter> ps;
    for (size_t i = 0; i < sizes.size(); ++i) {
      side.values.emplace_back(sizes[i], T(0));
      side.grads.emplace_back(sizes[i], T(0));
      TensorView v = view_of(side.values[i].data(), sizes[i]);
      TensorView g = view_of(side.grads[i].data(), sizes[i]);
      if (on_device) {
        side.dev_values.push_back(fakes().cuda->device_alloc(v.nbytes()));
        side.dev_grads.push_back(fakes().cuda->device_alloc(g.nbytes()));
        cuda::zero(side.dev_values[i], v.nbytes(), Device::cuda(0));
        v = TensorView{side.dev_values[i], v.dtype, v.numel, Device::cuda(0)};
        g = TensorView{side.dev_grads[i], g.dtype, g.numel, Device::cuda(0)};
      }
      ps.push_back({v, g, rows[i]});
    }
    cuda::wait_queued(Device::cuda(0));
    ReducerOptions opt;
    opt.comm_hook = spec;
    opt.first_bucket_bytes = 80 * sizeof(T);  // three or four buckets
    opt.bucket_bytes = 100 * sizeof(T);
    side.red = std::make_unique<Reducer>(comm(), ps, opt);
    return side;
  };
  Side host = make(false), dev = make(true);
  const int me = comm().rank();
  for (int step = 0; step < 6; ++step) {
    for (Side* side : {&host, &dev}) {
      for (size_t i = 0; i < sizes.size(); ++i) {
        std::mt19937_64 g(100 * step + 10 * me + i);
        std::normal_distribution<double> nd;
        for (size_t k = 0; k < sizes[i]; ++k)
          side->grads[i][k] = static_cast<T>(std::sin(0.3 * k + i) + 0.2 * nd(g));
      }
      side->red->prepare_for_backward();
      for (size_t i = sizes.size(); i-- > 0;) {
        if (side == &dev)
          cuda::copy(dev.dev_grads[i], dev.grads[i].data(), sizes[i] * sizeof(T), Device::cuda(0));
        side->red->mark_grad_ready(i);
      }
      side->red->finalize_backward();
    }
    double worst = 0, scale = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      std::vector<T> got(sizes[i]);
      cuda::copy(got.data(), dev.dev_grads[i], got.size() * sizeof(T), Device::cuda(0));
      cuda::wait_queued(Device::cuda(0));
      for (size_t k = 0; k < sizes[i]; ++k) {
        worst = std::max(worst, std::abs(static_cast<double>(got[k] - host.grads[i][k])));
        scale = std::max(scale, std::abs(static_cast<double>(host.grads[i][k])));
      }
    }
    EXPECT_LE(worst, tol_for(DTypeOf<T>::value) * scale) << spec << " step " << step;
  }
  const uint64_t compressed = dev.red->last_stats().hook_bytes;
  EXPECT_LT(compressed, dev.red->last_stats().gradient_bytes) << spec << ": nothing was compressed";
  EXPECT_EQ(compressed, host.red->last_stats().hook_bytes) << spec;
  dev.red.reset();
  for (void* p : dev.dev_values) fakes().cuda->device_free(p);
  for (void* p : dev.dev_grads) fakes().cuda->device_free(p);
}

TEST(PowerSgdOnFakeCudaReducer, TheReducerOnTheDeviceMatchesItOnTheHost) {
  if (!testing::have_powersgd()) GTEST_SKIP() << "this build has no BLAS";
  OnStream on;
  for (const char* spec :
       {"powersgd:rank=2,start_iter=2", "batched_powersgd:rank=2,start_iter=2"}) {
    reducer_on_device_matches_host<float>(spec);
    reducer_on_device_matches_host<double>(spec);
  }
}

// Buckets on the second device, as on a rank whose local_rank is 1: the
// program makes it its thread's current device, and the hook's steps that
// run on collie's threads (which start on device 0) must make it theirs,
// or cuBLAS would run with a handle and stream of another device.
TEST(PowerSgdOnFakeCudaDevices, BucketsOnTheSecondDevice) {
  if (!testing::have_powersgd()) GTEST_SKIP() << "this build has no BLAS";
  struct OnDevice {
    explicit OnDevice(int d) { fakes().cuda->set_device(d); }
    ~OnDevice() { fakes().cuda->set_device(0); }
  } on_device(1);
  OnStream on;  // made on device 1
  for (DType t : {DType::f32, DType::f64})
    testing::cuda_powersgd_against_cpu(comm(), "powersgd:rank=2,start_iter=2", t, 5, tol_for(t),
                                       Device::cuda(1));
}

// A checkpoint saved by the CPU hook is loaded by a hook that then runs on
// CUDA buckets: the state moves to the device and the run goes on as the
// CPU hook's would.
TEST(PowerSgdOnFakeCudaCheckpoint, ACpuCheckpointResumesOnTheDevice) {
  if (!testing::have_powersgd()) GTEST_SKIP() << "this build has no BLAS";
  OnStream on;
  const std::string spec = "powersgd:rank=2,start_iter=2";
  const DType t = DType::f64;
  auto cpu = make_comm_hook(spec);
  auto host = testing::device_check_make(t, Device::cpu());
  for (int step = 0; step < 4; ++step) testing::device_check_step(comm(), *cpu, host, t, step);
  auto moved = make_comm_hook(spec);
  moved->load_state(cpu->save_state());
  auto dev = testing::device_check_make(t, Device::cuda(0));
  for (int step = 4; step < 7; ++step) {
    testing::device_check_step(comm(), *cpu, host, t, step);
    testing::device_check_step(comm(), *moved, dev, t, step);
    EXPECT_LE(testing::device_check_distance(host, dev), tol_for(t)) << "step " << step;
  }
  // And back: the device hook's state saved and loaded on the host again.
  auto back = make_comm_hook(spec);
  back->load_state(moved->save_state());
  EXPECT_EQ(back->save_state(), moved->save_state());
}

}  // namespace
}  // namespace collie
