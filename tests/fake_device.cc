#include "fake_device.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <new>
#include <tuple>

#include "base/op.h"
#include "base/reduce.h"
#include "collie/error.h"

namespace collie::fake {

// ---------------------------------------------------------------- streams

Stream::Stream(int on_device) : device(on_device), thread_([this] { loop(); }) {}

Stream::~Stream() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

uint64_t Stream::enqueue(std::function<void()> fn) {
  std::lock_guard lk(mu_);
  q_.push_back(std::move(fn));
  cv_.notify_all();
  return ++enqueued_;
}

uint64_t Stream::enqueued() {
  std::lock_guard lk(mu_);
  return enqueued_;
}

bool Stream::reached(uint64_t n) {
  std::lock_guard lk(mu_);
  return executed_ >= n;
}

void Stream::wait_reached(uint64_t n) {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return executed_ >= n; });
}

void Stream::loop() {
  std::unique_lock lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || !q_.empty(); });
    if (q_.empty()) return;
    auto fn = std::move(q_.front());
    q_.pop_front();
    lk.unlock();
    fn();
    lk.lock();
    ++executed_;
    cv_.notify_all();
  }
}

// ---------------------------------------------------------------- CUDA

namespace {
struct Event {
  int device = 0;  // current when it was made, as a CUDA event's
  Stream* stream = nullptr;
  uint64_t target = 0;
};
Event* ev(cuda::Event e) {
  return static_cast<Event*>(e);
}
}  // namespace

FakeCuda::~FakeCuda() = default;

int FakeCuda::device_count(std::string* why) {
  if (devices_ == 0 && why) *why = "the fake has no device";
  return devices_;
}

namespace {
thread_local int current_device_of_thread = 0;
}  // namespace

void FakeCuda::set_device(int device) {
  current_device_of_thread = device;
}

int FakeCuda::current_device() {
  return current_device_of_thread;
}

cuda::Stream FakeCuda::create_stream() {
  ++live_streams;
  return new Stream(current_device());
}

void FakeCuda::destroy_stream(cuda::Stream s) noexcept {
  --live_streams;
  delete static_cast<Stream*>(s);
}

cuda::Event FakeCuda::create_event() {
  ++live_events;
  auto* e = new Event;
  e->device = current_device();
  return e;
}

void FakeCuda::destroy_event(cuda::Event e) noexcept {
  --live_events;
  delete ev(e);
}

Stream& FakeCuda::stream(cuda::Stream s) {
  return s ? *static_cast<Stream*>(s) : legacy_;
}

void FakeCuda::record(cuda::Event e, cuda::Stream s) {
  // cudaEventRecord: the event and the stream must be on one device.
  const int on = s ? static_cast<Stream*>(s)->device : current_device();
  if (ev(e)->device != on)
    throw Error(ErrorCode::internal,
                "cudaEventRecord (fake): an event of cuda:" + std::to_string(ev(e)->device) +
                    " recorded on a stream of cuda:" + std::to_string(on));
  Stream& st = stream(s);
  ev(e)->stream = &st;
  ev(e)->target = st.enqueued();
}

bool FakeCuda::query(cuda::Event e) {
  if (fail_queries)
    throw Error(ErrorCode::internal,
                "cudaEventQuery failed: an illegal memory access was encountered (fake)");
  return !ev(e)->stream || ev(e)->stream->reached(ev(e)->target);
}

void FakeCuda::stream_wait(cuda::Stream s, cuda::Event e) {
  Stream* on = ev(e)->stream;
  const uint64_t target = ev(e)->target;
  if (!on || on->reached(target)) return;
  stream(s).enqueue([on, target] { on->wait_reached(target); });
}

void FakeCuda::synchronize(cuda::Stream s) {
  Stream& st = stream(s);
  st.wait_reached(st.enqueued());
}

void* FakeCuda::device_alloc(size_t bytes) {
  return alloc(bytes, current_device());
}

