// The NCCL backend's logic against a fake device and a fake NCCL
// (tests/fake_device.h): every collective and dtype against a serial
// reference, ordering after the caller's stream and of a stream after an
// operation, grouped sends and receives, split, and failure: a peer that
// never calls (a timeout naming the operation, the communicator aborted), an
// error NCCL reports, a peer's failure passed on through the store, a rank
// that never joins. The ranks are threads of this process: the fake's
// cliques join them. The real library's runs are tests/gpu (GPU machine).
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <future>
#include <thread>
#include <vector>

#include "base/config.h"
#include "base/reduce.h"
#include "base/trace.h"
#include "collie/collie.h"
#include "collie/comm.h"
#include "comm/cuda/staged_backend.h"
#include "comm/front/front.h"
#include "comm/nccl/nccl_backend.h"
#include "fake_device.h"
#include "reducer/reducer.h"

using namespace collie;
using std::chrono::milliseconds;

namespace {

class Job {
 public:
  explicit Job(int n, milliseconds timeout = milliseconds(20000), int devices = 1)
      : n(n),
        timeout(timeout),
        cuda(std::make_shared<fake::FakeCuda>(devices)),
        nccl(std::make_shared<fake::FakeNccl>(cuda)),
        server(TcpStoreServer::start(0, "")),
        key("test/nccl/" + std::to_string(next_key++)) {}

  std::unique_ptr<Communicator> connect(int rank) {
    BackendContext ctx = context(rank);
    return make_front(ctx, nccl::make_backend(ctx, {cuda, nccl}));
  }

  BackendContext context(int rank) {
    BackendContext ctx;
    ctx.launch.rank = rank;
    ctx.launch.world_size = n;
    ctx.launch.local_rank = rank;
    ctx.launch.local_world_size = n;
    ctx.launch.timeout = timeout;
    ctx.store =
        TcpStore::connect("127.0.0.1", server->port(), "", timeout, "rank " + std::to_string(rank));
    ctx.key = key;
    ctx.failure = std::make_shared<FailureLatch>();
    ctx.inspector = StallInspector::start(ctx.store, key, rank, n, timeout);
    ctx.env = [](const char*) -> const char* { return nullptr; };
    ctx.listen_host = "127.0.0.1";
    return ctx;
  }

  // fn(rank) on n threads; an exception that escapes fails the test.
  void run(const std::function<void(int)>& fn) {
    std::vector<std::thread> ts;
    for (int r = 0; r < n; ++r)
      ts.emplace_back([&, r] {
        try {
          fn(r);
        } catch (const std::exception& e) {
          ADD_FAILURE() << "rank " << r << ": " << e.what();
        }
      });
    for (auto& t : ts) t.join();
  }

  // The fake communicator of `rank` (the last made for it).
  nccl::Comm comm_of(int rank) {
    nccl::Comm found = nullptr;
    for (nccl::Comm c : nccl->comms())
      if (static_cast<fake::Comm*>(c)->rank == rank) found = c;
    return found;
  }

  const int n;
  const milliseconds timeout;
  std::shared_ptr<fake::FakeCuda> cuda;
  std::shared_ptr<fake::FakeNccl> nccl;
  std::unique_ptr<TcpStoreServer> server;
  const std::string key;

