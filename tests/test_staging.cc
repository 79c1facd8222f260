// CUDA tensors on the host backends (tcp, shm), staged through pinned host
// memory, over real processes started by collie-run, with a fake device
// (tests/fake_device.h) installed before connect(): its "device memory" is
// host memory and its streams are threads, so the staging's order (after
// the caller's stream, piece by piece through two buffers, results copied
// back) runs as on a GPU. Run with COLLIE_CUDA_CHUNK=4096, so that the
// larger tensors go in hundreds of pieces.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "base/cuda_api.h"
#include "collie/comm.h"
#include "fake_device.h"
#include "mp_test.h"

namespace collie {
namespace {

auto fake_cuda() {
  static auto api = [] {
    auto a = std::make_shared<fake::FakeCuda>(2);
    cuda::set_device_api(a);
    return a;
  }();
  return api;
}

Communicator& comm() {
  fake_cuda();  // before the communicator is made
  return testing::world();
}

template <class T>
TensorView dev(std::vector<T>& v) {
  TensorView t = view_of(v.data(), v.size());
  t.device = Device::cuda(0);
  return t;
}

double value(int r, size_t i) {
  return static_cast<double>((i * 5 + static_cast<size_t>(r) * 11) % 17) - 4;
}

TEST(Staged, AllreduceOfCudaTensorsInPiecesMatchesTheReference) {
  const int n = comm().size(), r = comm().rank();
  for (size_t count : {size_t(0), size_t(1), size_t(1000), size_t(1025), size_t(300001)}) {
    for (bool in_place : {false, true}) {
      std::vector<double> in(count), out(count, -1e9);
      for (size_t i = 0; i < count; ++i) in[i] = value(r, i);
      if (in_place)
        comm().allreduce(dev(in), ReduceOp::sum).wait();
      else
        comm().allreduce(dev(in), dev(out), ReduceOp::sum).wait();
      const std::vector<double>& got = in_place ? in : out;
      for (size_t i = 0; i < count; ++i) {
        double want = 0;
        for (int q = 0; q < n; ++q) want += value(q, i);
        ASSERT_EQ(got[i], want) << "count " << count << " element " << i;
      }
    }
    std::vector<int32_t> ints(count);
    for (size_t i = 0; i < count; ++i) ints[i] = static_cast<int32_t>(value(r, i));
    comm().allreduce(dev(ints), ReduceOp::max).wait();
    for (size_t i = 0; i < count; ++i) {
      double want = value(0, i);
      for (int q = 1; q < n; ++q) want = std::max(want, value(q, i));
      ASSERT_EQ(ints[i], static_cast<int32_t>(want)) << "max, element " << i;
    }
  }
}

TEST(Staged, BroadcastAllgatherReduceScatterSendAndReceive) {
  const int n = comm().size(), r = comm().rank();
  const size_t count = 5000;
  std::vector<float> b(count);
  for (size_t i = 0; i < count; ++i) b[i] = static_cast<float>(value(r, i));
  comm().broadcast(dev(b), n - 1).wait();
  for (size_t i = 0; i < count; ++i) ASSERT_EQ(b[i], static_cast<float>(value(n - 1, i)));

  std::vector<float> mine(count), all(count * n, -1.f);
  for (size_t i = 0; i < count; ++i) mine[i] = static_cast<float>(value(r, i));
  comm().allgather(dev(mine), dev(all)).wait();
  for (int q = 0; q < n; ++q)
    for (size_t i = 0; i < count; ++i)
      ASSERT_EQ(all[q * count + i], static_cast<float>(value(q, i))) << "from rank " << q;

  std::vector<float> rs_in(count * n), rs_out(count, -1.f);
  for (size_t i = 0; i < count * n; ++i) rs_in[i] = static_cast<float>(value(r, i));
  comm().reduce_scatter(dev(rs_in), dev(rs_out), ReduceOp::sum).wait();
  for (size_t i = 0; i < count; ++i) {
    double want = 0;
    for (int q = 0; q < n; ++q) want += value(q, r * count + i);
    ASSERT_EQ(rs_out[i], static_cast<float>(want));
  }

  if (n < 2) return;
  // A pairwise exchange with the neighbours: sends first, then receives.
  std::vector<float> to(count), from(count, -1.f);
  for (size_t i = 0; i < count; ++i) to[i] = static_cast<float>(value(r, i));
  Work s = comm().send(dev(to), (r + 1) % n);
  Work v = comm().recv(dev(from), (r + n - 1) % n);
  wait_all({s, v});
  for (size_t i = 0; i < count; ++i)
    ASSERT_EQ(from[i], static_cast<float>(value((r + n - 1) % n, i)));
}

// Tensors on the second device: the staging thread (and, for a receive,
// the thread its copy back runs on) start on device 0, and the fake device
// refuses a copy queued on another device's stream, and an event recorded
// on another device's stream, as CUDA does the latter.
TEST(Staged, TensorsOnTheSecondDeviceAreStagedOnIt) {
  const int n = comm().size(), r = comm().rank();
  const size_t count = 3000;
  auto& cuda = *fake_cuda();
  // Device 1 current, two buffers there; all undone however the test ends.
  struct OnDevice1 {
    explicit OnDevice1(fake::FakeCuda& c, size_t bytes) : cuda(c) {
      cuda.set_device(1);
      a = static_cast<float*>(cuda.device_alloc(bytes));
      b = static_cast<float*>(cuda.device_alloc(bytes));
    }
    ~OnDevice1() {
      cuda.device_free(a);
      cuda.device_free(b);
      cuda.set_device(0);
    }
    fake::FakeCuda& cuda;
    float *a, *b;
  } on(cuda, count * sizeof(float));
  float *a = on.a, *b = on.b;
  for (size_t i = 0; i < count; ++i) a[i] = static_cast<float>(value(r, i));
  auto on1 = [&](float* p) { return TensorView{p, DType::f32, count, Device::cuda(1)}; };
  comm().allreduce(on1(a), on1(b), ReduceOp::sum).wait();
  for (size_t i = 0; i < count; ++i) {
    double want = 0;
    for (int q = 0; q < n; ++q) want += value(q, i);
    ASSERT_EQ(b[i], static_cast<float>(want)) << "element " << i;
  }
  if (n >= 2) {
    Work s = comm().send(on1(a), (r + 1) % n);
    Work v = comm().recv(on1(b), (r + n - 1) % n);
    wait_all({s, v});
    for (size_t i = 0; i < count; ++i)
      ASSERT_EQ(b[i], static_cast<float>(value((r + n - 1) % n, i))) << "element " << i;
  }
}

// Host and CUDA tensors issued back to back, none waited for until the
// end: the host ones keep their place behind the staged ones on every rank.
TEST(Staged, HostAndCudaTensorsInterleaveInIssueOrder) {
  const int n = comm().size(), r = comm().rank();
  const size_t count = 20000;
  std::vector<std::vector<float>> bufs(6, std::vector<float>(count));
  for (size_t k = 0; k < bufs.size(); ++k)
    for (size_t i = 0; i < count; ++i) bufs[k][i] = static_cast<float>(value(r, i + k));
  std::vector<Work> works;
  for (size_t k = 0; k < bufs.size(); ++k) {
    TensorView t = k % 2 ? view_of(bufs[k].data(), count) : dev(bufs[k]);
    works.push_back(comm().allreduce(t, ReduceOp::sum));
  }
  wait_all(works);
  for (size_t k = 0; k < bufs.size(); ++k)
    for (size_t i = 0; i < count; ++i) {
      double want = 0;
      for (int q = 0; q < n; ++q) want += value(q, i + k);
      ASSERT_EQ(bufs[k][i], static_cast<float>(want)) << "buffer " << k << ", element " << i;
    }
}

// The staging starts after what the caller queued on its stream: a
// "kernel" there fills the input late.
TEST(Staged, AnOperationStartsAfterTheCallersStream) {
  const int n = comm().size(), r = comm().rank();
  auto api = fake_cuda();
  cuda::Stream s = api->create_stream();
  set_cuda_stream(s);
  std::vector<float> x(3000, 0.f);
  api->run_on(s, [&x, r] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    std::fill(x.begin(), x.end(), static_cast<float>(r + 1));
  });
  comm().allreduce(dev(x), ReduceOp::sum).wait();
  set_cuda_stream(nullptr);
  for (float e : x) ASSERT_EQ(e, static_cast<float>(n * (n + 1) / 2));
  api->destroy_stream(s);
}

}  // namespace
}  // namespace collie