void* FakeCuda::alloc(size_t bytes, int device) {
  ++live_allocations;
  void* p = ::operator new(bytes == 0 ? 1 : bytes, std::align_val_t(64));
  std::memset(p, 0xAB, bytes);  // not zeroed, as cudaMalloc's is not
  std::lock_guard lk(blocks_mu_);
  blocks_[reinterpret_cast<uintptr_t>(p)] = {bytes, device};
  return p;
}

void FakeCuda::require_stream_device(const void* p, size_t bytes, cuda::Stream s,
                                     const char* call) {
  if (bytes == 0) return;
  const auto at = reinterpret_cast<uintptr_t>(p);
  int device;
  {
    std::lock_guard lk(blocks_mu_);
    auto it = blocks_.upper_bound(at);
    if (it == blocks_.begin()) return;
    --it;
    if (at + bytes > it->first + it->second.bytes || it->second.device < 0) return;
    device = it->second.device;
  }
  // The legacy default stream is the current device's.
  const int on = s ? static_cast<Stream*>(s)->device : current_device();
  if (on != device)
    throw Error(ErrorCode::internal, std::string(call) +
                                         " (fake): memory of cuda:" + std::to_string(device) +
                                         " queued on a stream of cuda:" + std::to_string(on));
}

bool FakeCuda::is_device_memory(const void* p, size_t bytes) {
  const auto at = reinterpret_cast<uintptr_t>(p);
  std::lock_guard lk(blocks_mu_);
  auto it = blocks_.upper_bound(at);
  if (it == blocks_.begin()) return false;
  --it;
  return at + bytes <= it->first + it->second.bytes;
}

void FakeCuda::device_free(void* p) noexcept {
  if (!p) return;
  {
    std::lock_guard lk(blocks_mu_);
    blocks_.erase(reinterpret_cast<uintptr_t>(p));
  }
  --live_allocations;
  ::operator delete(p, std::align_val_t(64));
}

void FakeCuda::copy_async(void* dst, const void* src, size_t bytes, cuda::Stream s) {
  require_stream_device(dst, bytes, s, "cudaMemcpyAsync");
  require_stream_device(src, bytes, s, "cudaMemcpyAsync");
  stream(s).enqueue([=] { std::memcpy(dst, src, bytes); });
}

void FakeCuda::zero_async(void* p, size_t bytes, cuda::Stream s) {
  require_stream_device(p, bytes, s, "cudaMemsetAsync");
  stream(s).enqueue([=] { std::memset(p, 0, bytes); });
}

// ---------------------------------------------------------------- cuBLAS

namespace {

struct BlasHandle {
  int device = 0;  // current when it was made, as a cuBLAS handle's
  cuda::Stream stream = nullptr;
};

void require_float(DType t) {
  if (t != DType::f32 && t != DType::f64)
    throw Error(ErrorCode::invalid_argument, "cuBLAS (fake): f32 or f64 only");
}

double get(DType t, const void* p, long i) {
  return t == DType::f32 ? static_cast<const float*>(p)[i] : static_cast<const double*>(p)[i];
}

void put(DType t, void* p, long i, double v) {
  if (t == DType::f32)
    static_cast<float*>(p)[i] = static_cast<float>(v);
  else
    static_cast<double*>(p)[i] = v;
}

}  // namespace

cuda::BlasHandle FakeBlas::create_handle() {
  ++live_handles;
  auto* h = new BlasHandle;
  h->device = cuda_->current_device();
  return h;
}

void FakeBlas::destroy_handle(cuda::BlasHandle h) noexcept {
  --live_handles;
  delete static_cast<BlasHandle*>(h);
}

void FakeBlas::set_stream(cuda::BlasHandle h, cuda::Stream s) {
  static_cast<BlasHandle*>(h)->stream = s;
}

