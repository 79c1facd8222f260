// reducer/c_api.cc: include/collie/collie.h over the C++ API. It sits at
// the top of the stack (it needs both the communicator and the reducer);
// every entry point turns a collie::Error into its status code and keeps the
// message for collie_last_error().
#include <atomic>
#include <cstddef>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collie/collie.h"
#include "collie/comm.h"
#include "hooks/model_averager.h"
#include "reducer/reducer.h"

struct collie_comm {
  std::unique_ptr<collie::Communicator> owned;  // null for the view handed to C hooks
  // The view's reference: a C hook that calls it after the communicator is
  // gone gets an error, not freed memory.
  std::shared_ptr<collie::Communicator> shared;
  collie::Communicator* comm = nullptr;
};

struct collie_work {
  collie::Work work;
};

struct collie_averager {
  std::unique_ptr<collie::PeriodicModelAverager> periodic;
  std::unique_ptr<collie::HierarchicalModelAverager> hierarchical;
};

// One call of a C hook: the Work the reducer waits for, and what the
// collie_grad_bucket points into (alive until the hook completes).
struct collie_hook_done {
  collie::Work work;
};

struct collie_reducer {
  std::unique_ptr<collie::Reducer> reducer;
};

namespace {

thread_local std::string g_last_error;

collie_status fail(collie_status st, std::string msg) {
  g_last_error = std::move(msg);
  return st;
}

// Runs fn, mapping exceptions to status codes.
template <typename Fn>
collie_status guarded(Fn&& fn) {
  try {
    fn();
    return COLLIE_OK;
  } catch (const collie::Error& e) {
    return fail(static_cast<collie_status>(e.code()), e.what());
  } catch (const std::bad_alloc&) {
    return fail(COLLIE_ERR_INTERNAL, "out of memory");
  } catch (const std::exception& e) {
    return fail(COLLIE_ERR_INTERNAL, e.what());
  }
}

collie::TensorView to_view(const collie_tensor& t, const char* what) {
  if (t.dtype < 0 || t.dtype >= collie::kNumDTypes)
    throw collie::Error(collie::ErrorCode::invalid_argument,
                        std::string(what) + ": unknown dtype code " + std::to_string(t.dtype));
  if (t.device_type != COLLIE_CPU && t.device_type != COLLIE_CUDA)
    throw collie::Error(
        collie::ErrorCode::invalid_argument,
        std::string(what) + ": unknown device type " + std::to_string(t.device_type));
  collie::Device d =
      t.device_type == COLLIE_CPU ? collie::Device::cpu() : collie::Device::cuda(t.device_index);
  return collie::TensorView{t.data, static_cast<collie::DType>(t.dtype), t.numel, d};
}

collie_tensor from_view(const collie::TensorView& v) {
  collie_tensor t{};
  t.data = v.data;
  t.numel = v.numel;
  t.dtype = static_cast<int32_t>(v.dtype);
  t.device_type = v.device.is_cpu() ? COLLIE_CPU : COLLIE_CUDA;
  t.device_index = v.device.index;
  return t;
}

collie::ReduceOp to_op(int op) {
  if (op < 0 || op >= collie::kNumReduceOps)
    throw collie::Error(collie::ErrorCode::invalid_argument,
                        "unknown reduce op code " + std::to_string(op));
  return static_cast<collie::ReduceOp>(op);
}

// The sizes of the option and stats structs in the first ABI: the smallest
// a caller may pass. Fields after them are read or written only when the
// caller's struct_size covers them.
constexpr uint32_t kReducerOptionsV1 = offsetof(collie_reducer_options, comm_hook);
constexpr uint32_t kReducerStatsV1 = offsetof(collie_reducer_stats, gradient_bytes);
template <typename S>
bool has_field(const S* s, size_t offset, size_t size) {
  return s->struct_size >= offset + size;
}

// The checkpoint calls' protocol: *size is always the state's size; the
// bytes are copied only when the caller's buffer holds them all.
void copy_out(const collie::Bytes& state, void* buf, size_t capacity, size_t* size) {
  *size = state.size();
  if (buf && capacity >= state.size()) std::memcpy(buf, state.data(), state.size());
}
collie::Bytes bytes_in(const void* buf, size_t size) {
  const uint8_t* b = static_cast<const uint8_t*>(buf);
  return collie::Bytes(b, b + size);
}

collie_status null_argument(const char* func, const char* name) {
  return fail(COLLIE_ERR_INVALID_ARGUMENT, std::string(func) + ": " + name + " is NULL");
}

#define COLLIE_REQUIRE(ptr, name) \
  if (!(ptr)) return null_argument(__func__, name)

}  // namespace