 private:
  static inline std::atomic<int> next_key{0};
};

// A vector as a tensor on the fake's device (whose memory is host memory).
template <class T>
TensorView dev(std::vector<T>& v) {
  TensorView t = view_of(v.data(), v.size());
  t.device = Device::cuda(0);
  return t;
}

// A buffer of `numel` elements of `t` in the fake's device memory (host
// memory), read and written as doubles.
struct Buf {
  Buf(DType t, size_t numel) : t(t), numel(numel), bytes(numel * dtype_size(t) + 1, 0xCD) {}
  TensorView view() { return {bytes.data(), t, numel, Device::cuda(0)}; }
  void set(size_t i, double v) {
    void* p = bytes.data() + i * dtype_size(t);
    switch (t) {
      case DType::f32:
        *static_cast<float*>(p) = static_cast<float>(v);
        break;
      case DType::f64:
        *static_cast<double*>(p) = v;
        break;
      case DType::f16:
        *static_cast<uint16_t*>(p) = kernels::float_to_half(static_cast<float>(v));
        break;
      case DType::bf16:
        *static_cast<uint16_t*>(p) = kernels::float_to_bf16(static_cast<float>(v));
        break;
      case DType::i32:
        *static_cast<int32_t*>(p) = static_cast<int32_t>(v);
        break;
      case DType::i64:
        *static_cast<int64_t*>(p) = static_cast<int64_t>(v);
        break;
      case DType::u8:
        *static_cast<uint8_t*>(p) = static_cast<uint8_t>(v);
        break;
      case DType::i8:
        *static_cast<int8_t*>(p) = static_cast<int8_t>(v);
        break;
    }
  }
  double get(size_t i) const {
    const void* p = bytes.data() + i * dtype_size(t);
    switch (t) {
      case DType::f32:
        return *static_cast<const float*>(p);
      case DType::f64:
        return *static_cast<const double*>(p);
      case DType::f16:
        return kernels::half_to_float(*static_cast<const uint16_t*>(p));
      case DType::bf16:
        return kernels::bf16_to_float(*static_cast<const uint16_t*>(p));
      case DType::i32:
        return *static_cast<const int32_t*>(p);
      case DType::i64:
        return static_cast<double>(*static_cast<const int64_t*>(p));
      case DType::u8:
        return *static_cast<const uint8_t*>(p);
      case DType::i8:
        return *static_cast<const int8_t*>(p);
    }
    return 0;
  }
  DType t;
  size_t numel;
  std::vector<unsigned char> bytes;
};

// Rank r's element i: small integers, so that every dtype holds them and
// their sums and products exactly.
double value(int r, size_t i) {
  return static_cast<double>((i * 7 + static_cast<size_t>(r) * 3) % 4 + 1);
}

double reference(ReduceOp op, int n, size_t i) {
  double acc = value(0, i);
  for (int r = 1; r < n; ++r) {
    double v = value(r, i);
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg:
        acc += v;
        break;
      case ReduceOp::min:
        acc = std::min(acc, v);
        break;
      case ReduceOp::max:
        acc = std::max(acc, v);
        break;
      case ReduceOp::prod:
        acc *= v;
        break;
    }
  }
  return op == ReduceOp::avg ? acc / n : acc;
}

double tolerance(DType t, double x) {
  switch (t) {
    case DType::f16:
      return 1e-3 * std::fabs(x) + 1e-3;
    case DType::bf16:
      return 8e-3 * std::fabs(x) + 1e-2;
    case DType::f32:
      return 1e-6 * std::fabs(x);
    default:
      return 0;
  }
}

const DType kTypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16,
                        DType::i32, DType::i64, DType::u8,  DType::i8};
const ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::min, ReduceOp::max,
                         ReduceOp::prod};

class Ranks : public ::testing::TestWithParam<int> {};

