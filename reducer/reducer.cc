// reducer/reducer.cc: the steps of one iteration (prepare, gradients
// marked ready, buckets launched as they fill, finalize) and the accessors.
#include "reducer/reducer.h"

#include <algorithm>
#include <cstdio>
#include <mutex>

#include "base/cuda_api.h"
#include "base/log.h"
#include "base/trace.h"
#include "reducer/nonfinite_check.h"

namespace collie {

namespace {

using Clock = std::chrono::steady_clock;

double us_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

}  // namespace

Error Reducer::misuse(const std::string& msg) {
  return Error(ErrorCode::invalid_argument, "reducer: " + msg);
}

TensorView Reducer::bucket_slot(size_t i) const {
  size_t b = plan_.bucket_of(i), k = plan_.slot_of(i);
  return buffers_[b].slice(plan_.buckets()[b].offsets[k], specs_[i].numel);
}

TensorView Reducer::grad_view(size_t i) const {
  if (i >= params_.size()) throw misuse("no parameter " + std::to_string(i));
  if (!opt_.gradient_as_bucket_view) return params_[i].grad;
  return bucket_slot(i);
}

uint64_t Reducer::layout_generation() const {
  return generation_;
}

void Reducer::set_grad(size_t i, TensorView grad) {
  std::lock_guard lk(mu_);
  set_grad_locked(i, grad);
}

void Reducer::set_grad_locked(size_t i, const TensorView& grad) {
  if (i >= params_.size())
    throw misuse("gradient " + std::to_string(i) + ": there are " + std::to_string(params_.size()) +
                 " parameters");
  const std::string which = "the gradient of parameter " + std::to_string(i);
  if (opt_.gradient_as_bucket_view) {
    const void* want = bucket_slot(i).data;
    if (grad.data == want) return;
    if (grad.data && grad.data == stale_view_[i])
      throw misuse(which + " was written through its view from before the buckets were rebuilt " +
                   "(layout generation " + std::to_string(generation_ - 1) + "; now " +
                   std::to_string(generation_) +
                   "): re-read grad_view() after finalize_backward when layout_generation() "
                   "changes");
    char at[32];
    std::snprintf(at, sizeof at, "%p", grad.data);
    throw misuse(which + " was given at " + at +
                 ", which is not its bucket view: with gradient_as_bucket_view the engine writes "
                 "into grad_view(" +
                 std::to_string(i) + ")");
  }
  if (grad.data && (grad.numel != specs_[i].numel || grad.dtype != specs_[i].dtype))
    throw misuse(which + " was given as " + std::to_string(grad.numel) + " " +
                 std::string(to_string(grad.dtype)) + " elements; the parameter has " +
                 std::to_string(specs_[i].numel) + " " + std::string(to_string(specs_[i].dtype)));
  params_[i].grad = grad.data ? grad : TensorView{};
}

void Reducer::set_comm_hook(const std::string& spec) {
  set_comm_hook(make_comm_hook(spec));
}

void Reducer::set_comm_hook(std::shared_ptr<CommHook> hook) {
  if (!hook) throw misuse("set_comm_hook: no hook");
  std::lock_guard lk(mu_);
  if (in_backward_) throw misuse("set_comm_hook in the middle of a backward pass");
  hook_ = std::move(hook);
  hook_bytes_before_ = hook_->bytes_communicated();
}

void Reducer::set_no_sync(bool on) {
  std::lock_guard lk(mu_);
  if (in_backward_) throw misuse("no_sync cannot change in the middle of a backward pass");
  no_sync_ = on;
}

void Reducer::set_static_graph() {
  std::lock_guard lk(mu_);
  if (opt_.static_graph) return;
  if (in_backward_ || iteration_ > 0)
    throw misuse("static_graph can be turned on only before the first synchronised iteration (" +
                 std::to_string(iteration_) + " done)");
  opt_.static_graph = true;
}

std::string Reducer::name(size_t i) const {
  return opt_.param_names.empty() ? std::to_string(i) : opt_.param_names[i];
}

std::string Reducer::names(const std::vector<size_t>& ps) const {
  std::string s;
  for (size_t k = 0; k < ps.size() && k < 10; ++k) s += (k ? ", " : "") + name(ps[k]);
  if (ps.size() > 10) s += " and " + std::to_string(ps.size() - 10) + " more";
  return s;
}

void Reducer::zero_slot(size_t i) {
  auto slot = bucket_slot(i);
  cuda::zero(slot.data, slot.nbytes(), slot.device);
}

void Reducer::prepare_for_backward(const std::vector<bool>& used) {
  std::lock_guard lk(mu_);
  if (in_backward_)
    throw misuse(
        "prepare_for_backward called again before finalize_backward: the previous "
        "iteration's reduction is still pending");
  const size_t n = params_.size();
  if (!used.empty() && used.size() != n)
    throw misuse("the used-parameter mask has " + std::to_string(used.size()) + " entries for " +
                 std::to_string(n) + " parameters");
  // Replicas compared before the backward pass, when nothing is in flight.
  if (!no_sync_ && check_replicas_ > 0 && iteration_ % check_replicas_ == 0) check_replicas_now();
  in_backward_ = true;
  backward_start_ = last_mark_ = Clock::now();
  if (trace_)
    trace_->instant("backward start",
                    trace::Args().add("iteration", iteration_).add("no_sync", no_sync_),
                    trace::at(backward_start_));
  if (no_sync_) return;
  if (opt_.static_graph && static_used_) {
    used_ = *static_used_;
  } else if (opt_.find_unused_parameters && !used.empty()) {
    used_ = used;
  } else {
    used_.assign(n, true);
  }
  // The default hook's all-reduce searches as it reduces: nothing else to do
  // on the way into the buckets (host buckets only; compressing hooks'
  // all-reduces see other values).
  if (nonfinite_)
    nonfinite_->begin(hook_->name() == "allreduce" && !buffers_.empty() &&
                          buffers_.front().view().device.is_cpu(),
                      plan_.buckets().size());
  marked_.assign(n, false);
  fires_.assign(n, 0);
  late_.assign(n, false);
  ready_order_.clear();
  next_launch_ = 0;
  const auto& buckets = plan_.buckets();
  pending_.assign(buckets.size(), 0);
  for (size_t b = 0; b < buckets.size(); ++b)
    for (size_t p : buckets[b].params) {
      if (used_[p]) {
        ++pending_[b];
      } else {
        // Declared unused: it contributes zeros, so every rank still
        // reduces every bucket, and its bucket need not wait for finalize.
        zero_slot(p);
      }
    }
  launch_ready_buckets();
}

void Reducer::copy_in(size_t i) {
  auto slot = bucket_slot(i);
  // On a CUDA device, queued on the calling thread's stream, which the
  // bucket's all-reduce (issued from this thread) is ordered after.
  if (nonfinite_)
    nonfinite_->copy_in(i, slot, params_[i].grad.data);  // searched as it is copied
  else
    cuda::copy(slot.data, params_[i].grad.data, slot.nbytes(), slot.device);
}

void Reducer::mark_grad_ready(size_t i) {
  std::lock_guard lk(mu_);
  mark_locked(i);
}

void Reducer::mark_grad_ready(size_t i, TensorView grad) {
  std::lock_guard lk(mu_);
  set_grad_locked(i, grad);
  mark_locked(i);
}

void Reducer::require_buffer(size_t i) const {
  if (!opt_.gradient_as_bucket_view && !params_[i].grad.data)
    throw misuse("the gradient of parameter " + name(i) +
                 " arrived, but the reducer has no buffer for it: pass it to "
                 "mark_grad_ready(i, grad) or set_grad");
}

void Reducer::take(size_t i) {
  require_buffer(i);
  marked_[i] = true;
  if (!opt_.gradient_as_bucket_view)
    copy_in(i);
  else if (nonfinite_)
    nonfinite_->scan(i, bucket_slot(i));
  --pending_[plan_.bucket_of(i)];
}

void Reducer::mark_locked(size_t i) {
  if (i >= params_.size())
    throw misuse("mark_grad_ready(" + std::to_string(i) + "): there are " +
                 std::to_string(params_.size()) + " parameters");
  if (!in_backward_)
    throw misuse("mark_grad_ready(" + std::to_string(i) +
                 ") outside a backward pass: call prepare_for_backward first");
  last_mark_ = Clock::now();
  if (no_sync_) {
    accumulated_[i] = true;  // sent by the next synchronised iteration
    return;
  }
  if (!used_[i])
    throw misuse("the gradient of parameter " + name(i) + " arrived, but " +
                 (opt_.static_graph && static_used_
                      ? "the first iteration did not use it and static_graph says the graph never "
                        "changes"
                      : "this iteration declared it unused"));
  require_buffer(i);
  if (fires_[i]++ == 0) {
    ready_order_.push_back(i);
    if (trace_)
      trace_->instant("grad ready",
                      trace::Args()
                          .add("param", static_cast<uint64_t>(i))
                          .add("bucket", static_cast<uint64_t>(plan_.bucket_of(i)))
                          .add("iteration", iteration_),
                      trace::at(last_mark_));
  }
  const size_t b = plan_.bucket_of(i);
  if (marked_[i]) {
    // More arrivals than the first iteration had. Still in time when its
    // bucket has not left: take the gradient again. Otherwise this part
    // was not reduced: an error at finalize.
    if (b < next_launch_)
      late_[i] = true;
    else if (!opt_.gradient_as_bucket_view)
      copy_in(i);
    else if (nonfinite_)
      nonfinite_->scan(i, bucket_slot(i));  // what arrived again, searched again
    return;
  }
  // The learning iteration sends its buckets at finalize; later ones as
  // soon as a gradient has arrived as often as it did then.
  if (expected_.empty() || fires_[i] < std::max<uint32_t>(expected_[i], 1)) return;
  take(i);
  if (pending_[b] == 0) launch_ready_buckets();
}

void Reducer::launch_ready_buckets() {
  // Strictly in plan order: a bucket that fills early waits for the ones
  // before it, so every rank issues the same all-reduces in the same order.
  while (next_launch_ < pending_.size() && pending_[next_launch_] == 0) {
    size_t b = next_launch_++;
    launched_at_[b] = Clock::now();
    auto times = comm_us_;  // shared: outlives this reducer if a late hook completes after it
    auto start = launched_at_[b];
    GradBucket gb;
    gb.index = b;
    gb.buffer = buffers_[b].view();
    const Bucket& bucket = plan_.buckets()[b];
    for (size_t k = 0; k < bucket.params.size(); ++k) {
      size_t p = bucket.params[k];
      gb.grads.push_back(buffers_[b].slice(bucket.offsets[k], specs_[p].numel));
      gb.params.push_back(params_[p].value);
      gb.rows.push_back(params_[p].rows);
    }
    if (nonfinite_ && nonfinite_->in_pass()) gb.seen = nonfinite_->seen_for(b, bucket.offsets);
    gb.is_last = b + 1 == pending_.size();
    gb.iteration = iteration_;
    // In flight beside the buckets before and after it: an async span.
    const std::string name = trace_ ? "bucket " + std::to_string(b) : std::string();
    const uint64_t id = trace_ ? trace_->async_begin("bucket", name, trace::at(start),
                                                     trace::Args()
                                                         .add("index", static_cast<uint64_t>(b))
                                                         .add("bytes", gb.buffer.nbytes())
                                                         .add("params", bucket.params.size())
                                                         .add("hook", hook_->name())
                                                         .add("iteration", iteration_))
                               : 0;
    // The continuation keeps the bucket's memory and the hook alive until
    // the hook is done with them: a hook that completes only after a
    // timeout (and after this reducer is gone) must not write freed memory.
    works_[b] = hook_->run(comm_, gb).then(
        [times, b, start, keep = buffers_[b], hook = hook_, tr = trace_, id, name](const Work& w) {
          const auto end = Clock::now();
          (*times)[b] = us_between(start, end);
          if (tr) {
            trace::Args a;
            if (auto e = w.error()) a.add("error", e->what());
            tr->async_end("bucket", name, id, trace::at(end), a);
          }
          if (auto e = w.error()) throw *e;
        });
  }
}

void Reducer::finalize_backward() {
  finish_backward(false);
}

void Reducer::join_step() {
  {
    std::lock_guard lk(mu_);
    if (no_sync_) throw misuse("join_step under no_sync: a joined rank shadows synchronised steps");
  }
  shadowing_ = true;
  try {
    prepare_for_backward();
  } catch (...) {
    shadowing_ = false;
    throw;
  }
  shadowing_ = false;
  finish_backward(true);
}

std::vector<bool> Reducer::exchange_used(const std::vector<bool>& here) {
  if (opt_.static_graph && static_global_used_) return *static_global_used_;
  const size_t n = here.size();
  std::vector<uint8_t> mask(n);
  for (size_t i = 0; i < n; ++i) mask[i] = here[i] ? 1 : 0;
  comm_.allreduce(view_of(mask.data(), n), ReduceOp::max).wait();
  std::vector<bool> anywhere(n);
  for (size_t i = 0; i < n; ++i) anywhere[i] = mask[i] != 0;
  if (opt_.static_graph) static_global_used_ = anywhere;
  return anywhere;
}

void Reducer::finish_backward(bool shadow) {
  std::unique_lock lk(mu_);
  if (!in_backward_) throw misuse("finalize_backward without prepare_for_backward");
  in_backward_ = false;
  if (no_sync_) return;
  const size_t n = params_.size();
  // Every gradient not yet counted: what arrived (fewer times than the
  // first iteration, or in this learning iteration), what no_sync steps
  // accumulated, or zeros for one that never came.
  std::vector<bool> here(n, false);
  std::vector<size_t> missing;
  for (size_t i = 0; i < n; ++i) {
    if (!used_[i]) continue;  // declared unused: zeroed at prepare
    if (marked_[i]) {
      here[i] = true;
    } else if (!shadow && (fires_[i] > 0 || accumulated_[i])) {
      here[i] = true;
      take(i);
    } else if (shadow || allow_unused()) {
      zero_slot(i);
      marked_[i] = true;
      --pending_[plan_.bucket_of(i)];
    } else {
      missing.push_back(i);
    }
  }
  if (!missing.empty())
    throw misuse("rank " + std::to_string(comm_.rank()) + ": parameters " + names(missing) +
                 " received no gradient in this backward pass; if the model does not use every "
                 "parameter in every step, enable find_unused_parameters");
  launch_ready_buckets();
  auto wait_start = Clock::now();
  // Every bucket's reduction is waited for before an error is reported, so
  // that none is still writing when the caller goes on (or retries).
  try {
    wait_all(works_);
  } catch (const Error& e) {
    if (trace_)
      trace_->span("finalize wait", trace::at(wait_start), trace::now(),
                   trace::Args().add("iteration", iteration_).add("error", e.what()));
    throw;
  }
  // What each rank's gradients held before averaging: issued only once
  // every bucket's reduction has ended, since a hook may issue collectives
  // from its continuations (PowerSGD's second all-reduce), and an exchange
  // issued beside them took a different number on different ranks.
  if (nonfinite_)
    nonfinite_->exchange(comm_,
                         [this](size_t b, size_t k) { return plan_.buckets()[b].params[k]; });
  auto wait_end = Clock::now();
  if (trace_) {
    trace_->span("backward", trace::at(backward_start_), trace::at(last_mark_),
                 trace::Args().add("iteration", iteration_));
    trace_->span("finalize wait", trace::at(wait_start), trace::at(wait_end),
                 trace::Args().add("iteration", iteration_));
  }
  // Which parameters some rank used: one small all-reduce.
  if (allow_unused()) {
    std::vector<bool> anywhere = exchange_used(here);
    for (size_t i = 0; i < n; ++i)
      use_[i] = here[i] ? ParamUse::here : anywhere[i] ? ParamUse::elsewhere : ParamUse::nowhere;
  } else {
    use_.assign(n, ParamUse::here);
  }
  uint64_t hook_total = hook_->bytes_communicated();
  stats_.hook_bytes = hook_total - hook_bytes_before_;
  hook_bytes_before_ = hook_total;
  stats_.gradient_bytes = 0;
  for (const auto& buf : buffers_) stats_.gradient_bytes += buf.view().nbytes();

  // Copy mode: the averages go back to where the engine's gradients are now;
  // a gradient the engine has no buffer for (set_grad with none), one that
  // no rank used, and a joined rank's are left.
  if (!opt_.gradient_as_bucket_view && !shadow)
    for (size_t i = 0; i < n; ++i)
      if (params_[i].grad.data && use_[i] != ParamUse::nowhere) {
        auto slot = bucket_slot(i);
        cuda::copy(params_[i].grad.data, slot.data, slot.nbytes(), slot.device);
      }

  stats_.iteration = iteration_;
  stats_.backward_us = us_between(backward_start_, last_mark_);
  stats_.exposed_us = us_between(wait_start, wait_end);
  stats_.bucket_comm_us = *comm_us_;

  if (!shadow) {
    if (opt_.static_graph && !static_used_) static_used_ = here;
    if (expected_.empty()) {
      expected_ = fires_;
    } else {
      for (size_t i = 0; i < n; ++i) expected_[i] = std::max(expected_[i], fires_[i]);
    }
    accumulated_.assign(n, false);
  }
  ++iteration_;
  if (log::enabled(log::Level::info) && iteration_ % log_every_ == 0) log_stats();
  if (arrivals_every_ && iteration_ % arrivals_every_ == 0) log_arrivals();
  if (opt_.rebuild_buckets && !rebuilt_) rebuild_from_observed_order();
  // Reported last, every collective of the iteration done, so that the
  // ranks stay in step whatever the caller does next.
  if (nonfinite_) {
    const std::string msg =
        nonfinite_->report([this](size_t i) { return name(i); }, iteration_ - 1);
    if (!msg.empty()) failed_check(ErrorCode::invalid_argument, msg);
  }
  std::vector<size_t> late;
  for (size_t i = 0; i < n; ++i)
    if (late_[i]) late.push_back(i);
  if (!late.empty())
    throw misuse("rank " + std::to_string(comm_.rank()) + ": parameters " + names(late) +
                 " received a gradient after theirs had been reduced: this backward used them "
                 "more often than the first one did (their average lacks the late part)");
}

ParamUse Reducer::param_use(size_t i) const {
  if (i >= params_.size()) throw misuse("no parameter " + std::to_string(i));
  return use_[i];
}

TensorView Reducer::bucket_grad(size_t i) const {
  if (i >= params_.size()) throw misuse("no parameter " + std::to_string(i));
  return bucket_slot(i);
}

}  // namespace collie
