// tests/fake_device.h: a CUDA device and NCCL, faked in host memory, for
// testing the NCCL backend's logic where there is no GPU (CI).
//
// FakeCuda: each stream is a thread that runs its queue in order; an event
// is a position in a stream's queue; stream_wait queues a task that blocks
// until that position is reached. "Device memory" is host memory.
//
// FakeBlas: cuBLAS on the fake device's memory, each call run on the fake
// stream its handle is bound to (in order with the copies queued there),
// as plain loops in double, column-major as cuBLAS is. nrm2 and dot wait
// for their stream, as cuBLAS with host results does.
//
// FakeNccl: the ranks of a test are threads of one process. Communicators
// made from one unique id form a clique. A collective runs as a task on the
// caller's stream: it joins the clique's next round and blocks, as an NCCL
// kernel does, until every rank has joined; the last to join computes
// everyone's result. A rank that never joins keeps the others' streams
// blocked for ever, as NCCL does, until they abort. Sends block until the
// matching receive has taken the data, so sends and receives that are not
// grouped deadlock a pairwise exchange, as they can on NCCL.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "base/blas_api.h"
#include "base/cuda_api.h"
#include "comm/nccl/nccl_api.h"

namespace collie::fake {

class Stream {
 public:
  Stream(int device = 0);
  ~Stream();
  // The device current on the thread that made it (a CUDA stream belongs
  // to one device).
  const int device;
  // Queues fn; returns its position (1 for the first).
  uint64_t enqueue(std::function<void()> fn);
  uint64_t enqueued();
  bool reached(uint64_t n);
  void wait_reached(uint64_t n);

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> q_;
  uint64_t enqueued_ = 0, executed_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

class FakeCuda final : public cuda::Api {
 public:
  explicit FakeCuda(int devices = 1) : devices_(devices) {}
  ~FakeCuda() override;

  int device_count(std::string* why) override;
  // The calling thread's current device (0 until set), as cudaSetDevice.
  void set_device(int device) override;
  int current_device() override;
  cuda::Stream create_stream() override;
  void destroy_stream(cuda::Stream s) noexcept override;
  cuda::Event create_event() override;
  void destroy_event(cuda::Event e) noexcept override;
  void record(cuda::Event e, cuda::Stream s) override;
  bool query(cuda::Event e) override;
  void stream_wait(cuda::Stream s, cuda::Event e) override;
  void synchronize(cuda::Stream s) override;
  void* device_alloc(size_t bytes) override;
  void device_free(void* p) noexcept override;
  // Pinned host memory: any device's stream may copy it.
  void* host_alloc(size_t bytes) override { return alloc(bytes, -1); }
  void host_free(void* p) noexcept override { device_free(p); }
  void copy_async(void* dst, const void* src, size_t bytes, cuda::Stream s) override;
  void zero_async(void* p, size_t bytes, cuda::Stream s) override;

  // The fake stream behind a handle (nullptr: the legacy default stream).
  Stream& stream(cuda::Stream s);
  // Queues host work on a stream, as a kernel would run there.
  void run_on(cuda::Stream s, std::function<void()> fn) { stream(s).enqueue(std::move(fn)); }
  // Whether [p, p + bytes) lies in one device_alloc'ed block: what a kernel
  // may touch (host memory would fault on a GPU, not here).
  bool is_device_memory(const void* p, size_t bytes);

  // Makes every later query() fail, as a device error would.
  std::atomic<bool> fail_queries{false};
  std::atomic<int> live_streams{0}, live_events{0}, live_allocations{0};

 private:
  const int devices_;
  Stream legacy_;
  // Memory on `device` (the calling thread's current one), or pinned host
  // memory (-1).
  void* alloc(size_t bytes, int device);
  // A copy or fill on stream s touches [p, p + bytes): device memory must be
  // s's device's, as a real copy is queued on its memory's device (queued
  // on another's, it makes that device a context and goes through it).
  void require_stream_device(const void* p, size_t bytes, cuda::Stream s, const char* call);
  struct Block {
    size_t bytes;
    int device;
  };
  std::mutex blocks_mu_;
  std::map<uintptr_t, Block> blocks_;  // device_alloc'ed and host_alloc'ed, by start
};

class FakeBlas final : public cuda::BlasApi {
 public:
  explicit FakeBlas(std::shared_ptr<FakeCuda> cuda) : cuda_(std::move(cuda)) {}