void FakeBlas::require_device(const void* p, size_t bytes, const char* call) {
  if (!cuda_->is_device_memory(p, bytes))
    throw Error(ErrorCode::internal, std::string(call) +
                                         " (fake): an operand is not in device memory (a GPU "
                                         "would fault on it)");
}

void FakeBlas::run(cuda::BlasHandle h, std::function<void()> fn, bool wait) {
  ++calls;
  auto* handle = static_cast<BlasHandle*>(h);
  Stream& s = cuda_->stream(handle->stream);
  // cuBLAS runs on the handle's device, with a stream of that device, from
  // a thread that has it current; the legacy stream (nullptr) is every
  // device's.
  const int current = cuda_->current_device();
  if (handle->device != current || (handle->stream && s.device != current))
    throw Error(ErrorCode::internal,
                "cuBLAS (fake): a handle of device " + std::to_string(handle->device) +
                    " with a stream of device " + std::to_string(s.device) +
                    " used on a thread whose current device is " + std::to_string(current));
  const uint64_t at = s.enqueue(std::move(fn));
  if (wait) s.wait_reached(at);
}

void FakeBlas::gemm(cuda::BlasHandle h, DType t, bool ta, bool tb, int m, int n, int k,
                    double alpha, const void* a, int lda, const void* b, int ldb, double beta,
                    void* c, int ldc) {
  require_float(t);
  const size_t es = dtype_size(t);
  auto extent = [es](long rows, long cols, long ld) {
    return rows && cols ? static_cast<size_t>((cols - 1) * ld + rows) * es : 0;
  };
  require_device(a, ta ? extent(k, m, lda) : extent(m, k, lda), "cublasXgemm");
  require_device(b, tb ? extent(n, k, ldb) : extent(k, n, ldb), "cublasXgemm");
  require_device(c, extent(m, n, ldc), "cublasXgemm");
  run(
      h,
      [=] {
        // Column-major: element (i, j) of an ld-strided matrix is at i + j ld.
        auto A = [&](long i, long p) {
          return ta ? get(t, a, p + i * lda) : get(t, a, i + p * lda);
        };
        auto B = [&](long p, long j) {
          return tb ? get(t, b, j + p * ldb) : get(t, b, p + j * ldb);
        };
        for (long i = 0; i < m; ++i)
          for (long j = 0; j < n; ++j) {
            double sum = 0;
            for (long p = 0; p < k; ++p) sum += A(i, p) * B(p, j);
            // beta = 0: c is not read (it may hold NaN), as BLAS specifies.
            double old = beta == 0 ? 0.0 : beta * get(t, c, i + j * ldc);
            put(t, c, i + j * ldc, alpha * sum + old);
          }
      },
      false);
}

double FakeBlas::nrm2(cuda::BlasHandle h, DType t, int n, const void* x, int incx) {
  require_float(t);
  require_device(x, static_cast<size_t>(n > 0 ? (n - 1) * incx + 1 : 0) * dtype_size(t),
                 "cublasXnrm2");
  double r = 0;
  run(
      h,
      [=, &r] {
        double s = 0;
        for (long i = 0; i < n; ++i) s += get(t, x, i * incx) * get(t, x, i * incx);
        r = std::sqrt(s);
      },
      true);
  return t == DType::f32 ? static_cast<float>(r) : r;
}

double FakeBlas::dot(cuda::BlasHandle h, DType t, int n, const void* x, int incx, const void* y,
                     int incy) {
  require_float(t);
  require_device(x, static_cast<size_t>(n > 0 ? (n - 1) * incx + 1 : 0) * dtype_size(t),
                 "cublasXdot");
  require_device(y, static_cast<size_t>(n > 0 ? (n - 1) * incy + 1 : 0) * dtype_size(t),
                 "cublasXdot");
  double r = 0;
  run(
      h,
      [=, &r] {
        for (long i = 0; i < n; ++i) r += get(t, x, i * incx) * get(t, y, i * incy);
      },
      true);
  return t == DType::f32 ? static_cast<float>(r) : r;
}