TEST_P(Ranks, EveryCollectiveAndDtypeMatchesASerialReference) {
  const int n = GetParam();
  Job job(n);
  job.run([&](int r) {
    auto comm = job.connect(r);
    ASSERT_EQ(comm->backend(), "nccl");
    for (DType t : kTypes) {
      for (ReduceOp op : kOps) {
        if (!supports(op, t)) continue;
        const size_t count = 1001;
        Buf in(t, count), out(t, count), inplace(t, count);
        for (size_t i = 0; i < count; ++i) in.set(i, value(r, i)), inplace.set(i, value(r, i));
        comm->allreduce(in.view(), out.view(), op).wait();
        comm->allreduce(inplace.view(), op).wait();
        for (size_t i = 0; i < count; ++i) {
          double want = reference(op, n, i);
          ASSERT_NEAR(out.get(i), want, tolerance(t, want))
              << to_string(t) << " " << to_string(op) << " element " << i;
          ASSERT_NEAR(inplace.get(i), want, tolerance(t, want)) << "in place";
        }
        const size_t part = 29;
        Buf rs_in(t, part * n), rs_out(t, part);
        for (size_t i = 0; i < part * n; ++i) rs_in.set(i, value(r, i));
        comm->reduce_scatter(rs_in.view(), rs_out.view(), op).wait();
        for (size_t i = 0; i < part; ++i) {
          double want = reference(op, n, part * r + i);
          ASSERT_NEAR(rs_out.get(i), want, tolerance(t, want)) << "reduce_scatter";
        }
      }
      const size_t count = 37;
      Buf bc(t, count);
      for (size_t i = 0; i < count; ++i) bc.set(i, value(r, i));
      comm->broadcast(bc.view(), n - 1).wait();
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(bc.get(i), value(n - 1, i)) << "broadcast";
      Buf ag_in(t, count), ag_out(t, count * n);
      for (size_t i = 0; i < count; ++i) ag_in.set(i, value(r, i));
      comm->allgather(ag_in.view(), ag_out.view()).wait();
      for (int q = 0; q < n; ++q)
        for (size_t i = 0; i < count; ++i)
          ASSERT_EQ(ag_out.get(q * count + i), value(q, i)) << "allgather from rank " << q;
    }
    comm->barrier().wait();
  });
}

INSTANTIATE_TEST_SUITE_P(Nccl, Ranks, ::testing::Values(1, 2, 3, 4));

// Both ranks send, then both receive: issued back to back, the sends and
// receives go to NCCL as one group; one at a time, the fake (as NCCL can)
// would block each rank's send until the other's receive ran.
TEST(Nccl, APairwiseExchangeIsGroupedAndDoesNotDeadlock) {
  Job job(2);
  job.run([&](int r) {
    auto comm = job.connect(r);
    for (int round = 0; round < 20; ++round) {
      std::vector<float> out(100, static_cast<float>(r * 1000 + round)), in(100, -1.f);
      TensorView o = dev(out), i = dev(in);
      Work s = comm->send(o, 1 - r, 7);
      Work v = comm->recv(i, 1 - r, 7);
      wait_all({s, v});
      for (float x : in) ASSERT_EQ(x, static_cast<float>((1 - r) * 1000 + round));
    }
  });
}

// The operation starts after what the calling thread queued on its stream,
// and wait_on(stream) makes a stream wait for the operation without the
// host: rank 1 calls its all-reduce only after rank 0's wait_on returned.
TEST(Nccl, OperationsFollowTheCallersStreamAndStreamsFollowThem) {
  Job job(2);
  std::promise<void> rank0_queued;
  auto queued = rank0_queued.get_future().share();
  job.run([&](int r) {
    auto comm = job.connect(r);
    cuda::Stream s = job.cuda->create_stream();
    // Rank 1 through the C ABI (as collie's Python sets PyTorch's stream).
    if (r == 0)
      set_cuda_stream(s);
    else
      ASSERT_EQ(collie_set_cuda_stream(s), COLLIE_OK);
    std::vector<float> buf(64, 0.f);
    TensorView v = dev(buf);
    // A "kernel" that fills the input late: the all-reduce must see it.
    job.cuda->run_on(s, [&buf, r] {
      std::this_thread::sleep_for(milliseconds(30));
      std::fill(buf.begin(), buf.end(), static_cast<float>(r + 1));
    });
    if (r == 1) queued.wait();
    Work w = comm->allreduce(v, ReduceOp::sum);
    std::vector<float> seen;
    if (r == 0) {
      w.wait_on(s);
      job.cuda->run_on(s, [&] { seen = buf; });
      rank0_queued.set_value();
      job.cuda->synchronize(s);
      ASSERT_EQ(seen.size(), buf.size());
      for (float x : seen) EXPECT_EQ(x, 3.f) << "the stream ran before the all-reduce ended";
    }
    w.wait();
    for (float x : buf) EXPECT_EQ(x, 3.f);
    set_cuda_stream(nullptr);
    comm.reset();
    job.cuda->destroy_stream(s);
  });
}

