// The GPU suite: the CUDA kernels against their CPU twins and the nccl
// backend on a real device, at as many ranks as collie-run starts (two
// ranks may share one GPU: each then tells NCCL it is a host of its own
// through NCCL_HOSTID). Every test skips, with the reason, where this build
// has no CUDA or NCCL or the machine has no GPU (CI); the GPU machine runs
// it (`comm/nccl/README.md`, "Measuring").
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "base/blas_api.h"
#include "base/cuda_api.h"
#include "base/reduce.h"
#include "collie/comm.h"
#include "comm/nccl/nccl_api.h"
#include "hooks/comm_hook.h"
#include "kernels/kernels.h"
#include "mp_test.h"
#include "powersgd_device_check.h"

using namespace collie;

namespace {

// The CUDA runtime when a device can be used; else skips the test.
#define REQUIRE_GPU(api)                                                         \
  auto api = cuda::runtime();                                                    \
  if (!api || !gpu::built()) GTEST_SKIP() << "this build of collie has no CUDA"; \
  {                                                                              \
    std::string why;                                                             \
    if (api->device_count(&why) <= 0) GTEST_SKIP() << "no GPU: " << why;         \
  }

// Device memory that frees itself.
struct DeviceBuf {
  DeviceBuf(cuda::Api& api, size_t bytes) : api(api), bytes(bytes), p(api.device_alloc(bytes)) {}
  ~DeviceBuf() { api.device_free(p); }
  void put(const void* host) {
    api.copy_async(p, host, bytes, nullptr);
    api.synchronize(nullptr);
  }
  std::vector<unsigned char> get() {
    std::vector<unsigned char> h(bytes);
    api.copy_async(h.data(), p, bytes, nullptr);
    api.synchronize(nullptr);
    return h;
  }
  cuda::Api& api;
  size_t bytes;
  void* p;
};

std::vector<unsigned char> random_floats(DType t, size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.f, 100.f);
  std::vector<float> f(n);
  for (float& x : f) x = d(gen);
  std::vector<unsigned char> out(n * dtype_size(t));
  kernels::convert(DType::f32, f.data(), t, out.data(), n);
  return out;
}

// Whether this process has mapped cuBLAS.
bool cublas_mapped() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line))
    if (line.find("libcublas") != std::string::npos) return true;
  return false;
}

