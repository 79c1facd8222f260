#include "comm/cuda/staged_backend.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "base/trace.h"
#include "collie/comm.h"

namespace collie::cuda {

namespace {

using Clock = std::chrono::steady_clock;

bool on_device(const Op& op) {
  return !op.in.device.is_cpu() || !op.out.device.is_cpu();
}

// Pinned host memory that frees itself.
class Pinned {
 public:
  Pinned() = default;
  Pinned(Api& api, size_t bytes)
      : api_(&api), p_(api.host_alloc(bytes ? bytes : 1)), bytes_(bytes) {}
  Pinned(Pinned&& o) noexcept { swap(o); }
  Pinned& operator=(Pinned&& o) noexcept {
    swap(o);
    return *this;
  }
  ~Pinned() {
    if (p_) api_->host_free(p_);
  }
  void* get() const { return p_; }
  size_t size() const { return bytes_; }

 private:
  void swap(Pinned& o) noexcept {
    std::swap(api_, o.api_);
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
  }
  Api* api_ = nullptr;
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

using StagedWork = OpCompletion;

struct Job {
  Op op;
  std::shared_ptr<StagedWork> done;
  Stream after = nullptr;  // the issuing thread's stream
};

class Staged final : public Backend {
 public:
  Staged(std::unique_ptr<Backend> inner, std::shared_ptr<Api> api, const BackendContext& ctx,
         DeviceFactory make_device)
      : inner_(std::move(inner)),
        api_(std::move(api)),
        ctx_(ctx),
        chunk_bytes_(config::cuda_chunk_bytes(ctx.env)),
        route_(config::cuda_route(ctx.env)),
        make_device_(std::move(make_device)) {}

  ~Staged() override { stop_thread(); }

  std::string name() const override { return inner_->name(); }
  bool runs_alltoall() const override { return inner_->runs_alltoall(); }
  // CUDA tensors where a device can be used (asked once, at the first).
  bool accepts(const Device& d) const override {
    if (d.is_cpu()) return inner_->accepts(d);
    std::call_once(probed_, [&] { devices_ = api_->device_count(nullptr); });
    return d.kind == Device::Kind::cuda && d.index < devices_;
  }

  // Until the first CUDA tensor the front sends host operations to the
  // inner backend itself (a call through this one cost a small op 20 ns).
  Backend* host_path() override {
    return used_.load(std::memory_order_acquire) ? this : inner_.get();
  }

  Work start(Op op) override {
    const bool dev = on_device(op);
    // Nothing staged yet: straight through.
    if (!dev && !used_.load(std::memory_order_acquire)) return inner_->start(std::move(op));
    if (dev && to_device_backend()) return device_start(std::move(op));
    std::lock_guard lk(mu_);
    if (!dev && queue_.empty() && !busy_) return inner_->start(renumbered(std::move(op), 0));
    used_.store(true, std::memory_order_release);
    auto w = std::make_shared<StagedWork>(op.desc, ctx_.launch.rank, ctx_.launch.timeout);
    // Its timeline entry ends with it (StagedWork's callbacks run where it
    // is finished); the pieces it is staged in have none of their own.
    if (op.trace) trace::end_with(*w, op.trace);
    queue_.push_back({std::move(op), w, dev ? cuda_stream() : nullptr});
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    cv_.notify_one();
    return Work(w);
  }
  std::unique_ptr<Backend> split(const SplitPlan& plan) override {
    auto b = inner_->split(plan);
    if (!b) return nullptr;
    return std::make_unique<Staged>(std::move(b), api_, plan.context, make_device_);
  }

  void abort(const Error& e) override {
    inner_->abort(e);
    if (Backend* d = device_backend()) d->abort(e);
    fail_queued(e);
  }

  void shutdown() override {
    stop_thread();
    if (Backend* d = device_backend()) d->shutdown();
    inner_->shutdown();
    std::lock_guard lk(mu_);
    for (auto& [device, st] : stages_) {
      api_->destroy_event(st.ready);
      api_->destroy_event(st.copied);
      for (int i = 0; i < 2; ++i) {
        api_->destroy_event(st.piece[i]);
        api_->destroy_event(st.back[i]);
      }
      api_->destroy_stream(st.stream);
    }
    stages_.clear();
    st_ = nullptr;
    bufs_[0] = Pinned();
    bufs_[1] = Pinned();
  }

  std::shared_ptr<void> allocate(size_t bytes) override { return inner_->allocate(bytes); }