extern "C" {

const char* collie_last_error(void) {
  return g_last_error.c_str();
}
int collie_abi_version(void) {
  return COLLIE_ABI_VERSION;
}

void collie_comm_options_init(collie_comm_options* o) {
  if (!o) return;
  std::memset(o, 0, sizeof *o);
  o->struct_size = sizeof *o;
  o->rank = o->world_size = o->master_port = -1;
}

collie_status collie_comm_connect(const collie_comm_options* o, collie_comm** out) {
  COLLIE_REQUIRE(out, "out");
  *out = nullptr;
  if (o && o->struct_size < sizeof(collie_comm_options))
    return fail(COLLIE_ERR_INVALID_ARGUMENT, "collie_comm_connect: options struct_size is " +
                                                 std::to_string(o->struct_size) +
                                                 "; call collie_comm_options_init first");
  return guarded([&] {
    collie::Options opt;
    if (o) {
      opt.rank = o->rank;
      opt.world_size = o->world_size;
      if (o->master_addr) opt.master_addr = o->master_addr;
      opt.master_port = o->master_port;
      if (o->backend) opt.backend = o->backend;
      if (o->timeout_seconds > 0)
        opt.timeout = std::chrono::milliseconds(static_cast<long long>(o->timeout_seconds * 1000));
    }
    auto c = std::make_unique<collie_comm>();
    c->owned = collie::connect(opt);
    c->comm = c->owned.get();
    *out = c.release();
  });
}

collie_status collie_comm_destroy(collie_comm* c) {
  if (c && !c->owned)
    return fail(COLLIE_ERR_INVALID_ARGUMENT,
                "collie_comm_destroy: this is the reducer's communicator as lent to a comm hook; "
                "only a communicator from collie_comm_connect may be destroyed");
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

collie_status collie_allreduce(collie_comm* c, collie_tensor in, collie_tensor out, collie_op op) {
  COLLIE_REQUIRE(c, "comm");
  return guarded(
      [&] { c->comm->allreduce(to_view(in, "in"), to_view(out, "out"), to_op(op)).wait(); });
}

collie_status collie_broadcast(collie_comm* c, collie_tensor buf, int root) {
  COLLIE_REQUIRE(c, "comm");
  return guarded([&] { c->comm->broadcast(to_view(buf, "buf"), root).wait(); });
}

collie_status collie_allgather(collie_comm* c, collie_tensor in, collie_tensor out) {
  COLLIE_REQUIRE(c, "comm");
  return guarded([&] { c->comm->allgather(to_view(in, "in"), to_view(out, "out")).wait(); });
}

collie_status collie_barrier(collie_comm* c) {
  COLLIE_REQUIRE(c, "comm");
  return guarded([&] { c->comm->barrier().wait(); });
}

void collie_reducer_options_init(collie_reducer_options* o) {
  if (!o) return;
  std::memset(o, 0, sizeof *o);
  o->struct_size = sizeof *o;
  collie::ReducerOptions d;
  o->first_bucket_bytes = d.first_bucket_bytes;
  o->bucket_bytes = d.bucket_bytes;
  o->broadcast_parameters = 1;
}

collie_status collie_reducer_create(collie_comm* c, const collie_tensor* params,
                                    const collie_tensor* grads, size_t n,
                                    const collie_reducer_options* o, collie_reducer** out) {
  COLLIE_REQUIRE(c, "comm");
  COLLIE_REQUIRE(out, "out");
  *out = nullptr;
  if (n > 0 && !params)
    return fail(COLLIE_ERR_INVALID_ARGUMENT, "collie_reducer_create: params is NULL");
  // The struct grows at its end: a caller built against an older header
  // passes a smaller size, and the fields it does not have keep defaults.
  if (o && o->struct_size < kReducerOptionsV1)
    return fail(COLLIE_ERR_INVALID_ARGUMENT, "collie_reducer_create: options struct_size is " +
                                                 std::to_string(o->struct_size) +
                                                 "; call collie_reducer_options_init first");
  return guarded([&] {
    collie::ReducerOptions opt;
    if (o) {
      opt.first_bucket_bytes = o->first_bucket_bytes;
      opt.bucket_bytes = o->bucket_bytes;
      opt.gradient_as_bucket_view = o->gradient_as_bucket_view != 0;
      opt.find_unused_parameters = o->find_unused_parameters != 0;
      opt.static_graph = o->static_graph != 0;
      opt.broadcast_parameters = o->broadcast_parameters != 0;
      if (has_field(o, offsetof(collie_reducer_options, comm_hook), sizeof o->comm_hook) &&
          o->comm_hook)
        opt.comm_hook = o->comm_hook;
    }
    const uint64_t* rows =
        o && has_field(o, offsetof(collie_reducer_options, param_rows), sizeof o->param_rows)
            ? o->param_rows
            : nullptr;
    if (!grads && !opt.gradient_as_bucket_view)
      throw collie::Error(
          collie::ErrorCode::invalid_argument,
          "collie_reducer_create: grads is NULL, which needs gradient_as_bucket_view");
    std::vector<collie::Parameter> ps;
    for (size_t i = 0; i < n; ++i)
      ps.push_back({to_view(params[i], "params[i]"),
                    grads ? to_view(grads[i], "grads[i]") : collie::TensorView{},
                    rows ? static_cast<size_t>(rows[i]) : 0});
    auto r = std::make_unique<collie_reducer>();
    r->reducer = std::make_unique<collie::Reducer>(*c->comm, std::move(ps), opt);
    *out = r.release();
  });
}

collie_status collie_reducer_destroy(collie_reducer* r) {
  return guarded([&] { delete r; });
}

collie_status collie_reducer_prepare(collie_reducer* r, const uint8_t* used, size_t n) {
  COLLIE_REQUIRE(r, "reducer");
  return guarded([&] {
    std::vector<bool> mask;
    if (used) mask.assign(used, used + n);
    r->reducer->prepare_for_backward(mask);
  });
}

collie_status collie_reducer_mark_ready(collie_reducer* r, size_t param) {
  COLLIE_REQUIRE(r, "reducer");
  return guarded([&] { r->reducer->mark_grad_ready(param); });
}

collie_status collie_reducer_finalize(collie_reducer* r) {
  COLLIE_REQUIRE(r, "reducer");
  return guarded([&] { r->reducer->finalize_backward(); });
}

collie_status collie_reducer_grad_view(collie_reducer* r, size_t param, collie_tensor* out) {
  COLLIE_REQUIRE(r, "reducer");
  COLLIE_REQUIRE(out, "out");
  return guarded([&] { *out = from_view(r->reducer->grad_view(param)); });
}

collie_status collie_reducer_set_no_sync(collie_reducer* r, int on) {
  COLLIE_REQUIRE(r, "reducer");
  return guarded([&] { r->reducer->set_no_sync(on != 0); });
}

collie_status collie_reducer_set_comm_hook(collie_reducer* r, const char* spec) {
  COLLIE_REQUIRE(r, "reducer");
  COLLIE_REQUIRE(spec, "spec");
  return guarded([&] { r->reducer->set_comm_hook(std::string(spec)); });
}

collie_status collie_reducer_get_stats(const collie_reducer* r, collie_reducer_stats* out) {
  COLLIE_REQUIRE(r, "reducer");
  COLLIE_REQUIRE(out, "out");
  if (out->struct_size < kReducerStatsV1)
    return fail(COLLIE_ERR_INVALID_ARGUMENT,
                "collie_reducer_get_stats: set out->struct_size = sizeof(collie_reducer_stats)");
  const auto& s = r->reducer->last_stats();
  out->iteration = s.iteration;
  out->backward_us = s.backward_us;
  out->exposed_us = s.exposed_us;
  out->comm_us_total = 0;
  for (double us : s.bucket_comm_us) out->comm_us_total += us;
  out->num_buckets = static_cast<uint32_t>(s.bucket_comm_us.size());
  if (has_field(out, offsetof(collie_reducer_stats, gradient_bytes), sizeof out->gradient_bytes))
    out->gradient_bytes = s.gradient_bytes;
  if (has_field(out, offsetof(collie_reducer_stats, hook_bytes), sizeof out->hook_bytes))
    out->hook_bytes = s.hook_bytes;
  return COLLIE_OK;
}

collie_status collie_reducer_get_bucket_times(const collie_reducer* r, double* us, size_t capacity,
                                              size_t* count) {
  COLLIE_REQUIRE(r, "reducer");
  COLLIE_REQUIRE(count, "count");
  if (capacity > 0 && !us)
    return fail(COLLIE_ERR_INVALID_ARGUMENT, "collie_reducer_get_bucket_times: us is NULL");
  const auto& t = r->reducer->last_stats().bucket_comm_us;
  for (size_t i = 0; i < t.size() && i < capacity; ++i) us[i] = t[i];
  *count = t.size();
  return COLLIE_OK;
}

collie_status collie_reducer_save_state(collie_reducer* r, void* buf, size_t capacity,
                                        size_t* size) {
  COLLIE_REQUIRE(r, "reducer");
  COLLIE_REQUIRE(size, "size");
  return guarded([&] { copy_out(r->reducer->save_state(), buf, capacity, size); });
}

collie_status collie_reducer_load_state(collie_reducer* r, const void* buf, size_t size) {
  COLLIE_REQUIRE(r, "reducer");
  if (size > 0 && !buf)
    return fail(COLLIE_ERR_INVALID_ARGUMENT, "collie_reducer_load_state: buf is NULL");
  return guarded([&] { r->reducer->load_state(bytes_in(buf, size)); });
}

collie_status collie_allreduce_async(collie_comm* c, collie_tensor in, collie_tensor out,
                                     collie_op op, collie_work** w) {
  COLLIE_REQUIRE(c, "comm");
  COLLIE_REQUIRE(w, "work");
  *w = nullptr;
  return guarded([&] {
    auto h = std::make_unique<collie_work>();
    h->work = c->comm->allreduce(to_view(in, "in"), to_view(out, "out"), to_op(op));
    *w = h.release();
  });
}

collie_status collie_work_wait(collie_work* w) {
  COLLIE_REQUIRE(w, "work");
  return guarded([&] { w->work.wait(); });
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

}  // extern "C"

namespace {

// A hook written in C, behind the C++ CommHook interface.
class CHook final : public collie::CommHook {
 public:
  CHook(std::string name, collie_comm_hook_fn fn, void* user)
      : name_(std::move(name)), fn_(fn), user_(user) {}
  std::string name() const override { return name_; }

  collie::Work run(collie::Communicator& comm, collie::GradBucket& b) override {
    if (!view_ || viewed_ != &comm) {
      view_ = std::make_unique<collie_comm>();
      view_->shared = comm.share();
      view_->comm = view_->shared.get();
      viewed_ = &comm;
    }
    // The deadline is generous: the hook may run several collectives.
    auto done = new collie_hook_done;
    done->work =
        collie::Work::pending("comm hook '" + name_ + "' on bucket " + std::to_string(b.index) +
                                  " (rank " + std::to_string(comm.rank()) + ")",
                              comm.timeout() * 2 + std::chrono::seconds(1));
    collie::Work w = done->work;
    std::vector<collie_tensor> grads, params;
    std::vector<uint64_t> rows;
    for (size_t k = 0; k < b.grads.size(); ++k) {
      grads.push_back(from_view(b.grads[k]));
      params.push_back(k < b.params.size() ? from_view(b.params[k]) : collie_tensor{});
      rows.push_back(k < b.rows.size() ? b.rows[k] : 0);
    }
    collie_grad_bucket cb{};
    cb.index = b.index;
    cb.buffer = from_view(b.buffer);
    cb.num_grads = grads.size();
    cb.grads = grads.data();
    cb.params = params.data();
    cb.rows = rows.data();
    cb.is_last = b.is_last ? 1 : 0;
    cb.iteration = b.iteration;
    fn_(user_, view_.get(), &cb, done);
    return w;
  }

 private:
  std::string name_;
  collie_comm_hook_fn fn_;
  void* user_;
  std::unique_ptr<collie_comm> view_;
  const collie::Communicator* viewed_ = nullptr;  // what view_ refers to
};

}  // namespace

extern "C" {

collie_status collie_register_comm_hook(const char* name, collie_comm_hook_fn fn, void* user) {
  COLLIE_REQUIRE(name, "name");
  COLLIE_REQUIRE(fn, "fn");
  return guarded([&] {
    std::string n = name;
    collie::register_comm_hook(n, {}, [n, fn, user](const collie::HookParams&) {
      return std::make_unique<CHook>(n, fn, user);
    });
  });
}

collie_status collie_hook_complete(collie_hook_done* done, collie_status status,
                                   const char* message) {
  COLLIE_REQUIRE(done, "done");
  collie::Work w = done->work;
  delete done;
  if (status == COLLIE_OK) {
    w.complete();
  } else {
    int code = status > COLLIE_OK && status <= COLLIE_ERR_INTERNAL ? status : COLLIE_ERR_INTERNAL;
    w.fail(collie::Error(static_cast<collie::ErrorCode>(code),
                         w.description() + " failed: " + (message ? message : "(no message)")));
  }
  return COLLIE_OK;
}

collie_status collie_hook_complete_after(collie_hook_done* done, collie_work* work) {
  COLLIE_REQUIRE(done, "done");
  COLLIE_REQUIRE(work, "work");
  collie::Work target = done->work;
  delete done;
  collie::Work op = work->work;
  delete work;
  op.then([target](const collie::Work& w) {
    if (auto e = w.error())
      target.fail(*e);
    else
      target.complete();
  });
  return COLLIE_OK;
}

collie_status collie_averager_create_periodic(collie_comm* c, uint64_t period,
                                              uint64_t warmup_steps, collie_averager** out) {
  COLLIE_REQUIRE(c, "comm");
  COLLIE_REQUIRE(out, "out");
  *out = nullptr;
  return guarded([&] {
    auto a = std::make_unique<collie_averager>();
    a->periodic = std::make_unique<collie::PeriodicModelAverager>(*c->comm, period, warmup_steps);
    *out = a.release();
  });
}

collie_status collie_averager_create_hierarchical(collie_comm* c, const uint64_t* periods,
                                                  const int32_t* group_sizes, size_t levels,
                                                  uint64_t warmup_steps, collie_averager** out) {
  COLLIE_REQUIRE(c, "comm");
  COLLIE_REQUIRE(out, "out");
  *out = nullptr;
  if (levels > 0 && (!periods || !group_sizes))
    return fail(COLLIE_ERR_INVALID_ARGUMENT,
                "collie_averager_create_hierarchical: periods or group_sizes is NULL");
  return guarded([&] {
    std::vector<collie::AveragingLevel> lv;
    for (size_t i = 0; i < levels; ++i) lv.push_back({periods[i], group_sizes[i]});
    auto a = std::make_unique<collie_averager>();
    a->hierarchical =
        std::make_unique<collie::HierarchicalModelAverager>(*c->comm, std::move(lv), warmup_steps);
    *out = a.release();
  });
}

collie_status collie_averager_average(collie_averager* a, const collie_tensor* params, size_t n) {
  COLLIE_REQUIRE(a, "averager");
  if (n > 0 && !params)
    return fail(COLLIE_ERR_INVALID_ARGUMENT, "collie_averager_average: params is NULL");
  return guarded([&] {
    std::vector<collie::TensorView> v;
    for (size_t i = 0; i < n; ++i) v.push_back(to_view(params[i], "params[i]"));
    if (a->periodic)
      a->periodic->average_parameters(v);
    else
      a->hierarchical->average_parameters(v);
  });
}

collie_status collie_averager_save_state(collie_averager* a, void* buf, size_t capacity,
                                         size_t* size) {
  COLLIE_REQUIRE(a, "averager");
  COLLIE_REQUIRE(size, "size");
  return guarded([&] {
    copy_out(a->periodic ? a->periodic->save_state() : a->hierarchical->save_state(), buf, capacity,
             size);
  });
}

collie_status collie_averager_load_state(collie_averager* a, const void* buf, size_t size) {
  COLLIE_REQUIRE(a, "averager");
  if (size > 0 && !buf)
    return fail(COLLIE_ERR_INVALID_ARGUMENT, "collie_averager_load_state: buf is NULL");
  return guarded([&] {
    collie::Bytes st = bytes_in(buf, size);
    if (a->periodic)
      a->periodic->load_state(st);
    else
      a->hierarchical->load_state(st);
  });
}

collie_status collie_averager_destroy(collie_averager* a) {
  return guarded([&] { delete a; });
}

}  // extern "C"