void FakeBlas::scal(cuda::BlasHandle h, DType t, int n, double alpha, void* x, int incx) {
  require_float(t);
  require_device(x, static_cast<size_t>(n > 0 ? (n - 1) * incx + 1 : 0) * dtype_size(t),
                 "cublasXscal");
  run(
      h,
      [=] {
        for (long i = 0; i < n; ++i) put(t, x, i * incx, alpha * get(t, x, i * incx));
      },
      false);
}

void FakeBlas::axpy(cuda::BlasHandle h, DType t, int n, double alpha, const void* x, int incx,
                    void* y, int incy) {
  require_float(t);
  require_device(x, static_cast<size_t>(n > 0 ? (n - 1) * incx + 1 : 0) * dtype_size(t),
                 "cublasXaxpy");
  require_device(y, static_cast<size_t>(n > 0 ? (n - 1) * incy + 1 : 0) * dtype_size(t),
                 "cublasXaxpy");
  run(
      h,
      [=] {
        for (long i = 0; i < n; ++i)
          put(t, y, i * incy, alpha * get(t, x, i * incx) + get(t, y, i * incy));
      },
      false);
}

// ---------------------------------------------------------------- NCCL

struct Part {
  OpKind kind;
  const void* in;
  void* out;
  size_t count;
  DType t;
  ReduceOp op;
  int root;
};

struct Clique {
  explicit Clique(int n) : nranks(n), members(static_cast<size_t>(n), nullptr) {}
  const int nranks;
  std::mutex mu;
  std::condition_variable cv;
  int joined = 0;
  std::vector<Comm*> members;
  struct Round {
    std::vector<Part> parts;
    int arrived = 0;
    bool done = false;
    // A rank left without its result (aborted): its buffers may be gone, so
    // the round never completes, as NCCL's peers of a dead rank wait on.
    bool broken = false;
  };
  std::map<uint64_t, Round> rounds;
  struct SplitRound {
    std::vector<std::tuple<int, int, Comm*>> parts;  // color, key, new communicator
    int arrived = 0;
  };
  std::map<uint64_t, SplitRound> splits;
  struct Msg {
    const void* data;
    size_t bytes;
    bool taken = false;
  };
  std::map<std::pair<int, int>, std::deque<std::shared_ptr<Msg>>> mail;
};

namespace {

Comm* cm(nccl::Comm c) {
  return static_cast<Comm*>(c);
}

nccl::Result failed(const std::string& why, bool remote = false) {
  nccl::Result r;
  r.code = nccl::Result::Code::failed;
  r.remote = remote;
  r.message = why;
  return r;
}

bool stopped(Comm* c) {
  if (c->aborted) return true;
  std::lock_guard lk(c->mu);
  return c->error.failed();
}

// Everyone's result, computed by the last rank to join the round.
void compute(const std::vector<Part>& parts) {
  const Part& p0 = parts[0];
  const size_t n = parts.size();
  const size_t es = dtype_size(p0.t);
  const ReduceOp step = p0.op == ReduceOp::avg ? ReduceOp::sum : p0.op;
  auto reduce_all = [&](size_t elems) {
    std::vector<unsigned char> acc(elems * es);
    std::memcpy(acc.data(), p0.in, acc.size());
    for (size_t r = 1; r < n; ++r)
      kernels::reduce(p0.t, step, acc.data(), acc.data(), parts[r].in, elems);
    if (p0.op == ReduceOp::avg)
      kernels::divide(p0.t, acc.data(), acc.data(), elems, static_cast<int>(n));
    return acc;
  };
  switch (p0.kind) {
    case OpKind::allreduce: {
      auto acc = reduce_all(p0.count);
      for (const Part& p : parts) std::memcpy(p.out, acc.data(), acc.size());
      break;
    }
    case OpKind::broadcast: {
      const Part& root = parts[static_cast<size_t>(p0.root)];
      std::vector<unsigned char> v(static_cast<const unsigned char*>(root.in),
                                   static_cast<const unsigned char*>(root.in) + root.count * es);
      for (const Part& p : parts) std::memcpy(p.out, v.data(), v.size());
      break;
    }
    case OpKind::allgather: {
      std::vector<unsigned char> v(n * p0.count * es);
      for (size_t r = 0; r < n; ++r)
        std::memcpy(v.data() + r * p0.count * es, parts[r].in, p0.count * es);
      for (const Part& p : parts) std::memcpy(p.out, v.data(), v.size());
      break;
    }
    case OpKind::reduce_scatter: {
      auto acc = reduce_all(n * p0.count);
      for (size_t r = 0; r < n; ++r)
        std::memcpy(parts[r].out, acc.data() + r * p0.count * es, p0.count * es);
      break;
    }
    default:
      break;
  }
}

thread_local int group_depth = 0;
thread_local std::vector<std::tuple<Comm*, cuda::Stream, bool, void*, size_t, int>> grouped;

}  // namespace