  // Device memory goes to the device backend, made now if need be (the
  // reducer registers its arenas at construction, on every rank).
  std::shared_ptr<void> register_memory(const TensorView& t) override {
    if (t.device.is_cpu() || !to_device_backend() || !route_error_.empty())
      return inner_->register_memory(t);
    std::lock_guard lk(device_mu_);
    make_device_backend();
    return device_->register_memory(t);
  }

 private:
  // Whether CUDA tensors go to a device backend (nccl) rather than staged
  // (decided at the first, the same way on every rank). NCCL's id goes
  // through the store; a world of one has none and needs none.
  bool to_device_backend() {
    std::call_once(routed_, [&] {
      device_route_ =
          route_ != "staged" && make_device_ && (ctx_.store || ctx_.launch.world_size == 1);
      if (route_ == "nccl" && !device_route_)
        route_error_ = make_device_ ? "COLLIE_CUDA_BACKEND=nccl, but the " + inner_->name() +
                                          " rendezvous has no store to pass NCCL's id through"
                                    : "COLLIE_CUDA_BACKEND=nccl, but this build has no NCCL";
    });
    return device_route_ || !route_error_.empty();
  }

  Backend* device_backend() {
    std::lock_guard lk(device_mu_);
    return device_.get();
  }

  // With device_mu_ held.
  void make_device_backend() {
    if (device_) return;
    BackendContext c = ctx_;
    c.key = ctx_.key + "/cuda";
    device_ = make_device_(c);
  }

  // The device backend's start, making it at the first CUDA tensor.
  Work device_start(Op op) {
    try {
      if (!route_error_.empty()) throw Error(ErrorCode::unavailable, route_error_);
      std::lock_guard lk(device_mu_);
      make_device_backend();
      return device_->start(std::move(op));
    } catch (const Error& e) {
      Error err(e.code(), op.desc.describe() + " on rank " + std::to_string(ctx_.launch.rank) +
                              ": the communicator's CUDA backend could not be made: " + e.what());
      if (ctx_.failure->set(err)) inner_->abort(err);
      trace::finished(op, err);
      return Work::failed(err);
    }
  }

  // Collectives are numbered on from the caller's number by the pieces
  // staged so far; `piece` is this one's place in its operation.
  Op renumbered(Op op, uint32_t piece) const {
    if (!op.p2p()) op.desc.seq += extra_ + piece;
    return op;
  }

  void loop() {
    std::unique_lock lk(mu_);
    for (;;) {
      cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      Job j = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      lk.unlock();
      run(j);
      lk.lock();
      busy_ = false;
    }
  }

  void run(Job& j) {
    const Op& op = j.op;
    trace::started(op);
    if (on_device(op)) trace::algorithm(op, "staged");
    try {
      if (!on_device(op)) {
        Op inner_op;
        {
          std::lock_guard lk(mu_);
          inner_op = renumbered(op, 0);
        }
        inner_op.trace = nullptr;  // ends with j.done
        chain(inner_->start(std::move(inner_op)), j.done);
        return;
      }
      use_device_of(op);
      switch (op.desc.op) {
        case OpKind::allreduce:
        case OpKind::broadcast:
          return pieces(j);
        case OpKind::p2p:
          return p2p(j);
        default:
          return whole(j);
      }
    } catch (const Error& e) {
      Error err(e.code(),
                j.done->description() + " (a CUDA tensor staged through host memory): " + e.what());
      // The peers may be inside the inner operation already: failing the
      // communicator tells them, instead of leaving them to their deadline.
      if (ctx_.failure->set(err)) inner_->abort(err);
      j.done->finish(err);
    }
  }

  // Ends `done` as `w` ends, keeping `keep` (its staging buffer) alive
  // until then.
  static void chain(const Work& w, const std::shared_ptr<StagedWork>& done,
                    std::shared_ptr<void> keep = nullptr) {
    w.completion()->on_complete([w, done, keep] { done->finish(w.error()); });
  }

  // The staging thread works on the device of the op's CUDA tensor: its
  // stream, events and copies are that device's. (A thread starts on device
  // 0: each rank's staging made a context on GPU 0 and copied every tensor
  // through it.)
  void use_device_of(const Op& op) {
    const Device d = op.in.device.is_cpu() ? op.out.device : op.in.device;
    if (!op.in.device.is_cpu() && !op.out.device.is_cpu() && op.in.device.index != d.index)
      throw Error(ErrorCode::invalid_argument,
                  "its input is on cuda:" + std::to_string(op.in.device.index) +
                      " and its output on cuda:" + std::to_string(op.out.device.index) +
                      ": staging takes both on one device");
    std::lock_guard lk(mu_);
    auto it = stages_.find(d.index);
    std::string why;
    if (it == stages_.end() && api_->device_count(&why) <= 0)
      throw Error(ErrorCode::unavailable, "no CUDA device can be used: " + why);
    api_->set_device(d.index);
    device_index_ = d.index;
    if (it == stages_.end()) {
      Stage st;
      st.stream = api_->create_stream();
      st.ready = api_->create_event();
      st.copied = api_->create_event();
      for (int i = 0; i < 2; ++i) {
        st.piece[i] = api_->create_event();
        st.back[i] = api_->create_event();
      }
      it = stages_.emplace(d.index, st).first;
    }
    st_ = &it->second;
  }