TEST(Nccl, ContinuationsMayIssueAndWaitForMoreOperations) {
  Job job(2);
  job.run([&](int r) {
    auto comm = job.connect(r);
    std::vector<float> a(10, 1.f + r), b(10, 10.f * (r + 1));
    TensorView va = dev(a), vb = dev(b);
    Communicator* c = comm.get();
    Work w = c->allreduce(va, ReduceOp::sum).then_work([&](const Work&) {
      for (float& x : b) x += a[0];  // uses the first result
      return c->allreduce(vb, ReduceOp::sum);
    });
    w.wait();
    for (float x : a) EXPECT_EQ(x, 3.f);
    for (float x : b) EXPECT_EQ(x, 10.f + 20.f + 2 * 3.f);
  });
}

TEST(Nccl, BarrierEndsOnlyOnceEveryRankHasReachedIt) {
  Job job(3);
  std::atomic<int> before{0};
  job.run([&](int r) {
    auto comm = job.connect(r);
    if (r > 0) std::this_thread::sleep_for(milliseconds(20 * r));
    before.fetch_add(1);
    comm->barrier().wait();
    EXPECT_EQ(before.load(), 3);
  });
}

TEST(Nccl, SplitMakesACommunicatorPerColorOrderedByKey) {
  Job job(4);
  job.run([&](int r) {
    auto comm = job.connect(r);
    const int color = r == 3 ? -1 : r % 2;
    auto sub = comm->split(color, -r);
    if (r == 3) {
      EXPECT_EQ(sub, nullptr);
      comm->barrier().wait();
      return;
    }
    ASSERT_NE(sub, nullptr);
    // Color 0: ranks 0 and 2, by key -r: 2 first.
    const int want_size = color == 0 ? 2 : 1;
    const int want_rank = r == 2 ? 0 : (r == 0 ? 1 : 0);
    EXPECT_EQ(sub->size(), want_size);
    EXPECT_EQ(sub->rank(), want_rank);
    std::vector<double> x(5, r);
    TensorView v = dev(x);
    sub->allreduce(v, ReduceOp::sum).wait();
    for (double e : x) EXPECT_EQ(e, color == 0 ? 2.0 : 1.0);
    comm->barrier().wait();  // the parent still works
  });
}

TEST(Nccl, HostTensorsAreRefusedNamingTheBackendAndDevice) {
  Job job(1);
  auto comm = job.connect(0);
  std::vector<float> x(4, 1.f);
  try {
    comm->allreduce(view_of(x.data(), x.size()), ReduceOp::sum);
    FAIL() << "a host tensor was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("nccl"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("host memory"), std::string::npos) << e.what();
  }
}

TEST(Nccl, NoDeviceIsAnErrorThatSaysSo) {
  Job job(1, milliseconds(2000), 0);
  try {
    job.connect(0);
    FAIL() << "connected without a device";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::unavailable);
    EXPECT_NE(std::string(e.what()).find("needs a CUDA device"), std::string::npos) << e.what();
  }
}

TEST(Nccl, DestroyingTheCommunicatorReleasesItsStreamEventsAndMemory) {
  Job job(2);
  job.run([&](int r) {
    auto comm = job.connect(r);
    std::vector<float> x(8, 1.f);
    TensorView v = dev(x);
    for (int i = 0; i < 10; ++i) comm->allreduce(v, ReduceOp::sum);
    comm->barrier().wait();
  });
  EXPECT_EQ(job.cuda->live_streams.load(), 0);
  EXPECT_EQ(job.cuda->live_events.load(), 0);
  EXPECT_EQ(job.cuda->live_allocations.load(), 0);
  EXPECT_EQ(job.nccl->destroys.load(), 2);  // finalized and destroyed, not aborted
  EXPECT_EQ(job.nccl->aborts.load(), 0);
}

