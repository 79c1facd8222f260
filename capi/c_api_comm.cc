// capi/c_api_comm.cc: the communicator half of include/collie/collie.h:
// connecting, collectives (blocking, or with a work handle), split, abort,
// the asynchronous error, and the calls on operations in flight. Every entry
// point turns a collie::Error into its status code and keeps the message for
// collie_last_error().
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "base/config.h"
#include "base/reduce.h"
#include "capi/c_api_internal.h"

namespace collie::capi {

namespace {
thread_local std::string g_last_error;
}  // namespace

collie_status fail(collie_status st, std::string msg) {
  g_last_error = std::move(msg);
  return st;
}

TensorView to_view(const collie_tensor& t, const char* what) {
  if (t.dtype < 0 || t.dtype >= kNumDTypes)
    throw Error(ErrorCode::invalid_argument,
                std::string(what) + ": unknown dtype code " + std::to_string(t.dtype));
  if (t.device_type != COLLIE_CPU && t.device_type != COLLIE_CUDA)
    throw Error(ErrorCode::invalid_argument,
                std::string(what) + ": unknown device type " + std::to_string(t.device_type));
  Device d = t.device_type == COLLIE_CPU ? Device::cpu() : Device::cuda(t.device_index);
  return TensorView{t.data, static_cast<DType>(t.dtype), t.numel, d};
}

collie_tensor from_view(const TensorView& v) {
  collie_tensor t{};
  t.data = v.data;
  t.numel = v.numel;
  t.dtype = static_cast<int32_t>(v.dtype);
  t.device_type = v.device.is_cpu() ? COLLIE_CPU : COLLIE_CUDA;
  t.device_index = v.device.index;
  return t;
}

ReduceOp to_op(int op) {
  if (op < 0 || op >= kNumReduceOps)
    throw Error(ErrorCode::invalid_argument, "unknown reduce op code " + std::to_string(op));
  return static_cast<ReduceOp>(op);
}

collie_status null_argument(const char* func, const char* name) {
  return fail(COLLIE_ERR_INVALID_ARGUMENT, std::string(func) + ": " + name + " is NULL");
}

namespace {

// collie_comm_options as ABI 1 laid it out: no struct_tag, rank at offset 4.
struct CommOptionsV1 {
  uint32_t struct_size;
  int32_t rank;
  int32_t world_size;
  const char* master_addr;
  int32_t master_port;
  const char* backend;
  double timeout_seconds;
};
static_assert(sizeof(CommOptionsV1) == 48);

Options to_options(const collie_comm_options* o) {
  Options opt;
  if (!o) return opt;
  collie_comm_options c = COLLIE_COMM_OPTIONS_INIT;
  if (is_struct_tag(o->struct_tag)) {
    if (o->struct_size < offsetof(collie_comm_options, local_world_size))
      throw Error(ErrorCode::invalid_argument,
                  "collie_comm_connect: options struct_size is " + std::to_string(o->struct_size) +
                      ", smaller than any version of collie_comm_options");
    c = read_struct(o, c);
  } else {
    // ABI 1's struct: rank where the tag is now; its struct_size tells it.
    if (o->struct_size != sizeof(CommOptionsV1))
      throw Error(ErrorCode::invalid_argument,
                  "collie_comm_connect: options struct_size is " + std::to_string(o->struct_size) +
                      " and there is no struct_tag: initialise the options with "
                      "COLLIE_COMM_OPTIONS_INIT or collie_comm_options_init");
    CommOptionsV1 v1;
    std::memcpy(&v1, o, sizeof v1);
    c.rank = v1.rank;
    c.world_size = v1.world_size;
    c.master_addr = v1.master_addr;
    c.master_port = v1.master_port;
    c.backend = v1.backend;
    c.timeout_seconds = v1.timeout_seconds;
  }
  opt.rank = c.rank;
  opt.world_size = c.world_size;
  opt.local_rank = c.local_rank;
  opt.local_world_size = c.local_world_size;
  if (c.master_addr) opt.master_addr = c.master_addr;
  opt.master_port = c.master_port;
  if (c.backend) opt.backend = c.backend;
  if (c.secret) opt.secret = c.secret;
  opt.deterministic = c.deterministic < 0 ? -1 : c.deterministic != 0;
  if (c.timeout_seconds > 0)
    opt.timeout = std::chrono::milliseconds(static_cast<long long>(c.timeout_seconds * 1000));
  return opt;
}

collie_comm* wrap(std::unique_ptr<Communicator> c) {
  auto h = std::make_unique<collie_comm>();
  h->backend = c->backend();
  h->owned = std::move(c);
  h->comm = h->owned.get();
  return h.release();
}

// An op through the C ABI: with `work`, hands back the handle `start`
// returns at once; without, blocks through `block` (a collective's
// blocking form, which may run it on this thread without a Work at all)
// and reports the operation's own status.
template <typename Start, typename Block>
collie_status run(collie_work** work, Start&& start, Block&& block) {
  if (work) *work = nullptr;
  return guarded([&] {
    if (work)
      *work = new collie_work{start()};
    else
      block();
  });
}
// An op without a blocking form (send, recv): without `work`, its Work is
// waited for.
template <typename Start>
collie_status run(collie_work** work, Start&& start) {
  return run(work, start, [&] { start().wait(); });
}

collie_status status_of(const Work& w) {
  if (!w.done()) return COLLIE_IN_PROGRESS;
  if (auto e = w.error()) return fail(static_cast<collie_status>(e->code()), e->what());
  return COLLIE_OK;
}

}  // namespace

}  // namespace collie::capi