  Clock::time_point deadline() const { return Clock::now() + ctx_.launch.timeout; }

  // Waits on the host until the work before `e` on its stream is done.
  void wait_event(Event e, Clock::time_point until) {
    auto step = std::chrono::microseconds(5);
    while (!api_->query(e)) {
      if (Clock::now() >= until)
        throw Error(ErrorCode::timeout, "the device did not finish a staging copy within " +
                                            std::to_string(ctx_.launch.timeout.count()) + " ms");
      std::this_thread::sleep_for(step);
      step = std::min<std::chrono::microseconds>(step * 2, std::chrono::milliseconds(1));
    }
  }

  // The staging stream starts after what the caller queued on its stream.
  void after_caller(const Job& j) {
    api_->record(st_->ready, j.after);
    api_->stream_wait(st_->stream, st_->ready);
  }

  // All-reduce and broadcast, piece by piece through two pinned buffers.
  void pieces(Job& j) {
    const Op& op = j.op;
    const size_t es = dtype_size(op.desc.dtype);
    const size_t per = std::max<size_t>(1, chunk_bytes_ / es);
    const size_t n = op.in.numel;
    const size_t count = std::max<size_t>(1, (n + per - 1) / per);
    const size_t buf_bytes = std::min(n, per) * es;
    for (auto& b : bufs_)
      if (b.size() < buf_bytes) b = Pinned(*api_, buf_bytes);
    // A broadcast's input matters only on its root.
    const bool send_in = op.desc.op == OpKind::allreduce || op.desc.tag == ctx_.launch.rank;
    const auto until = deadline();
    auto len = [&](size_t k) { return std::min(per, n - k * per); };
    auto to_host = [&](size_t k) {
      if (!send_in || n == 0) return;
      api_->copy_async(bufs_[k % 2].get(), static_cast<const char*>(op.in.data) + k * per * es,
                       len(k) * es, st_->stream);
      api_->record(st_->piece[k % 2], st_->stream);
    };
    after_caller(j);
    to_host(0);
    for (size_t k = 0; k < count; ++k) {
      // Queued behind the copy back of piece k-1, which used this buffer.
      if (k + 1 < count) to_host(k + 1);
      if (send_in && n > 0) wait_event(st_->piece[k % 2], until);
      // The copy back of piece k-2 read this buffer (a broadcast's
      // receivers have no copy in to wait for that).
      if (!send_in && k >= 2) wait_event(st_->back[k % 2], until);
      Op piece = op;
      piece.trace = nullptr;
      piece.desc.count = n == 0 ? 0 : len(k);
      piece.in = piece.out =
          TensorView{bufs_[k % 2].get(), op.desc.dtype, n == 0 ? 0 : len(k), Device::cpu()};
      {
        std::lock_guard lk(mu_);
        piece = renumbered(std::move(piece), static_cast<uint32_t>(k));
      }
      inner_->start(std::move(piece)).wait();
      if (n > 0) {
        api_->copy_async(static_cast<char*>(op.out.data) + k * per * es, bufs_[k % 2].get(),
                         len(k) * es, st_->stream);
        api_->record(st_->back[k % 2], st_->stream);
      }
    }
    {
      std::lock_guard lk(mu_);
      extra_ += static_cast<uint32_t>(count - 1);
    }
    api_->record(st_->copied, st_->stream);
    wait_event(st_->copied, until);
    j.done->finish(std::nullopt);
  }

  // All-gather and reduce-scatter: the whole tensor, in and out.
  void whole(Job& j) {
    const Op& op = j.op;
    const auto until = deadline();
    Pinned in(*api_, op.in.nbytes()), out(*api_, op.out.nbytes());
    after_caller(j);
    api_->copy_async(in.get(), op.in.data, op.in.nbytes(), st_->stream);
    api_->record(st_->copied, st_->stream);
    wait_event(st_->copied, until);
    Op staged = op;
    staged.trace = nullptr;
    staged.in = TensorView{in.get(), op.in.dtype, op.in.numel, Device::cpu()};
    staged.out = TensorView{out.get(), op.out.dtype, op.out.numel, Device::cpu()};
    {
      std::lock_guard lk(mu_);
      staged = renumbered(std::move(staged), 0);
    }
    inner_->start(std::move(staged)).wait();
    api_->copy_async(op.out.data, out.get(), op.out.nbytes(), st_->stream);
    api_->record(st_->copied, st_->stream);
    wait_event(st_->copied, until);
    j.done->finish(std::nullopt);
  }