// NCCL waits for ever for a peer that never calls; collie's deadline
// aborts the communicator and names the operation.
TEST(Nccl, APeerThatNeverCallsIsATimeoutNamingTheOperation) {
  Job job(2, milliseconds(300));
  std::promise<void> done;
  auto finished = done.get_future().share();
  job.run([&](int r) {
    auto comm = job.connect(r);
    if (r == 1) {
      finished.wait();  // never calls the all-reduce
      return;
    }
    std::vector<float> x(8, 1.f);
    TensorView v = dev(x);
    Work w = comm->allreduce(v, ReduceOp::sum);
    try {
      w.wait();
      ADD_FAILURE() << "the all-reduce ended without its peer";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::timeout);
      std::string m = e.what();
      EXPECT_NE(m.find("allreduce #1 (f32 x 8, sum) on rank 0 did not finish within 0.3 s"),
                std::string::npos)
          << m;
      EXPECT_NE(m.find("aborted the NCCL communicator"), std::string::npos) << m;
      // The stall inspector asked rank 1 through the store.
      EXPECT_NE(m.find("rank 0 waits in #1; rank 1 last completed #0 and has not called #1 (its "
                       "process is alive)"),
                std::string::npos)
          << m;
    }
    EXPECT_GE(job.nccl->aborts.load(), 1);
    // Every later call fails at once with the first failure.
    Work again = comm->allreduce(v, ReduceOp::sum);
    ASSERT_TRUE(again.done());
    EXPECT_NE(std::string(again.error()->what()).find("failed earlier"), std::string::npos);
    done.set_value();
  });
}

// A rank that fails tells the others through the store: they stop at once
// with its reason instead of waiting for their own deadline (20 s here,
// longer than the test may take).
TEST(Nccl, AnAbortOnOneRankEndsTheOthersOperationsWithItsReason) {
  Job job(3);
  job.run([&](int r) {
    auto comm = job.connect(r);
    std::vector<float> x(8, 1.f);
    TensorView v = dev(x);
    if (r == 2) {
      std::this_thread::sleep_for(milliseconds(50));
      comm->abort("giving up on purpose");
      return;
    }
    Work w = comm->allreduce(v, ReduceOp::sum);
    try {
      w.wait(milliseconds(10000));
      ADD_FAILURE() << "the all-reduce ended without rank 2";
    } catch (const Error& e) {
      std::string m = e.what();
      EXPECT_EQ(e.code(), ErrorCode::aborted) << m;
      EXPECT_NE(m.find("on rank 2: giving up on purpose"), std::string::npos) << m;
      EXPECT_NE(m.find("rank " + std::to_string(r) + " stopped because another rank failed"),
                std::string::npos)
          << m;
    }
  });
}

TEST(Nccl, AnErrorNcclReportsFailsTheOperationInFlight) {
  Job job(2);
  std::promise<void> failed;
  auto rank0_failed = failed.get_future().share();
  job.run([&](int r) {
    auto comm = job.connect(r);
    std::vector<float> x(8, 1.f);
    TensorView v = dev(x);
    if (r == 1) {
      rank0_failed.wait();
      Work w = comm->allreduce(v, ReduceOp::sum);
      try {
        w.wait(milliseconds(10000));
        ADD_FAILURE() << "rank 1's all-reduce ended although rank 0 failed";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("NCCL reported an error on rank 0"), std::string::npos)
            << e.what();
      }
      return;
    }
    Work w = comm->allreduce(v, ReduceOp::sum);
    job.nccl->inject_error(job.comm_of(0), "remote process exited or there was a network error",
                           true);
    try {
      w.wait();
      ADD_FAILURE() << "the all-reduce ended despite NCCL's error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::peer_lost);
      std::string m = e.what();
      EXPECT_NE(m.find("NCCL reported an error on rank 0 while allreduce #1"), std::string::npos)
          << m;
      EXPECT_NE(m.find("remote process exited"), std::string::npos) << m;
    }
    failed.set_value();
  });
}