  cuda::BlasHandle create_handle() override;
  void destroy_handle(cuda::BlasHandle h) noexcept override;
  void set_stream(cuda::BlasHandle h, cuda::Stream s) override;
  void gemm(cuda::BlasHandle h, DType t, bool trans_a, bool trans_b, int m, int n, int k,
            double alpha, const void* a, int lda, const void* b, int ldb, double beta, void* c,
            int ldc) override;
  double nrm2(cuda::BlasHandle h, DType t, int n, const void* x, int incx) override;
  double dot(cuda::BlasHandle h, DType t, int n, const void* x, int incx, const void* y,
             int incy) override;
  void scal(cuda::BlasHandle h, DType t, int n, double alpha, void* x, int incx) override;
  void axpy(cuda::BlasHandle h, DType t, int n, double alpha, const void* x, int incx, void* y,
            int incy) override;

  std::atomic<int> live_handles{0}, calls{0};

 private:
  // Fails the call, as a GPU would fault, where an operand is not in the
  // fake's device memory.
  void require_device(const void* p, size_t bytes, const char* call);
  // Runs fn on the handle's stream; with `wait`, returns once it has run.
  void run(cuda::BlasHandle h, std::function<void()> fn, bool wait);
  std::shared_ptr<FakeCuda> cuda_;
};

struct Clique;

struct Comm {
  std::shared_ptr<Clique> clique;
  int rank = -1;
  std::atomic<bool> ready{false};
  std::atomic<bool> aborted{false};
  std::atomic<bool> destroyed{false};
  uint64_t rounds = 0;  // collectives run so far (on the stream's thread)
  uint64_t splits = 0;
  std::mutex mu;
  nccl::Result error;  // injected
};

class FakeNccl final : public nccl::Api {
 public:
  explicit FakeNccl(std::shared_ptr<FakeCuda> cuda) : cuda_(std::move(cuda)) {}

  int version() override { return 22809; }
  nccl::Result unique_id(nccl::UniqueId* id) override;
  nccl::Result init_rank(nccl::Comm* comm, int nranks, const nccl::UniqueId& id, int rank,
                         bool blocking) override;
  nccl::Result split(nccl::Comm parent, int color, int key, nccl::Comm* out,
                     bool blocking) override;
  nccl::Result async_error(nccl::Comm comm) override;
  nccl::Result abort(nccl::Comm comm) override;
  nccl::Result finalize(nccl::Comm) override { return {}; }
  nccl::Result destroy(nccl::Comm comm) override;

  nccl::Result allreduce(const void* in, void* out, size_t count, DType t, ReduceOp op,
                         nccl::Comm comm, cuda::Stream s) override;
  nccl::Result broadcast(const void* in, void* out, size_t count, DType t, int root,
                         nccl::Comm comm, cuda::Stream s) override;
  nccl::Result allgather(const void* in, void* out, size_t count, DType t, nccl::Comm comm,
                         cuda::Stream s) override;
  nccl::Result reduce_scatter(const void* in, void* out, size_t count, DType t, ReduceOp op,
                              nccl::Comm comm, cuda::Stream s) override;
  nccl::Result send(const void* buf, size_t count, DType t, int peer, nccl::Comm comm,
                    cuda::Stream s) override;
  nccl::Result recv(void* buf, size_t count, DType t, int peer, nccl::Comm comm,
                    cuda::Stream s) override;
  nccl::Result group_start() override;
  nccl::Result group_end() override;
  nccl::Result register_memory(nccl::Comm, void*, size_t, void** handle) override;
  nccl::Result deregister_memory(nccl::Comm, void*) override;

  // async_error(comm) reports this failure from now on, and what runs on
  // the communicator stops (as NCCL's kernels do after an error).
  void inject_error(nccl::Comm comm, const std::string& message, bool remote);
  // The communicators made so far, in the order init_rank and split made
  // them (a test finds a rank's to inject an error into).
  std::vector<nccl::Comm> comms();
  std::atomic<int> aborts{0}, destroys{0}, inits{0}, launches{0};
  std::atomic<int> registered{0}, deregistered{0};

 private:
  struct P2p {
    bool send;
    void* buf;
    size_t bytes;
    int peer;
  };
  nccl::Result p2p(P2p op, nccl::Comm comm, cuda::Stream s);
  void run_p2p(Comm* c, const std::vector<P2p>& ops);

  std::shared_ptr<FakeCuda> cuda_;
  std::mutex mu_;
  std::map<uint64_t, std::shared_ptr<Clique>> cliques_;
  std::vector<std::unique_ptr<Comm>> comms_;
  uint64_t next_id_ = 1;
};

}  // namespace collie::fake