nccl::Result FakeNccl::unique_id(nccl::UniqueId* id) {
  std::lock_guard lk(mu_);
  std::memset(id->bytes, 0, sizeof id->bytes);
  uint64_t k = next_id_++;
  std::memcpy(id->bytes, &k, sizeof k);
  return {};
}

nccl::Result FakeNccl::init_rank(nccl::Comm* comm, int nranks, const nccl::UniqueId& id, int rank,
                                 bool blocking) {
  uint64_t k = 0;
  std::memcpy(&k, id.bytes, sizeof k);
  std::shared_ptr<Clique> q;
  Comm* c;
  {
    std::lock_guard lk(mu_);
    auto& slot = cliques_[k];
    if (!slot) slot = std::make_shared<Clique>(nranks);
    q = slot;
    comms_.push_back(std::make_unique<Comm>());
    c = comms_.back().get();
  }
  ++inits;
  if (q->nranks != nranks || rank < 0 || rank >= nranks)
    return failed("invalid argument (fake): rank " + std::to_string(rank) + " of " +
                  std::to_string(nranks));
  c->clique = q;
  c->rank = rank;
  *comm = c;
  std::unique_lock lk(q->mu);
  q->members[static_cast<size_t>(rank)] = c;
  if (++q->joined == nranks) {
    for (Comm* m : q->members) m->ready = true;
    q->cv.notify_all();
  }
  if (blocking) q->cv.wait(lk, [&] { return c->ready.load(); });
  nccl::Result r;
  if (!c->ready) r.code = nccl::Result::Code::in_progress;
  return r;
}

nccl::Result FakeNccl::split(nccl::Comm parent, int color, int key, nccl::Comm* out, bool) {
  Comm* p = cm(parent);
  if (!p->ready || p->aborted)
    return failed("invalid usage (fake): split of a communicator not ready");
  Comm* made = nullptr;
  if (color >= 0) {
    std::lock_guard lk(mu_);
    comms_.push_back(std::make_unique<Comm>());
    made = comms_.back().get();
  }
  *out = made;
  Clique& q = *p->clique;
  std::lock_guard lk(q.mu);
  auto& r = q.splits[p->splits++];
  r.parts.resize(static_cast<size_t>(q.nranks), {-1, 0, nullptr});
  r.parts[static_cast<size_t>(p->rank)] = {color, key, made};
  if (++r.arrived == q.nranks) {
    std::map<int, std::vector<std::tuple<int, int, Comm*>>> groups;  // key, parent rank, comm
    for (int i = 0; i < q.nranks; ++i) {
      auto [c, k, m] = r.parts[static_cast<size_t>(i)];
      if (c >= 0) groups[c].push_back({k, i, m});
    }
    for (auto& [c, members] : groups) {
      std::sort(members.begin(), members.end());
      auto nq = std::make_shared<Clique>(static_cast<int>(members.size()));
      nq->joined = nq->nranks;
      for (size_t i = 0; i < members.size(); ++i) {
        Comm* m = std::get<2>(members[i]);
        m->clique = nq;
        m->rank = static_cast<int>(i);
        nq->members[i] = m;
      }
      for (Comm* m : nq->members) m->ready = true;
    }
  }
  nccl::Result res;
  if (made && !made->ready) res.code = nccl::Result::Code::in_progress;
  return res;
}