TEST(Nccl, ARankThatNeverJoinsIsNamed) {
  Job job(3, milliseconds(400));
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      try {
        job.connect(r);
        ADD_FAILURE() << "rank " << r << " connected without rank 2";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::timeout);
        EXPECT_NE(std::string(e.what()).find("rank 2 of 3 never joined"), std::string::npos)
            << e.what();
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(job.nccl->inits.load(), 0) << "NCCL's init was called before every rank joined";
}

TEST(Nccl, ADeviceErrorFailsTheOperationWithCudasMessage) {
  Job job(1);
  auto comm = job.connect(0);
  std::vector<float> x(8, 1.f);
  TensorView v = dev(x);
  comm->allreduce(v, ReduceOp::sum).wait();
  job.cuda->fail_queries = true;
  Work w = comm->allreduce(v, ReduceOp::sum);
  try {
    w.wait();
    ADD_FAILURE() << "the all-reduce ended despite the device error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("illegal memory access"), std::string::npos) << e.what();
  }
  job.cuda->fail_queries = false;
}

// A host communicator with CUDA API there: its CUDA tensors go to an NCCL
// communicator made beside it at the first one (COLLIE_CUDA_BACKEND=auto),
// its host tensors to tcp; or, with COLLIE_CUDA_BACKEND=staged, everything
// to tcp, the CUDA tensors staged through host memory.
class Route : public ::testing::TestWithParam<const char*> {};

TEST_P(Route, CudaTensorsGoToNcclOrAreStagedAndHostTensorsToTcp) {
  const std::string route = GetParam();
  Job job(3);
  job.run([&](int r) {
    BackendContext ctx = job.context(r);
    ctx.env = [route](const char* name) -> const char* {
      return std::string(name) == "COLLIE_CUDA_BACKEND" ? route.c_str() : nullptr;
    };
    auto inner = pick_backend("tcp", ctx.launch).create(ctx);
    auto comm = make_front(
        ctx, cuda::make_staged(std::move(inner), job.cuda, ctx, [&](const BackendContext& c) {
          return nccl::make_backend(c, {job.cuda, job.nccl});
        }));
    EXPECT_EQ(comm->backend(), "tcp");
    // Host and CUDA tensors back to back, waited for at the end.
    std::vector<std::vector<double>> bufs(6, std::vector<double>(3000));
    std::vector<Work> works;
    for (size_t k = 0; k < bufs.size(); ++k) {
      for (size_t i = 0; i < bufs[k].size(); ++i) bufs[k][i] = value(r, i + k);
      TensorView t = view_of(bufs[k].data(), bufs[k].size());
      if (k % 2 == 0) t.device = Device::cuda(0);
      works.push_back(comm->allreduce(t, ReduceOp::sum));
    }
    wait_all(works);
    for (size_t k = 0; k < bufs.size(); ++k)
      for (size_t i = 0; i < bufs[k].size(); ++i)
        ASSERT_EQ(bufs[k][i], reference(ReduceOp::sum, 3, i + k)) << "buffer " << k;
  });
  if (route == "staged") {
    EXPECT_EQ(job.nccl->inits.load(), 0);
  } else {
    EXPECT_EQ(job.nccl->inits.load(), 3) << "one NCCL communicator per rank";
    EXPECT_EQ(job.nccl->launches.load(), 9) << "the three CUDA all-reduces of each rank";
  }
}