using namespace collie::capi;

extern "C" {

const char* collie_last_error(void) {
  return g_last_error.c_str();
}

int collie_abi_version(void) {
  return COLLIE_ABI_VERSION;
}

// ABI 1's exported initialiser, for programs built against it: writes
// ABI 1's 48-byte struct (programs built since use the header's inline one).
void collie_comm_options_init(collie_comm_options* o) {
  if (!o) return;
  CommOptionsV1 v1{sizeof(CommOptionsV1), -1, -1, nullptr, -1, nullptr, 0.0};
  std::memcpy(static_cast<void*>(o), &v1, sizeof v1);
}

collie_status collie_comm_connect(const collie_comm_options* o, collie_comm** out) {
  COLLIE_REQUIRE(out, "out");
  *out = nullptr;
  return guarded([&] {
    collie::Options opt = to_options(o);
    // Under COLLIE_JOIN=1 connect() joins (as collie_comm_join); the same
    // reading of the variables that connect() makes says so.
    bool joins = collie::config::resolve_launch(opt, collie::config::process_env()).join;
    *out = wrap(collie::connect(opt));
    (*out)->joined = joins;
  });
}

collie_status collie_comm_destroy(collie_comm* c) {
  if (c && !c->owned)
    return fail(COLLIE_ERR_INVALID_ARGUMENT,
                "collie_comm_destroy: this is the reducer's communicator as lent to a comm hook; "
                "only a communicator from collie_comm_connect or collie_comm_split may be "
                "destroyed");
  return guarded([&] { delete c; });
}

collie_status collie_comm_rank(const collie_comm* c, int* rank) {
  COLLIE_REQUIRE(c, "comm");
  COLLIE_REQUIRE(rank, "rank");
  *rank = c->comm->rank();
  return COLLIE_OK;
}

collie_status collie_comm_size(const collie_comm* c, int* size) {
  COLLIE_REQUIRE(c, "comm");
  COLLIE_REQUIRE(size, "size");
  *size = c->comm->size();
  return COLLIE_OK;
}

collie_status collie_comm_backend(const collie_comm* c, const char** name) {
  COLLIE_REQUIRE(c, "comm");
  COLLIE_REQUIRE(name, "name");
  *name = c->backend.empty() ? "" : c->backend.c_str();
  return COLLIE_OK;
}

collie_status collie_comm_allreduce(collie_comm* c, collie_tensor in, collie_tensor out,
                                    collie_op op, collie_work** work) {
  COLLIE_REQUIRE(c, "comm");
  return run(
      work, [&] { return c->comm->allreduce(to_view(in, "in"), to_view(out, "out"), to_op(op)); },
      [&] {
        c->comm->allreduce(to_view(in, "in"), to_view(out, "out"), to_op(op), collie::blocking);
      });
}

collie_status collie_comm_broadcast(collie_comm* c, collie_tensor buf, int root,
                                    collie_work** work) {
  COLLIE_REQUIRE(c, "comm");
  return run(
      work, [&] { return c->comm->broadcast(to_view(buf, "buf"), root); },
      [&] { c->comm->broadcast(to_view(buf, "buf"), root, collie::blocking); });
}

collie_status collie_comm_allgather(collie_comm* c, collie_tensor in, collie_tensor out,
                                    collie_work** work) {
  COLLIE_REQUIRE(c, "comm");
  return run(
      work, [&] { return c->comm->allgather(to_view(in, "in"), to_view(out, "out")); },
      [&] { c->comm->allgather(to_view(in, "in"), to_view(out, "out"), collie::blocking); });
}

collie_status collie_comm_alltoall(collie_comm* c, collie_tensor in, collie_tensor out,
                                   collie_work** work) {
  COLLIE_REQUIRE(c, "comm");
  return run(
      work, [&] { return c->comm->alltoall(to_view(in, "in"), to_view(out, "out")); },
      [&] { c->comm->alltoall(to_view(in, "in"), to_view(out, "out"), collie::blocking); });
}

collie_status collie_comm_alltoallv(collie_comm* c, collie_tensor in, const size_t* send_counts,
                                    collie_tensor out, const size_t* recv_counts,
                                    collie_work** work) {
  COLLIE_REQUIRE(c, "comm");
  COLLIE_REQUIRE(send_counts, "send_counts");
  COLLIE_REQUIRE(recv_counts, "recv_counts");
  const auto n = static_cast<size_t>(c->comm->size());
  auto start = [&] {
    return c->comm->alltoallv(to_view(in, "in"), std::vector<size_t>(send_counts, send_counts + n),
                              to_view(out, "out"),
                              std::vector<size_t>(recv_counts, recv_counts + n));
  };
  return run(work, start, [&] { start().wait(); });
}

collie_status collie_comm_reduce_scatter(collie_comm* c, collie_tensor in, collie_tensor out,
                                         collie_op op, collie_work** work) {
  COLLIE_REQUIRE(c, "comm");
  return run(
      work,
      [&] { return c->comm->reduce_scatter(to_view(in, "in"), to_view(out, "out"), to_op(op)); },
      [&] {
        c->comm->reduce_scatter(to_view(in, "in"), to_view(out, "out"), to_op(op),
                                collie::blocking);
      });
}

collie_status collie_comm_barrier(collie_comm* c, collie_work** work) {
  COLLIE_REQUIRE(c, "comm");
  return run(
      work, [&] { return c->comm->barrier(); }, [&] { c->comm->barrier(collie::blocking); });
}

collie_status collie_comm_send(collie_comm* c, collie_tensor buf, int peer, int tag,
                               collie_work** work) {
  COLLIE_REQUIRE(c, "comm");
  return run(work, [&] { return c->comm->send(to_view(buf, "buf"), peer, tag); });
}

collie_status collie_comm_recv(collie_comm* c, collie_tensor buf, int peer, int tag,
                               collie_work** work) {
  COLLIE_REQUIRE(c, "comm");
  return run(work, [&] { return c->comm->recv(to_view(buf, "buf"), peer, tag); });
}

collie_status collie_comm_arrivals(collie_comm* c, uint64_t* collectives, uint64_t* last,
                                   double* median_late_ms, char* summary, size_t cap) {
  COLLIE_REQUIRE(c, "comm");
  COLLIE_REQUIRE(collectives, "collectives");
  return guarded([&] {
    const collie::Arrivals a = c->comm->arrivals();
    const size_t n = static_cast<size_t>(c->comm->size());
    *collectives = a.collectives;
    for (size_t r = 0; r < n; ++r) {
      if (last) last[r] = r < a.last.size() ? a.last[r] : 0;
      if (median_late_ms) median_late_ms[r] = r < a.median_late_ms.size() ? a.median_late_ms[r] : 0;
    }
    if (summary && cap) {
      const std::string s = a.summary();
      const size_t k = std::min(cap - 1, s.size());
      std::memcpy(summary, s.data(), k);
      summary[k] = '\0';
    }
  });
}

collie_status collie_comm_split(collie_comm* c, int color, int key, collie_comm** out) {
  COLLIE_REQUIRE(c, "comm");
  COLLIE_REQUIRE(out, "out");
  *out = nullptr;
  return guarded([&] {
    auto sub = c->comm->split(color, key);
    if (sub) *out = wrap(std::move(sub));
  });
}

collie_status collie_comm_shrink(collie_comm* c, const int* exclude, size_t n_exclude, int wait_ms,
                                 collie_comm** out) {
  COLLIE_REQUIRE(c, "comm");
  COLLIE_REQUIRE(out, "out");
  COLLIE_REQUIRE(exclude || n_exclude == 0, "exclude");
  *out = nullptr;
  return guarded([&] {
    std::vector<int> ex(exclude, exclude + n_exclude);
    *out = wrap(c->comm->shrink(ex, std::chrono::milliseconds(wait_ms > 0 ? wait_ms : 0)));
  });
}

collie_status collie_comm_grow(collie_comm* c, int joiners, int wait_ms, collie_comm** out) {
  COLLIE_REQUIRE(c, "comm");
  COLLIE_REQUIRE(out, "out");
  *out = nullptr;
  return guarded([&] {
    *out = wrap(c->comm->grow(joiners, std::chrono::milliseconds(wait_ms > 0 ? wait_ms : 0)));
  });
}

collie_status collie_comm_join(const collie_comm_options* o, collie_comm** out) {
  COLLIE_REQUIRE(out, "out");
  *out = nullptr;
  return guarded([&] {
    *out = wrap(collie::join(to_options(o)));
    (*out)->joined = true;
  });
}

collie_status collie_comm_joined(const collie_comm* c, int* out) {
  COLLIE_REQUIRE(c, "comm");
  COLLIE_REQUIRE(out, "out");
  *out = c->joined ? 1 : 0;
  return COLLIE_OK;
}

collie_status collie_comm_abort(collie_comm* c, const char* reason) {
  COLLIE_REQUIRE(c, "comm");
  return guarded([&] { c->comm->abort(reason ? reason : "(no reason given)"); });
}

collie_status collie_comm_get_async_error(collie_comm* c) {
  COLLIE_REQUIRE(c, "comm");
  if (auto e = c->comm->error()) return fail(static_cast<collie_status>(e->code()), e->what());
  return COLLIE_OK;
}

namespace {

// What collie_comm_mem_alloc handed out, by address: the memory lives until
// collie_mem_free, whatever happens to the communicator.
struct Allocations {
  std::mutex mu;
  std::map<void*, std::shared_ptr<void>> live;
};
Allocations& allocations() {
  static auto* a = new Allocations;  // never destroyed: freed at exit is fine
  return *a;
}

}  // namespace

collie_status collie_comm_mem_alloc(collie_comm* c, size_t bytes, void** out) {
  COLLIE_REQUIRE(c, "comm");
  COLLIE_REQUIRE(out, "out");
  *out = nullptr;
  return guarded([&] {
    std::shared_ptr<void> p = c->comm->allocate(bytes);
    Allocations& a = allocations();
    std::lock_guard lk(a.mu);
    a.live[p.get()] = p;
    *out = p.get();
  });
}

collie_status collie_mem_free(void* ptr) {
  if (!ptr) return COLLIE_OK;
  std::shared_ptr<void> gone;  // released outside the lock
  {
    Allocations& a = allocations();
    std::lock_guard lk(a.mu);
    auto it = a.live.find(ptr);
    if (it == a.live.end())
      return fail(COLLIE_ERR_INVALID_ARGUMENT,
                  "collie_mem_free: this pointer did not come from collie_comm_mem_alloc, or "
                  "was freed already");
    gone = std::move(it->second);
    a.live.erase(it);
  }
  return COLLIE_OK;
}

collie_status collie_convert(collie_tensor src, collie_tensor dst, int divisor) {
  return guarded([&] {
    const collie::TensorView s = to_view(src, "src"), d = to_view(dst, "dst");
    if (!s.device.is_cpu() || !d.device.is_cpu())
      throw collie::Error(collie::ErrorCode::invalid_argument,
                          "collie_convert: src and dst must be host tensors");
    if (!collie::is_floating(s.dtype) || !collie::is_floating(d.dtype))
      throw collie::Error(
          collie::ErrorCode::invalid_argument,
          std::string("collie_convert: ") + std::string(collie::to_string(s.dtype)) + " to " +
              std::string(collie::to_string(d.dtype)) + ": float types only (f32, f16, bf16, f64)");
    if (s.numel != d.numel)
      throw collie::Error(collie::ErrorCode::invalid_argument,
                          "collie_convert: src has " + std::to_string(s.numel) + " elements, dst " +
                              std::to_string(d.numel));
    if (divisor < 1)
      throw collie::Error(collie::ErrorCode::invalid_argument,
                          "collie_convert: divisor " + std::to_string(divisor) + " is below 1");
    if (s.numel && (!s.data || !d.data))
      throw collie::Error(collie::ErrorCode::invalid_argument, "collie_convert: a NULL buffer");
    const auto* sb = static_cast<const uint8_t*>(s.data);
    const auto* db = static_cast<const uint8_t*>(d.data);
    if (sb < db + d.nbytes() && db < sb + s.nbytes())
      throw collie::Error(collie::ErrorCode::invalid_argument,
                          "collie_convert: src and dst overlap");
    collie::kernels::convert(s.dtype, s.data, d.dtype, d.data, s.numel, divisor);
  });
}

collie_status collie_work_wait(collie_work* w) {
  COLLIE_REQUIRE(w, "work");
  return guarded([&] { w->work.wait(); });
}

collie_status collie_work_wait_for(collie_work* w, double seconds) {
  COLLIE_REQUIRE(w, "work");
  if (!(seconds >= 0))
    return fail(COLLIE_ERR_INVALID_ARGUMENT, "collie_work_wait_for: seconds must be 0 or more");
  return guarded(
      [&] { w->work.wait(std::chrono::milliseconds(static_cast<long long>(seconds * 1000))); });
}

collie_status collie_work_query(collie_work* w) {
  COLLIE_REQUIRE(w, "work");
  return status_of(w->work);
}

collie_status collie_work_wait_stream(collie_work* w, void* stream) {
  COLLIE_REQUIRE(w, "work");
  return guarded([&] { w->work.wait_on(stream); });
}

collie_status collie_set_cuda_stream(void* stream) {
  return guarded([&] { collie::set_cuda_stream(stream); });
}

collie_status collie_work_test(collie_work* w, int* done) {
  COLLIE_REQUIRE(w, "work");
  COLLIE_REQUIRE(done, "done");
  *done = w->work.done() ? 1 : 0;
  if (auto e = w->work.error()) return fail(static_cast<collie_status>(e->code()), e->what());
  return COLLIE_OK;
}

collie_status collie_work_free(collie_work* w) {
  delete w;
  return COLLIE_OK;
}

collie_status collie_work_on_complete(collie_work* w, collie_work_callback fn, void* user) {
  COLLIE_REQUIRE(w, "work");
  COLLIE_REQUIRE(fn, "fn");
  return guarded([&] {
    w->work.then([fn, user](const collie::Work& done) {
      if (auto e = done.error())
        fn(user, static_cast<collie_status>(e->code()), e->what());
      else
        fn(user, COLLIE_OK, nullptr);
    });
  });
}

// ABI 1's names.

collie_status collie_allreduce(collie_comm* c, collie_tensor in, collie_tensor out, collie_op op) {
  return collie_comm_allreduce(c, in, out, op, nullptr);
}

collie_status collie_broadcast(collie_comm* c, collie_tensor buf, int root) {
  return collie_comm_broadcast(c, buf, root, nullptr);
}

collie_status collie_allgather(collie_comm* c, collie_tensor in, collie_tensor out) {
  return collie_comm_allgather(c, in, out, nullptr);
}

collie_status collie_barrier(collie_comm* c) {
  return collie_comm_barrier(c, nullptr);
}

collie_status collie_allreduce_async(collie_comm* c, collie_tensor in, collie_tensor out,
                                     collie_op op, collie_work** w) {
  COLLIE_REQUIRE(w, "work");
  return collie_comm_allreduce(c, in, out, op, w);
}

}  // extern "C"