nccl::Result FakeNccl::async_error(nccl::Comm comm) {
  Comm* c = cm(comm);
  {
    std::lock_guard lk(c->mu);
    if (c->error.failed()) return c->error;
  }
  nccl::Result r;
  if (!c->ready) r.code = nccl::Result::Code::in_progress;
  return r;
}

void FakeNccl::inject_error(nccl::Comm comm, const std::string& message, bool remote) {
  Comm* c = cm(comm);
  {
    std::lock_guard lk(c->mu);
    c->error = failed(message, remote);
  }
  if (c->clique) {
    std::lock_guard lk(c->clique->mu);
    c->clique->cv.notify_all();
  }
}

std::vector<nccl::Comm> FakeNccl::comms() {
  std::lock_guard lk(mu_);
  std::vector<nccl::Comm> v;
  for (auto& c : comms_) v.push_back(c.get());
  return v;
}

nccl::Result FakeNccl::abort(nccl::Comm comm) {
  Comm* c = cm(comm);
  c->aborted = true;
  ++aborts;
  if (c->clique) {
    std::lock_guard lk(c->clique->mu);
    c->clique->cv.notify_all();
  }
  return {};
}

nccl::Result FakeNccl::destroy(nccl::Comm comm) {
  cm(comm)->destroyed = true;
  ++destroys;
  return {};
}

namespace {

nccl::Result run_collective(FakeCuda& cuda, Comm* c, cuda::Stream s, Part part) {
  if (!c->ready || c->aborted || c->destroyed)
    return failed("invalid usage (fake): the communicator is not ready, aborted or destroyed");
  cuda.run_on(s, [c, part] {
    if (stopped(c)) return;
    Clique& q = *c->clique;
    std::unique_lock lk(q.mu);
    auto& r = q.rounds[c->rounds++];
    r.parts.resize(static_cast<size_t>(q.nranks));
    r.parts[static_cast<size_t>(c->rank)] = part;
    if (++r.arrived == q.nranks && !r.broken) {
      compute(r.parts);
      r.done = true;
      q.cv.notify_all();
      return;
    }
    q.cv.wait(lk, [&] { return r.done || stopped(c); });
    if (!r.done) r.broken = true;
  });
  return {};
}

}  // namespace

nccl::Result FakeNccl::allreduce(const void* in, void* out, size_t count, DType t, ReduceOp op,
                                 nccl::Comm comm, cuda::Stream s) {
  ++launches;
  return run_collective(*cuda_, cm(comm), s, {OpKind::allreduce, in, out, count, t, op, 0});
}

nccl::Result FakeNccl::broadcast(const void* in, void* out, size_t count, DType t, int root,
                                 nccl::Comm comm, cuda::Stream s) {
  ++launches;
  return run_collective(*cuda_, cm(comm), s,
                        {OpKind::broadcast, in, out, count, t, ReduceOp::sum, root});
}

nccl::Result FakeNccl::allgather(const void* in, void* out, size_t count, DType t, nccl::Comm comm,
                                 cuda::Stream s) {
  ++launches;
  return run_collective(*cuda_, cm(comm), s,
                        {OpKind::allgather, in, out, count, t, ReduceOp::sum, 0});
}

nccl::Result FakeNccl::reduce_scatter(const void* in, void* out, size_t count, DType t, ReduceOp op,
                                      nccl::Comm comm, cuda::Stream s) {
  ++launches;
  return run_collective(*cuda_, cm(comm), s, {OpKind::reduce_scatter, in, out, count, t, op, 0});
}