// A world of one has no store (connect() makes none there), and its CUDA
// tensors still go to NCCL, which needs no id exchanged at one rank, not
// through pinned host memory. They were staged: found on the first GPU
// lease of the torch.distributed backend (an 8 B all-reduce 172 us and
// 16 MiB 790 us at one rank, where NCCL took 25-40 us).
TEST(Nccl, OneRankWithoutAStoreStillSendsCudaTensorsToNccl) {
  Job job(1);
  BackendContext ctx = job.context(0);
  ctx.store = nullptr;
  ctx.inspector = nullptr;
  auto inner = pick_backend("tcp", ctx.launch).create(ctx);
  auto comm = make_front(
      ctx, cuda::make_staged(std::move(inner), job.cuda, ctx, [&](const BackendContext& c) {
        return nccl::make_backend(c, {job.cuda, job.nccl});
      }));
  std::vector<double> buf(1000);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = value(0, i);
  TensorView t = view_of(buf.data(), buf.size());
  t.device = Device::cuda(0);
  comm->allreduce(t, ReduceOp::sum).wait();
  for (size_t i = 0; i < buf.size(); ++i) ASSERT_EQ(buf[i], reference(ReduceOp::sum, 1, i));
  EXPECT_EQ(job.nccl->inits.load(), 1) << "the CUDA tensor was staged, not given to NCCL";
  EXPECT_EQ(job.nccl->launches.load(), 1);
}

// The reducer over such a communicator with its parameters on CUDA: its
// device arena is registered with NCCL once (ncclCommRegister) and
// deregistered when the reducer goes; the gradients are averaged, through
// NCCL or staged.
TEST_P(Route, AReducerOnCudaParametersRegistersItsArenaWithNcclOnce) {
  const std::string route = GetParam();
  Job job(3);
  cuda::set_device_api(job.cuda);  // the reducer's bucket memory comes from it
  job.run([&](int r) {
    BackendContext ctx = job.context(r);
    ctx.env = [route](const char* name) -> const char* {
      return std::string(name) == "COLLIE_CUDA_BACKEND" ? route.c_str() : nullptr;
    };
    auto comm =
        make_front(ctx, cuda::make_staged(pick_backend("tcp", ctx.launch).create(ctx), job.cuda,
                                          ctx, [&](const BackendContext& c) {
                                            return nccl::make_backend(c, {job.cuda, job.nccl});
                                          }));
    std::vector<float> w(40, 1.f), b(8, 2.f);
    std::vector<Parameter> ps{{view_of(w.data(), w.size()), {}}, {view_of(b.data(), b.size()), {}}};
    for (auto& p : ps) p.value.device = Device::cuda(0);
    ReducerOptions opt;
    opt.gradient_as_bucket_view = true;
    {
      Reducer red(*comm, ps, opt);
      for (int step = 0; step < 2; ++step) {
        red.prepare_for_backward();
        for (size_t i = 0; i < ps.size(); ++i) {
          TensorView g = red.grad_view(i);
          job.cuda->synchronize(nullptr);  // what the reducer queued has run
          float* gp = static_cast<float*>(g.data);
          for (size_t k = 0; k < g.numel; ++k) gp[k] = static_cast<float>(r + 1 + k % 3);
          red.mark_grad_ready(i);
        }
        red.finalize_backward();
        job.cuda->synchronize(nullptr);
        for (size_t i = 0; i < ps.size(); ++i) {
          const float* gp = static_cast<const float*>(red.grad_view(i).data);
          for (size_t k = 0; k < red.grad_view(i).numel; ++k)
            ASSERT_EQ(gp[k], static_cast<float>(2 + k % 3)) << "the average over 3 ranks";
        }
      }
    }
  });
  cuda::set_device_api(nullptr);
  const int want = route == "staged" ? 0 : 3;  // one f32 arena on each rank
  EXPECT_EQ(job.nccl->registered.load(), want);
  EXPECT_EQ(job.nccl->deregistered.load(), want);
}

INSTANTIATE_TEST_SUITE_P(Nccl, Route, ::testing::Values("auto", "nccl", "staged"));