// cuBLAS is opened at the first use, not at start-up (it costs every
// process 200 MB of mappings), and its entry points resolve: without a GPU
// the first call is cuBLAS's own error, not a failure to load. First in
// this file, before any test can have used it.
TEST(Cublas, IsOpenedAtItsFirstUseAndResolves) {
  auto blas = cuda::blas_runtime();
  if (!blas) GTEST_SKIP() << "this build of collie has no cuBLAS";
  EXPECT_FALSE(cublas_mapped()) << "cuBLAS was loaded before anything used it";
  try {
    blas->destroy_handle(blas->create_handle());
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cublasCreate failed"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(cublas_mapped());
}

TEST(Kernels, ConvertMatchesItsCpuTwinBitForBit) {
  REQUIRE_GPU(api);
  const DType types[] = {DType::f32, DType::f16, DType::bf16, DType::f64};
  for (size_t n : {size_t(1), size_t(7), size_t(1000003)}) {
    for (size_t offset : {size_t(0), size_t(1)}) {  // 1: unaligned, the scalar kernel
      for (DType st : types) {
        for (DType dt : types) {
          for (int divisor : {1, 3}) {
            auto host_in = random_floats(st, n + offset, static_cast<uint32_t>(n + divisor));
            DeviceBuf in(*api, host_in.size()), out(*api, (n + offset) * dtype_size(dt));
            in.put(host_in.data());
            std::vector<unsigned char> poison(out.bytes, 0xFF);
            out.put(poison.data());
            const size_t so = offset * dtype_size(st), d_o = offset * dtype_size(dt);
            gpu::convert(st, static_cast<char*>(in.p) + so, dt, static_cast<char*>(out.p) + d_o, n,
                         divisor, nullptr);
            auto got = out.get();
            std::vector<unsigned char> want(n * dtype_size(dt));
            kernels::convert(st, host_in.data() + so, dt, want.data(), n, divisor);
            ASSERT_EQ(std::memcmp(got.data() + d_o, want.data(), want.size()), 0)
                << to_string(st) << " -> " << to_string(dt) << " / " << divisor << ", n " << n
                << ", offset " << offset;
          }
        }
      }
    }
  }
}

TEST(Kernels, CopyAllPacksAndUnpacksAsItsCpuTwin) {
  REQUIRE_GPU(api);
  std::mt19937 gen(7);
  std::uniform_int_distribution<size_t> size(0, 70000), off(0, 15);
  const size_t pieces = 300;
  std::vector<size_t> sizes(pieces), offs(pieces);
  size_t total = 0;
  for (size_t i = 0; i < pieces; ++i) {
    sizes[i] = size(gen);
    offs[i] = total + off(gen);  // some pieces unaligned
    total = offs[i] + sizes[i];
  }
  std::vector<unsigned char> src(total);
  for (auto& b : src) b = static_cast<unsigned char>(gen());
  DeviceBuf dsrc(*api, total), dbucket(*api, total + 64);
  dsrc.put(src.data());
  std::vector<unsigned char> poison(total + 64, 0xEE);
  dbucket.put(poison.data());
  // Pack: piece i to the bucket at a packed offset; the twin on the host.
  std::vector<gpu::Copy> dev(pieces), host(pieces);
  std::vector<unsigned char> host_bucket(total + 64, 0xEE);
  size_t at = 0;
  for (size_t i = 0; i < pieces; ++i) {
    dev[i] = {static_cast<char*>(dsrc.p) + offs[i], static_cast<char*>(dbucket.p) + at, sizes[i]};
    host[i] = {src.data() + offs[i], host_bucket.data() + at, sizes[i]};
    at += sizes[i];
  }
  DeviceBuf dcopies(*api, pieces * sizeof(gpu::Copy));
  dcopies.put(dev.data());
  gpu::copy_all(static_cast<const gpu::Copy*>(dcopies.p), pieces, nullptr);
  gpu::copy_all_cpu(host.data(), pieces);
  EXPECT_EQ(dbucket.get(), host_bucket);
}

// The communicator on the nccl backend (or on `backend`, a host one that
// sends CUDA tensors to NCCL beside it).
std::unique_ptr<Communicator> nccl_comm(const std::string& backend = "nccl") {
  int devices = 0;
  if (auto api = cuda::runtime()) devices = api->device_count(nullptr);
  const char* lws = std::getenv("LOCAL_WORLD_SIZE");
  const char* rank = std::getenv("RANK");
  // More ranks than GPUs on this host: each rank a host of its own to NCCL.
  if (lws && rank && devices > 0 && std::atoi(lws) > devices)
    setenv("NCCL_HOSTID", (std::string("collie-test-rank-") + rank).c_str(), 1);
  Options o;
  o.backend = backend;
  return connect(o);
}

TEST(NcclOnGpu, EveryCollectiveMatchesASerialReference) {
  REQUIRE_GPU(api);
  if (!nccl::library()) GTEST_SKIP() << "this build of collie has no NCCL";
  auto comm = nccl_comm();
  const int n = comm->size(), r = comm->rank();
  const size_t count = 1 << 20;
  std::vector<float> h(count);
  for (size_t i = 0; i < count; ++i) h[i] = static_cast<float>((i % 13) + r);
  DeviceBuf d(*api, count * sizeof(float));
  d.put(h.data());
  TensorView v{d.p, DType::f32, count, Device::cuda(0)};
  comm->allreduce(v, ReduceOp::sum).wait();
  auto floats = [&] {
    auto b = d.get();
    std::vector<float> f(count);
    std::memcpy(f.data(), b.data(), b.size());
    return f;
  };
  std::vector<float> g = floats();
  for (size_t i = 0; i < count; ++i)
    ASSERT_EQ(g[i], static_cast<float>(n * (i % 13) + n * (n - 1) / 2)) << i;
  // The average of every rank's own values (h again, not the sum above,
  // which is the same on every rank and so its own average).
  d.put(h.data());
  comm->allreduce(v, ReduceOp::avg).wait();
  g = floats();
  for (size_t i = 0; i < count; ++i)
    ASSERT_FLOAT_EQ(g[i], static_cast<float>(n * (i % 13) + n * (n - 1) / 2) / n) << i;
  // all-gather: rank q's block holds q's values.
  d.put(h.data());
  DeviceBuf all(*api, count * sizeof(float) * n);
  comm->allgather(v, {all.p, DType::f32, count * n, Device::cuda(0)}).wait();
  {
    auto b = all.get();
    std::vector<float> f(count * n);
    std::memcpy(f.data(), b.data(), b.size());
    for (int q = 0; q < n; ++q)
      for (size_t i = 0; i < count; i += 997)
        ASSERT_EQ(f[q * count + i], static_cast<float>((i % 13) + q)) << "block " << q << ", " << i;
  }
  // broadcast from the last rank
  comm->broadcast(v, n - 1).wait();
  g = floats();
  for (size_t i = 0; i < count; i += 997) ASSERT_EQ(g[i], static_cast<float>((i % 13) + n - 1));
  comm->barrier().wait();
  if (n > 1) {
    d.put(h.data());
    DeviceBuf peer(*api, 64 * sizeof(float));
    TensorView pv{peer.p, DType::f32, 64, Device::cuda(0)};
    Work s = comm->send(v.slice(0, 64), (r + 1) % n);
    Work q = comm->recv(pv, (r + n - 1) % n);
    wait_all({s, q});
    auto b = peer.get();
    std::vector<float> f(64);
    std::memcpy(f.data(), b.data(), b.size());
    const int from = (r + n - 1) % n;
    for (size_t i = 0; i < 64; ++i) ASSERT_EQ(f[i], static_cast<float>((i % 13) + from)) << i;
  }
}

}  // namespace