  // A send or receive: staged, not waited for here, so that the next one
  // joins it in the inner backend's batch.
  void p2p(Job& j) {
    const Op& op = j.op;
    auto buf = std::make_shared<Pinned>(*api_, op.in.nbytes());
    Op staged = op;
    staged.trace = nullptr;
    staged.in = staged.out = TensorView{buf->get(), op.in.dtype, op.in.numel, Device::cpu()};
    if (op.is_send) {
      after_caller(j);
      api_->copy_async(buf->get(), op.in.data, op.in.nbytes(), st_->stream);
      api_->record(st_->copied, st_->stream);
      wait_event(st_->copied, deadline());
      chain(inner_->start(std::move(staged)), j.done, buf);
      return;
    }
    Work w = inner_->start(std::move(staged));
    // The copy back runs where the receive ends (the inner backend's
    // continuation thread, which the inner backend's shutdown drains before
    // this backend goes), with an event of its own, waited for up to the
    // deadline as every staging copy is.
    // That thread is on device 0 until told: the copy goes on the op's
    // device (for its duration), on its stage's stream (which the staging
    // thread may have moved on from by then).
    w.completion()->on_complete(
        [this, w, buf, op, done = j.done, device = device_index_, stream = st_->stream] {
          if (auto e = w.error()) return done->finish(e);
          std::optional<Error> err;
          try {
            DeviceScope on(*api_, device);
            Event ev = api_->create_event();
            try {
              api_->copy_async(op.out.data, buf->get(), op.out.nbytes(), stream);
              api_->record(ev, stream);
              wait_event(ev, deadline());
            } catch (...) {
              api_->destroy_event(ev);
              throw;
            }
            api_->destroy_event(ev);
          } catch (const Error& e) {
            err = Error(e.code(),
                        done->description() + ": copying the message to the device: " + e.what());
          }
          done->finish(err);
        });
  }

  void fail_queued(const Error& e) {
    std::deque<Job> q;
    {
      std::lock_guard lk(mu_);
      q.swap(queue_);
    }
    for (Job& j : q)
      j.done->finish(Error(
          e.code(), j.done->description() + " cannot run: the communicator failed: " + e.what()));
  }

  void stop_thread() {
    std::thread t;
    {
      std::lock_guard lk(mu_);
      stop_ = true;
      cv_.notify_all();
      t = std::move(thread_);
    }
    fail_queued(Error(ErrorCode::unavailable, "the communicator was destroyed"));
    if (t.joinable()) t.join();
  }

  std::unique_ptr<Backend> inner_;
  std::shared_ptr<Api> api_;
  const BackendContext ctx_;
  const size_t chunk_bytes_;

  std::string route_;  // COLLIE_CUDA_BACKEND
  DeviceFactory make_device_;
  std::once_flag routed_;
  bool device_route_ = false;
  std::string route_error_;
  std::mutex device_mu_;
  std::unique_ptr<Backend> device_;  // nccl, made at the first CUDA tensor
  mutable std::once_flag probed_;
  mutable int devices_ = 0;
  std::atomic<bool> used_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  bool busy_ = false;
  bool stop_ = false;
  uint32_t extra_ = 0;  // pieces beyond one per staged collective, so far
  std::thread thread_;

  // A device's staging stream and events, made at its first CUDA tensor
  // (stages_, under mu_; a std::map, so a Stage stays where it is).
  struct Stage {
    Stream stream = nullptr;
    Event ready = nullptr, copied = nullptr;
    Event piece[2] = {nullptr, nullptr};  // after each buffer's copy in
    Event back[2] = {nullptr, nullptr};   // after each buffer's copy back
  };
  std::map<int, Stage> stages_;
  // The running op's device and its Stage (the staging thread's).
  int device_index_ = 0;
  Stage* st_ = nullptr;
  Pinned bufs_[2];
};

}  // namespace

std::unique_ptr<Backend> make_staged(std::unique_ptr<Backend> inner, std::shared_ptr<Api> api,
                                     const BackendContext& ctx, DeviceFactory make_device) {
  return std::make_unique<Staged>(std::move(inner), std::move(api), ctx, std::move(make_device));
}

}  // namespace collie::cuda