void FakeNccl::run_p2p(Comm* c, const std::vector<P2p>& ops) {
  if (stopped(c)) return;
  Clique& q = *c->clique;
  std::unique_lock lk(q.mu);
  std::vector<std::shared_ptr<Clique::Msg>> sent;
  for (const P2p& p : ops) {
    if (!p.send) continue;
    auto m = std::make_shared<Clique::Msg>(Clique::Msg{p.buf, p.bytes});
    q.mail[{c->rank, p.peer}].push_back(m);
    sent.push_back(m);
  }
  q.cv.notify_all();
  // Leaving early (aborted): the messages not taken go, with their buffers.
  auto withdraw = [&] {
    for (const P2p& p : ops) {
      if (!p.send) continue;
      auto& box = q.mail[{c->rank, p.peer}];
      for (auto it = box.begin(); it != box.end();)
        it = std::find(sent.begin(), sent.end(), *it) != sent.end() ? box.erase(it) : it + 1;
    }
  };
  for (const P2p& p : ops) {
    if (p.send) continue;
    auto& box = q.mail[{p.peer, c->rank}];
    q.cv.wait(lk, [&] { return !box.empty() || stopped(c); });
    if (box.empty()) return withdraw();
    auto m = box.front();
    box.pop_front();
    std::memcpy(p.buf, m->data, std::min(m->bytes, p.bytes));
    m->taken = true;
    q.cv.notify_all();
  }
  for (auto& m : sent) q.cv.wait(lk, [&] { return m->taken || stopped(c); });
  withdraw();
}

nccl::Result FakeNccl::p2p(P2p op, nccl::Comm comm, cuda::Stream s) {
  Comm* c = cm(comm);
  if (!c->ready || c->aborted) return failed("invalid usage (fake): communicator not ready");
  if (group_depth > 0) {
    grouped.push_back({c, s, op.send, op.buf, op.bytes, op.peer});
    return {};
  }
  ++launches;
  cuda_->run_on(s, [this, c, op] { run_p2p(c, {op}); });
  return {};
}

nccl::Result FakeNccl::send(const void* buf, size_t count, DType t, int peer, nccl::Comm comm,
                            cuda::Stream s) {
  return p2p({true, const_cast<void*>(buf), count * dtype_size(t), peer}, comm, s);
}

nccl::Result FakeNccl::recv(void* buf, size_t count, DType t, int peer, nccl::Comm comm,
                            cuda::Stream s) {
  return p2p({false, buf, count * dtype_size(t), peer}, comm, s);
}

nccl::Result FakeNccl::group_start() {
  ++group_depth;
  return {};
}

nccl::Result FakeNccl::group_end() {
  if (group_depth == 0) return failed("invalid usage (fake): group_end without group_start");
  if (--group_depth > 0 || grouped.empty()) return {};
  Comm* c = std::get<0>(grouped.front());
  cuda::Stream s = std::get<1>(grouped.front());
  std::vector<P2p> ops;
  for (auto& [gc, gs, send, buf, bytes, peer] : grouped) {
    if (gc != c || gs != s) {
      grouped.clear();
      return failed("invalid usage (fake): one group over several communicators or streams");
    }
    ops.push_back({send, buf, bytes, peer});
  }
  grouped.clear();
  ++launches;
  cuda_->run_on(s, [this, c, ops] { run_p2p(c, ops); });
  return {};
}

nccl::Result FakeNccl::register_memory(nccl::Comm, void*, size_t, void** handle) {
  static std::atomic<uintptr_t> next{1};
  *handle = reinterpret_cast<void*>(next++);
  ++registered;
  return {};
}

nccl::Result FakeNccl::deregister_memory(nccl::Comm, void*) {
  ++deregistered;
  return {};
}

}  // namespace collie::fake