namespace {

// The fp16 hook on a CUDA bucket: the kernels compress and decompress, the
// communicator (nccl) sums in f16; against the same steps on the host.
TEST(HooksOnGpu, Fp16CompressionOfACudaBucketMatchesTheHostSteps) {
  REQUIRE_GPU(api);
  if (!nccl::library()) GTEST_SKIP() << "this build of collie has no NCCL";
  auto comm = nccl_comm();
  const int n = comm->size(), r = comm->rank();
  const size_t count = 100003;
  std::vector<float> h(count);
  for (size_t i = 0; i < count; ++i) h[i] = static_cast<float>((i % 101) * 0.37 + r);
  DeviceBuf d(*api, count * sizeof(float));
  d.put(h.data());
  GradBucket b;
  b.buffer = TensorView{d.p, DType::f32, count, Device::cuda(0)};
  b.grads = {b.buffer};
  auto hook = make_comm_hook("fp16");
  hook->run(*comm, b).wait();
  auto got = d.get();
  std::vector<float> g(count);
  std::memcpy(g.data(), got.data(), got.size());
  for (size_t i = 0; i < count; ++i) {
    float sum = 0;  // each rank's x / n in f16, summed, then rounded to f16
    for (int q = 0; q < n; ++q)
      sum += kernels::half_to_float(
          kernels::float_to_half(static_cast<float>((i % 101) * 0.37 + q) / n));
    const float want = kernels::half_to_float(kernels::float_to_half(sum));
    ASSERT_NEAR(g[i], want, 2e-3f * std::fabs(want) + 1e-3f) << i;
  }
}

// PowerSGD on CUDA buckets (cuBLAS, device state, nccl) against the CPU
// hook on the same data, and a resumed checkpoint against an uninterrupted
// run: the checks test_powersgd_cuda runs on a fake device in CI. The
// tolerances allow for cuBLAS summing in another order than OpenBLAS. On a
// host communicator (the CPU hook's buckets are on the host), which sends
// the CUDA buckets' all-reduces to NCCL beside it.
TEST(HooksOnGpu, PowerSgdOnACudaBucketMatchesTheCpuHook) {
  REQUIRE_GPU(api);
  if (!nccl::library()) GTEST_SKIP() << "this build of collie has no NCCL";
  if (!cuda::blas_runtime()) GTEST_SKIP() << "this build of collie has no cuBLAS";
  if (!collie::testing::have_powersgd()) GTEST_SKIP() << "this build of collie has no BLAS";
  auto comm = nccl_comm("auto");
  cuda::Stream s = api->create_stream();
  set_cuda_stream(s);
  for (const std::string spec :
       {"powersgd:rank=2,start_iter=2", "batched_powersgd:rank=2,start_iter=2"}) {
    for (DType t : {DType::f32, DType::f64}) {
      const double worst = collie::testing::cuda_powersgd_against_cpu(
          *comm, spec, t, 7, t == DType::f32 ? 1e-4 : 1e-10);
      if (comm->rank() == 0)
        std::printf("%s %s on the GPU: worst relative distance from the CPU hook %.3g\n",
                    spec.c_str(), std::string(to_string(t)).c_str(), worst);
      collie::testing::cuda_powersgd_resume_matches(*comm, spec, t, 7, 4);
    }
  }
  // A 16-bit bucket inside fp16_wrap: widened and narrowed by the kernels,
  // which the fake device cannot run. A last-bit difference in f32 can
  // send the bucket, P, Q or the result to the neighbouring f16 value
  // (2^-11 away); test_powersgd allows 32 of those against a float64
  // reference, and so does this between the two hooks.
  const std::string wrapped = "fp16_wrap:powersgd:rank=2,start_iter=2";
  const double worst = collie::testing::cuda_powersgd_against_cpu(*comm, wrapped, DType::f32, 7,
                                                                  32 * std::ldexp(1.0, -11));
  if (comm->rank() == 0)
    std::printf("%s on the GPU: worst relative distance from the CPU hook %.3g\n", wrapped.c_str(),
                worst);
  collie::testing::cuda_powersgd_resume_matches(*comm, wrapped, DType::f32, 7, 4);
  set_cuda_stream(nullptr);
  api->destroy_stream(s);
}

// Where no GPU can be used, a CUDA bucket is an error that says so, not a
// crash in the hook's arithmetic.
TEST(HooksOnGpu, ACudaBucketWithoutAGpuIsAnErrorThatSaysSo) {
  if (auto api = cuda::runtime(); api && api->device_count(nullptr) > 0)
    GTEST_SKIP() << "a GPU is here: the test above covers CUDA buckets";
  Options o;
  o.rank = 0;
  o.world_size = 1;
  o.backend = "tcp";
  auto comm = connect(o);
  std::vector<float> x(64, 1.f);
  GradBucket b;
  b.buffer = TensorView{x.data(), DType::f32, x.size(), Device::cuda(0)};
  b.grads = {b.buffer};
  std::vector<std::string> specs = {"fp16"};
  if (collie::testing::have_powersgd())
    specs.push_back("powersgd:start_iter=0,warm_start=0,error_feedback=0");
  for (const std::string& spec : specs) {
    auto hook = make_comm_hook(spec);
    try {
      hook->run(*comm, b).wait();
      FAIL() << spec << ": a CUDA bucket ran without a GPU";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("CUDA"), std::string::npos) << spec << ": " << e.what();
    }
  }
}

}  // namespace