TEST(Nccl, AskingForNcclWhereThereIsNoneIsAnErrorAtTheFirstCudaTensor) {
  Job job(1);
  BackendContext ctx = job.context(0);
  ctx.env = [](const char* name) -> const char* {
    return std::string(name) == "COLLIE_CUDA_BACKEND" ? "nccl" : nullptr;
  };
  auto inner = pick_backend("tcp", ctx.launch).create(ctx);
  auto comm = make_front(ctx, cuda::make_staged(std::move(inner), job.cuda, ctx, {}));
  std::vector<float> x(4, 1.f);
  TensorView t = view_of(x.data(), x.size());
  comm->allreduce(t, ReduceOp::sum).wait();  // host tensors are fine
  t.device = Device::cuda(0);
  Work w = comm->allreduce(t, ReduceOp::sum);
  ASSERT_TRUE(w.error());
  EXPECT_NE(
      std::string(w.error()->what()).find("COLLIE_CUDA_BACKEND=nccl, but this build has no NCCL"),
      std::string::npos)
      << w.error()->what();
}

// COLLIE_TRACE's timeline of the NCCL backend and of CUDA tensors staged
// through a host backend: run by tests/trace/check_trace.py (mode nccl),
// which sets COLLIE_TRACE and checks the files; skipped without it. Rank 0:
// three all-reduces issued together (queued on the stream one behind the
// other), a broadcast, a send and a receive on NCCL; then a staged
// all-reduce of 10000 floats over tcp in 4 KiB pieces, one operation on
// the timeline; and one refused for want of NCCL, with its error.
TEST(NcclTrace, OperationsOnTheTimeline) {
  const std::string spec = config::trace(config::process_env());
  if (spec.empty()) GTEST_SKIP() << "COLLIE_TRACE is not set (tests/trace/check_trace.py sets it)";
  Job job(2);
  job.run([&](int r) {
    BackendContext ctx = job.context(r);
    ctx.trace = trace::Sink::open(spec, r, 2);
    ASSERT_TRUE(ctx.trace);
    auto comm = make_front(ctx, nccl::make_backend(ctx, {job.cuda, job.nccl}));
    std::vector<std::vector<float>> bufs(3, std::vector<float>(1000, 1.f));
    std::vector<Work> ws;
    for (auto& b : bufs) ws.push_back(comm->allreduce(dev(b), ReduceOp::sum));
    wait_all(ws);
    ASSERT_EQ(bufs[2][999], 2.f);
    comm->broadcast(dev(bufs[0]), 1).wait();
    std::vector<float> out(10, static_cast<float>(r)), in(10, -1.f);
    Work s = comm->send(dev(out), 1 - r, 3);
    Work v = comm->recv(dev(in), 1 - r, 3);
    wait_all({s, v});
    ASSERT_EQ(in[0], static_cast<float>(1 - r));
  });
  Job one(1);
  BackendContext ctx = one.context(0);
  ctx.trace = trace::Sink::open(spec, 0, 1);
  ctx.env = [](const char* name) -> const char* {
    const std::string n = name;
    return n == "COLLIE_CUDA_BACKEND" ? "staged" : n == "COLLIE_CUDA_CHUNK" ? "4096" : nullptr;
  };
  auto inner = pick_backend("tcp", ctx.launch).create(ctx);
  auto comm = make_front(ctx, cuda::make_staged(std::move(inner), one.cuda, ctx, {}));
  std::vector<float> x(10000, 3.f);
  comm->allreduce(dev(x), ReduceOp::sum).wait();
  ASSERT_EQ(x[9999], 3.f);
  // Refused at the first CUDA tensor (no NCCL to route it to): on the
  // timeline with its error.
  Job none(1);
  BackendContext c2 = none.context(0);
  c2.trace = ctx.trace;
  c2.env = [](const char* name) -> const char* {
    return std::string(name) == "COLLIE_CUDA_BACKEND" ? "nccl" : nullptr;
  };
  auto inner2 = pick_backend("tcp", c2.launch).create(c2);
  auto refused = make_front(c2, cuda::make_staged(std::move(inner2), none.cuda, c2, {}));
  ASSERT_TRUE(refused->allreduce(dev(x), ReduceOp::sum).error());
}

}  // namespace
