// capi/c_api.cc: the reducer, comm-hook and averager half of
// include/collie/collie.h over the C++ API (the communicator half is
// c_api_comm.cc). It sits at the top of the stack: it needs both the
// communicator and the reducer.
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "capi/c_api_internal.h"
#include "hooks/model_averager.h"
#include "reducer/reducer.h"

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

using namespace collie::capi;

namespace {

// The smallest option and stats structs a caller may pass: ABI 1's first
// sizes. Fields after them are read or written only when the caller's
// struct_size covers them.
constexpr uint32_t kReducerOptionsV1 = offsetof(collie_reducer_options, comm_hook);
constexpr uint32_t kReducerStatsV1 = offsetof(collie_reducer_stats, gradient_bytes);

// ABI 1's reducer structs had padding where struct_tag is now, which its
// callers may have left as anything: a struct no larger than ABI 1's largest
// is read as ABI 1's. A larger one carries a tag, or 0 (zeroed, then sized:
// these structs only ever grow at the end); anything else is a struct that
// was never initialised.
constexpr uint32_t kReducerOptionsV1Max = 56, kReducerStatsV1Max = 64;
template <typename S>
bool tag_ok(const S* s, uint32_t v1_max) {
  return s->struct_size <= v1_max || s->struct_tag == 0 || is_struct_tag(s->struct_tag);
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

// An engine's collie_allocator behind the C++ BucketAllocator.
class CAllocator final : public collie::BucketAllocator {
 public:
  explicit CAllocator(const collie_allocator& a) : a_(a) {}
  void* allocate(size_t bytes, collie::DType t, collie::Device d) override {
    void* p = a_.allocate(a_.user, bytes, static_cast<int32_t>(t),
                          d.is_cpu() ? COLLIE_CPU : COLLIE_CUDA, d.index);
    if (!p)
      throw collie::Error(collie::ErrorCode::unavailable,
                          "the engine's bucket allocator returned NULL for " +
                              std::to_string(bytes) + " bytes of " +
                              std::string(collie::to_string(t)) + " on " + collie::to_string(d));
    return p;
  }
  void release(void* p, size_t bytes, collie::Device d) noexcept override {
    if (a_.release) a_.release(a_.user, p, bytes, d.is_cpu() ? COLLIE_CPU : COLLIE_CUDA, d.index);
  }

 private:
  collie_allocator a_;
};

collie::ReducerOptions to_reducer_options(const collie_reducer_options* o, size_t n,
                                          const uint64_t** rows) {
  collie::ReducerOptions opt;
  *rows = nullptr;
  if (!o) return opt;
  if (o->struct_size < kReducerOptionsV1 || !tag_ok(o, kReducerOptionsV1Max))
    throw collie::Error(collie::ErrorCode::invalid_argument,
                        "collie_reducer_create: options struct_size is " +
                            std::to_string(o->struct_size) +
                            "; initialise them with COLLIE_REDUCER_OPTIONS_INIT or "
                            "collie_reducer_options_init");
  collie_reducer_options defaults = COLLIE_REDUCER_OPTIONS_INIT;
  collie_reducer_options c = read_struct(o, defaults);
  static_assert(offsetof(collie_reducer_options, bucket_allocator) == kReducerOptionsV1Max);
  opt.first_bucket_bytes = c.first_bucket_bytes;
  opt.bucket_bytes = c.bucket_bytes;
  opt.gradient_as_bucket_view = c.gradient_as_bucket_view != 0;
  opt.find_unused_parameters = c.find_unused_parameters != 0;
  opt.static_graph = c.static_graph != 0;
  opt.broadcast_parameters = c.broadcast_parameters != 0;
  opt.rebuild_buckets = c.rebuild_buckets != 0;
  if (c.comm_hook) opt.comm_hook = c.comm_hook;
  *rows = c.param_rows;
  if (c.param_names) opt.param_names.assign(c.param_names, c.param_names + n);
  opt.check_replicas = c.check_replicas < 0 ? -1 : c.check_replicas;
  opt.check_nonfinite = c.check_nonfinite < 0 ? -1 : c.check_nonfinite != 0;
  opt.check_warns = c.check_warns < 0 ? -1 : c.check_warns != 0;
  if (const collie_allocator* a = c.bucket_allocator) {
    if (a->struct_size < offsetof(collie_allocator, user) + sizeof(void*) || !a->allocate)
      throw collie::Error(collie::ErrorCode::invalid_argument,
                          "collie_reducer_create: bucket_allocator needs struct_size "
                          "(COLLIE_ALLOCATOR_INIT) and an allocate function");
    opt.bucket_allocator = std::make_shared<CAllocator>(*a);
  }
  return opt;
}

}  // namespace

extern "C" {

// ABI 1's exported initialiser, for programs built against it: writes
// ABI 1's 56-byte struct (programs built since use the header's inline one).
void collie_reducer_options_init(collie_reducer_options* o) {
  if (!o) return;
  collie_reducer_options full = COLLIE_REDUCER_OPTIONS_INIT;
  full.struct_size = kReducerOptionsV1Max;
  full.struct_tag = 0;
  std::memcpy(static_cast<void*>(o), &full, kReducerOptionsV1Max);
}

collie_status collie_reducer_create(collie_comm* c, const collie_tensor* params,
                                    const collie_tensor* grads, size_t n,
                                    const collie_reducer_options* o, collie_reducer** out) {
  COLLIE_REQUIRE(c, "comm");
  COLLIE_REQUIRE(out, "out");
  *out = nullptr;
  if (n > 0 && !params)
    return fail(COLLIE_ERR_INVALID_ARGUMENT, "collie_reducer_create: params is NULL");
  return guarded([&] {
    const uint64_t* rows = nullptr;
    collie::ReducerOptions opt = to_reducer_options(o, n, &rows);
    std::vector<collie::Parameter> ps;
    for (size_t i = 0; i < n; ++i)
      ps.push_back({to_view(params[i], "params[i]"),
                    grads && grads[i].data ? to_view(grads[i], "grads[i]") : collie::TensorView{},
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

collie_status collie_reducer_mark_ready_grad(collie_reducer* r, size_t param, collie_tensor grad) {
  COLLIE_REQUIRE(r, "reducer");
  return guarded([&] { r->reducer->mark_grad_ready(param, to_view(grad, "grad")); });
}

collie_status collie_reducer_set_grad(collie_reducer* r, size_t param, const collie_tensor* grad) {
  COLLIE_REQUIRE(r, "reducer");
  return guarded([&] {
    r->reducer->set_grad(param, grad && grad->data ? to_view(*grad, "grad") : collie::TensorView{});
  });
}

collie_status collie_reducer_layout_generation(const collie_reducer* r, uint64_t* generation) {
  COLLIE_REQUIRE(r, "reducer");
  COLLIE_REQUIRE(generation, "generation");
  *generation = r->reducer->layout_generation();
  return COLLIE_OK;
}

collie_status collie_reducer_finalize(collie_reducer* r) {
  COLLIE_REQUIRE(r, "reducer");
  return guarded([&] { r->reducer->finalize_backward(); });
}

collie_status collie_reducer_join_step(collie_reducer* r) {
  COLLIE_REQUIRE(r, "reducer");
  return guarded([&] { r->reducer->join_step(); });
}

collie_status collie_reducer_param_use(const collie_reducer* r, uint8_t* out, size_t n) {
  COLLIE_REQUIRE(r, "reducer");
  COLLIE_REQUIRE(out, "out");
  return guarded([&] {
    const size_t have = r->reducer->plan().num_params();
    if (n != have)
      throw collie::Error(collie::ErrorCode::invalid_argument,
                          "collie_reducer_param_use: num_params is " + std::to_string(n) +
                              "; the reducer has " + std::to_string(have));
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(r->reducer->param_use(i));
  });
}

collie_status collie_reducer_bucket_grad(collie_reducer* r, size_t param, collie_tensor* out) {
  COLLIE_REQUIRE(r, "reducer");
  COLLIE_REQUIRE(out, "out");
  return guarded([&] { *out = from_view(r->reducer->bucket_grad(param)); });
}

collie_status collie_reducer_set_static_graph(collie_reducer* r) {
  COLLIE_REQUIRE(r, "reducer");
  return guarded([&] { r->reducer->set_static_graph(); });
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
  if (out->struct_size < kReducerStatsV1 || !tag_ok(out, kReducerStatsV1Max))
    return fail(COLLIE_ERR_INVALID_ARGUMENT,
                "collie_reducer_get_stats: initialise the stats with COLLIE_REDUCER_STATS_INIT");
  const auto& s = r->reducer->last_stats();
  collie_reducer_stats full{};
  full.iteration = s.iteration;
  full.backward_us = s.backward_us;
  full.exposed_us = s.exposed_us;
  for (double us : s.bucket_comm_us) full.comm_us_total += us;
  full.num_buckets = static_cast<uint32_t>(s.bucket_comm_us.size());
  full.gradient_bytes = s.gradient_bytes;
  full.hook_bytes = s.hook_bytes;
  full.layout_generation = r->reducer->layout_generation();
  static_assert(offsetof(collie_reducer_stats, layout_generation) == kReducerStatsV1Max);
  write_struct(out, full);
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

collie_status collie_reducer_iterations(const collie_reducer* r, uint64_t* iterations) {
  COLLIE_REQUIRE(r, "reducer");
  COLLIE_REQUIRE(iterations, "iterations");
  return guarded([&] { *iterations = r->reducer->iterations(); });
}

collie_status collie_reducer_handoff_state(collie_comm* c, collie_reducer* mine, int root,
                                           void** state, size_t* size) {
  COLLIE_REQUIRE(c, "comm");
  COLLIE_REQUIRE(state, "state");
  COLLIE_REQUIRE(size, "size");
  *state = nullptr;
  *size = 0;
  return guarded([&] {
    const collie::Bytes got =
        collie::Reducer::handoff_state(*c->comm, mine ? mine->reducer.get() : nullptr, root);
    // malloc'd, for collie_free: at least one byte, so that an empty state
    // is still a pointer the caller may free.
    void* out = std::malloc(got.empty() ? 1 : got.size());
    if (!out) throw collie::Error(collie::ErrorCode::internal, "out of memory for the state");
    if (!got.empty()) std::memcpy(out, got.data(), got.size());
    *state = out;
    *size = got.size();
  });
}

void collie_free(void* ptr) {
  std::free(ptr);
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

collie_status collie_hook_register(const char* name, collie_comm_hook_fn fn, void* user) {
  COLLIE_REQUIRE(name, "name");
  COLLIE_REQUIRE(fn, "fn");
  return guarded([&] {
    std::string n = name;
    collie::register_comm_hook(n, {}, [n, fn, user](const collie::HookParams&) {
      return std::make_unique<CHook>(n, fn, user);
    });
  });
}

collie_status collie_register_comm_hook(const char* name, collie_comm_hook_fn fn, void* user) {
  return collie_hook_register(name, fn, user);
}

collie_status collie_hook_complete(collie_hook_done* done, collie_status status,
                                   const char* message) {
  COLLIE_REQUIRE(done, "done");
  collie::Work w = done->work;
  delete done;
  if (status == COLLIE_OK) {
    w.complete();
  } else {
    int code = status > COLLIE_OK && status <= COLLIE_ERR_ABORTED ? status : COLLIE_ERR_INTERNAL;
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
