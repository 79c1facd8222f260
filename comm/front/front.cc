#include "comm/front/front.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "base/log.h"
#include "base/trace.h"
#include "base/validate.h"
#include "comm/deterministic.h"
#include "comm/front/all_of.h"
#include "comm/front/context.h"
#include "comm/front/core.h"
#include "comm/front/grow.h"
#include "comm/front/shrink.h"

namespace collie {

bool FailureLatch::set(const Error& e) {
  std::lock_guard lk(mu_);
  if (first_) return false;
  first_ = e;
  failed_.store(true, std::memory_order_release);
  return true;
}

std::optional<Error> FailureLatch::get() const {
  if (!failed()) return std::nullopt;
  std::lock_guard lk(mu_);
  return first_;
}

void FailureLatch::lost(int rank) {
  std::lock_guard lk(mu_);
  if (std::find(lost_.begin(), lost_.end(), rank) == lost_.end()) lost_.push_back(rank);
}

std::vector<int> FailureLatch::lost() const {
  std::lock_guard lk(mu_);
  return lost_;
}

namespace {

using front::AllOf;
using front::Core;
using front::rank_str;

class Front final : public Communicator {
 public:
  Front(std::shared_ptr<Core> core, bool owner) : core_(std::move(core)), owner_(owner) {}
  ~Front() override {
    if (owner_) core_->destroy();
  }

  int rank() const override { return core_->rank(); }
  int size() const override { return core_->size(); }
  std::string backend() const override { return core_->backend->name(); }
  std::chrono::milliseconds timeout() const override { return core_->ctx.launch.timeout; }

  Op allreduce_op(TensorView in, TensorView out, ReduceOp op) const {
    const validate::Where what = where("allreduce");
    check_in_out(in, out, what);
    validate::op_on(op, in.dtype, what);
    validate::same_or_disjoint(in, out, what);
    if (in.numel != out.numel)
      throw Error(ErrorCode::invalid_argument,
                  what.str() + ": input has " + std::to_string(in.numel) +
                      " elements but output has " + std::to_string(out.numel));
    return deterministic(make(OpKind::allreduce, in, out, op, 0, in.numel), what);
  }

  // COLLIE_DETERMINISTIC: the op runs as comm/deterministic.h's steps.
  Op deterministic(Op op, const validate::Where& what) const {
    if (!core_->ctx.launch.deterministic || size() == 1 || op.desc.count == 0) return op;
    // Two ranks: each element is one operation on two operands, which IEEE
    // 754 makes commutative, so every algorithm already gives the rank-order
    // bits; 16-bit averages excepted (some algorithms sum, round, and then
    // divide). The tests check both forms against the same reference.
    // Nor do device averages: NCCL's multiplies each input by 1/n before
    // it sums (a/2 + b/2 underflows where (a + b)/2 does not).
    const bool narrow = op.desc.dtype == DType::f16 || op.desc.dtype == DType::bf16;
    const bool host = op.in.device.is_cpu() && op.out.device.is_cpu();
    if (size() == 2 && !((narrow || !host) && op.desc.redop == ReduceOp::avg)) return op;
    if (!host)
      throw Error(ErrorCode::unavailable,
                  what.str() +
                      ": COLLIE_DETERMINISTIC (Options::deterministic) reduces host memory "
                      "only; this tensor is on " +
                      to_string(op.in.device.is_cpu() ? op.out.device : op.in.device));
    op.deterministic = true;
    return op;
  }
  Work allreduce(TensorView in, TensorView out, ReduceOp op) override {
    return core_->submit(allreduce_op(in, out, op));
  }
  void allreduce(TensorView in, TensorView out, ReduceOp op, Blocking) override {
    core_->run(allreduce_op(in, out, op));
  }
  Work allreduce(TensorView in, TensorView out, ReduceOp op,
                 kernels::NonFiniteSeen& seen) override {
    Op o = allreduce_op(in, out, op);
    if (!o.in.device.is_cpu() || !o.out.device.is_cpu())
      throw Error(ErrorCode::invalid_argument,
                  where("allreduce").str() +
                      ": the search for NaN and Inf (check_nonfinite) reads host memory only; "
                      "this tensor is on " +
                      to_string(o.in.device.is_cpu() ? o.out.device : o.in.device));
    o.seen = &seen;
    return core_->submit(o);
  }

  Op broadcast_op(TensorView buf, int root) const {
    const validate::Where what = where("broadcast");
    check(buf, what, "buffer");
    validate::rank_in(root, size(), what, "root");
    return make(OpKind::broadcast, buf, buf, ReduceOp::sum, root, buf.numel);
  }
  Work broadcast(TensorView buf, int root) override {
    return core_->submit(broadcast_op(buf, root));
  }
  void broadcast(TensorView buf, int root, Blocking) override {
    core_->run(broadcast_op(buf, root));
  }

  Op allgather_op(TensorView in, TensorView out) const {
    const validate::Where what = where("allgather");
    check_in_out(in, out, what);
    if (out.numel != in.numel * static_cast<size_t>(size()))
      throw Error(ErrorCode::invalid_argument,
                  what.str() + ": output has " + std::to_string(out.numel) +
                      " elements; it must hold size() x input = " +
                      std::to_string(in.numel * static_cast<size_t>(size())));
    TensorView mine = out.slice(in.numel * static_cast<size_t>(rank()), in.numel);
    validate::same_or_disjoint(in, mine, what);
    if (in.data != mine.data) validate::same_or_disjoint(in, out, what);
    return make(OpKind::allgather, in, out, ReduceOp::sum, 0, in.numel);
  }
  Work allgather(TensorView in, TensorView out) override {
    return core_->submit(allgather_op(in, out));
  }
  void allgather(TensorView in, TensorView out, Blocking) override {
    core_->run(allgather_op(in, out));
  }

  Op reduce_scatter_op(TensorView in, TensorView out, ReduceOp op) const {
    const validate::Where what = where("reduce_scatter");
    check_in_out(in, out, what);
    validate::op_on(op, in.dtype, what);
    if (in.numel != out.numel * static_cast<size_t>(size()))
      throw Error(ErrorCode::invalid_argument,
                  what.str() + ": input has " + std::to_string(in.numel) +
                      " elements; it must hold size() x output = " +
                      std::to_string(out.numel * static_cast<size_t>(size())));
    validate::same_or_disjoint(in.slice(out.numel * static_cast<size_t>(rank()), out.numel), out,
                               what);
    return deterministic(make(OpKind::reduce_scatter, in, out, op, 0, out.numel), what);
  }
  Work reduce_scatter(TensorView in, TensorView out, ReduceOp op) override {
    return core_->submit(reduce_scatter_op(in, out, op));
  }
  void reduce_scatter(TensorView in, TensorView out, ReduceOp op, Blocking) override {
    core_->run(reduce_scatter_op(in, out, op));
  }

  static Op barrier_op() {
    return make(OpKind::barrier, TensorView{nullptr, DType::u8, 1, Device::cpu()}, {},
                ReduceOp::sum, 0, 1);
  }
  Work barrier() override { return core_->submit(barrier_op()); }
  void barrier(Blocking) override { core_->run(barrier_op()); }

  Work alltoall(TensorView in, TensorView out) override {
    const validate::Where what = where("alltoall");
    if (native_alltoall(in, out, what)) return core_->submit(alltoall_op(in, out));
    std::vector<size_t> counts(static_cast<size_t>(size()), in.numel / size());
    return exchange(what, in, counts, out, counts);
  }
  void alltoall(TensorView in, TensorView out, Blocking) override {
    if (native_alltoall(in, out, where("alltoall"))) return core_->run(alltoall_op(in, out));
    alltoall(in, out).wait();
  }
  Work alltoallv(TensorView in, const std::vector<size_t>& send_counts, TensorView out,
                 const std::vector<size_t>& recv_counts) override {
    return exchange(where("alltoallv"), in, send_counts, out, recv_counts);
  }

  Work send(TensorView buf, int peer, int tag) override { return p2p(buf, peer, tag, true); }
  Work recv(TensorView buf, int peer, int tag) override { return p2p(buf, peer, tag, false); }

  std::unique_ptr<Communicator> split(int color, int key) override {
    const int n = size();
    int split_no;
    {
      std::lock_guard lk(core_->mu);
      split_no = ++core_->splits;
    }
    std::vector<int64_t> all = colors_and_keys(color, key, split_no);
    SplitPlan plan;
    plan.color = color;
    plan.key = key;
    if (color >= 0) {
      std::vector<std::pair<int64_t, int>> members;
      for (int q = 0; q < n; ++q)
        if (all[2 * q] == color) members.push_back({all[2 * q + 1], q});
      std::sort(members.begin(), members.end());
      for (size_t i = 0; i < members.size(); ++i) {
        plan.members.push_back(members[i].second);
        if (members[i].second == rank()) plan.new_rank = static_cast<int>(i);
      }
      plan.context =
          renumbered(core_->ctx,
                     core_->ctx.key + "/s" + std::to_string(split_no) + "c" + std::to_string(color),
                     plan.new_rank, static_cast<int>(plan.members.size()), false);
    }
    std::unique_ptr<Backend> b;
    try {
      b = core_->backend->split(plan);
    } catch (const Error& e) {
      if (color >= 0) done_with_store(plan.context, &e);
      throw;
    }
    if (color >= 0) done_with_store(plan.context, nullptr);
    if (core_->ctx.serves_store) {
      // This process may end right after its split: the colors it is not
      // in must be done with the store first (its own waited above).
      std::map<int64_t, int> sizes;
      for (int q = 0; q < n; ++q)
        if (all[2 * q] >= 0 && all[2 * q] != color) ++sizes[all[2 * q]];
      std::vector<std::string> keys;
      for (const auto& [c, m] : sizes)
        for (int i = 0; i < m && m > 1; ++i)  // (a rank alone writes no word: done_with_store)
          keys.push_back(core_->ctx.key + "/s" + std::to_string(split_no) + "c" +
                         std::to_string(c) + "/set-up/" + std::to_string(i));
      outlast_setups(core_->ctx, keys);
    }
    if (color < 0) return nullptr;
    return make_front(plan.context, std::move(b));
  }

  std::unique_ptr<Communicator> shrink(const std::vector<int>& exclude,
                                       std::chrono::milliseconds wait) override {
    const BackendContext& ctx = core_->ctx;
    const validate::Where what = where("shrink");
    if (!ctx.store || !ctx.remake)
      throw Error(ErrorCode::unavailable, what.str() + ": the " + backend() +
                                              " backend has no rendezvous store to agree through");
    const int n = size();
    std::vector<bool> out(static_cast<size_t>(n), false);
    for (int q : exclude) {
      validate::rank_in(q, n, what, "excluded rank");
      if (q == rank())
        throw Error(ErrorCode::invalid_argument, what.str() + ": this rank excludes itself");
      out[static_cast<size_t>(q)] = true;
    }
    // Ranks this rank saw die (their connections closed, their processes
    // gone) are left out at once, not waited for.
    for (int q : ctx.failure->lost())
      if (q >= 0 && q < n && q != rank()) out[static_cast<size_t>(q)] = true;
    int no;
    {
      std::lock_guard lk(core_->mu);
      no = ++core_->shrinks;
    }
    BackendContext c = survivors_context(ctx, std::move(out), no, wait, timeout(), what);
    return make_front(c, c.remake(c));
  }

  std::unique_ptr<Communicator> grow(int joiners, std::chrono::milliseconds wait) override {
    const BackendContext& ctx = core_->ctx;
    const validate::Where what = where("grow");
    if (!ctx.store || !ctx.remake)
      throw Error(ErrorCode::unavailable, what.str() + ": the " + backend() +
                                              " backend has no rendezvous store to grow through");
    if (joiners < 1)
      throw Error(ErrorCode::invalid_argument,
                  what.str() + ": joiners is " + std::to_string(joiners) + ", not 1 or more");
    int no;
    {
      std::lock_guard lk(core_->mu);
      no = ++core_->grows;
    }
    BackendContext c = grown_context(ctx, joiners, no, wait, what);
    return make_front(c, c.remake(c));
  }

  void abort(const std::string& reason) override {
    Error e(ErrorCode::aborted,
            "the program aborted the communicator on " + rank_str(rank()) + ": " + reason);
    if (core_->ctx.failure->set(e)) core_->backend->abort(e);
  }

  std::optional<Error> error() const override { return core_->ctx.failure->get(); }

  std::shared_ptr<Communicator> share() override { return std::make_shared<Front>(core_, false); }
  std::shared_ptr<void> allocate(size_t bytes) override { return core_->backend->allocate(bytes); }
  std::shared_ptr<void> register_memory(TensorView memory) override {
    return core_->backend->register_memory(memory);
  }

  Arrivals arrivals() override {
    // A rank with COLLIE_ARRIVALS=0 still takes part (with no entries), so
    // that ranks set differently meet in the all-gather and compare nothing.
    const auto& log = core_->ctx.arrivals;
    if (size() == 1) return {};
    const size_t n = static_cast<size_t>(size()), words = arrivals::Log::kEntries + 1;
    std::vector<uint64_t> mine = log ? log->snapshot() : std::vector<uint64_t>(words, 0);
    std::vector<int64_t> all(n * words);
    try {
      allgather(view_of(reinterpret_cast<int64_t*>(mine.data()), words),
                view_of(all.data(), all.size()))
          .wait();
    } catch (const Error& e) {
      // A backend that moves device memory only (nccl) refuses host memory
      // on every rank alike, and times nothing either.
      if (e.code() != ErrorCode::invalid_argument || core_->takes_host_memory) throw;
      return {};
    }
    if (!log) return {};
    std::vector<std::vector<uint64_t>> logs(n);
    for (size_t r = 0; r < n; ++r)
      logs[r].assign(reinterpret_cast<const uint64_t*>(all.data()) + r * words,
                     reinterpret_cast<const uint64_t*>(all.data()) + (r + 1) * words);
    uint32_t through = 0;
    Arrivals a = arrivals::compare(logs, log->compared(), &through);
    log->set_compared(through);
    if (core_->trace && a.collectives)
      core_->trace->instant(
          "arrivals", trace::Args().add("collectives", a.collectives).add("summary", a.summary()));
    return a;
  }
  const std::shared_ptr<trace::Sink>& trace_sink() const { return core_->ctx.trace; }

 private:
  validate::Where where(const char* op) const { return {op, rank()}; }

  // Every rank's (color, key), by an all-gather; through the store where
  // the backend moves device memory only (nccl).
  std::vector<int64_t> colors_and_keys(int color, int key, int split_no) {
    const size_t n = static_cast<size_t>(size());
    std::vector<int64_t> mine{color, key}, all(2 * n);
    Store* store = core_->ctx.store.get();
    if (core_->takes_host_memory || !store || n == 1) {
      if (n == 1) return mine;
      allgather(view_of(mine.data(), 2), view_of(all.data(), all.size())).wait();
      return all;
    }
    const std::string prefix = core_->ctx.key + "/split" + std::to_string(split_no) + "/";
    store->set(prefix + std::to_string(rank()),
               to_bytes(std::to_string(color) + " " + std::to_string(key)));
    for (size_t q = 0; q < n; ++q) {
      std::string v = to_string(store->get(prefix + std::to_string(q)));
      long long c = 0, k = 0;
      if (std::sscanf(v.c_str(), "%lld %lld", &c, &k) != 2)
        throw Error(ErrorCode::mismatch, "split on " + rank_str(rank()) + ": rank " +
                                             std::to_string(q) + " published '" + v +
                                             "' instead of its color and key");
      all[2 * q] = c;
      all[2 * q + 1] = k;
    }
    return all;
  }

  void check(const TensorView& t, const validate::Where& what, const char* name) const {
    validate::tensor(t, what, name);
    // The backend's name only for the message: a string per check cost
    // every small op.
    if (t.device.is_cpu() ? !core_->takes_host_memory : !core_->backend->accepts(t.device))
      validate::refused_device(t, core_->backend->name(), what, name);
  }
  void check_in_out(const TensorView& in, const TensorView& out,
                    const validate::Where& what) const {
    check(in, what, "input");
    check(out, what, "output");
    validate::same_dtype(in, out, what);
  }

  static Op make(OpKind kind, TensorView in, TensorView out, ReduceOp redop, int tag,
                 size_t count) {
    Op op;
    op.desc = {kind, in.dtype, redop, 0, tag, count};
    op.in = in;
    op.out = out;
    return op;
  }

  // Checks an all-to-all of equal blocks; whether it goes to the backend
  // as one op (a backend with its own, host memory) rather than exchange().
  bool native_alltoall(TensorView in, TensorView out, const validate::Where& what) {
    const size_t n = static_cast<size_t>(size());
    if (in.numel % n != 0)
      throw Error(ErrorCode::invalid_argument,
                  what.str() + ": input has " + std::to_string(in.numel) +
                      " elements, not a multiple of the " + std::to_string(n) + " ranks");
    if (in.numel != out.numel)
      throw Error(ErrorCode::invalid_argument,
                  what.str() + ": input has " + std::to_string(in.numel) +
                      " elements but output has " + std::to_string(out.numel));
    if (!in.device.is_cpu() || !out.device.is_cpu() || !core_->runs_alltoall()) return false;
    check_in_out(in, out, what);
    validate::disjoint(in, out, what, "an all-to-all cannot run in place");
    return true;
  }
  static Op alltoall_op(TensorView in, TensorView out) {
    return make(OpKind::alltoall, in, out, ReduceOp::sum, 0, in.numel);
  }

  // alltoall and alltoallv: a send and a receive with every other rank,
  // issued back to back under the front's lock (so the backend runs them
  // as one batch and no other op of this communicator comes between), and
  // this rank's own block copied.
  Work exchange(const validate::Where& what, TensorView in, const std::vector<size_t>& send_counts,
                TensorView out, const std::vector<size_t>& recv_counts) {
    check_in_out(in, out, what);
    const size_t n = static_cast<size_t>(size()), me = static_cast<size_t>(rank());
    auto offsets = [&](const std::vector<size_t>& counts, const TensorView& t, const char* name) {
      if (counts.size() != n)
        throw Error(ErrorCode::invalid_argument,
                    what.str() + ": " + name + " has " + std::to_string(counts.size()) +
                        " counts; it must have one per rank (" + std::to_string(n) + ")");
      std::vector<size_t> at(n + 1, 0);
      for (size_t q = 0; q < n; ++q) at[q + 1] = at[q] + counts[q];
      if (at[n] != t.numel)
        throw Error(ErrorCode::invalid_argument,
                    what.str() + ": " + name + " add up to " + std::to_string(at[n]) +
                        " elements but the tensor has " + std::to_string(t.numel));
      return at;
    };
    const std::vector<size_t> from = offsets(send_counts, in, "send_counts");
    const std::vector<size_t> into = offsets(recv_counts, out, "recv_counts");
    if (send_counts[me] != recv_counts[me])
      throw Error(ErrorCode::invalid_argument,
                  what.str() + ": this rank sends itself " + std::to_string(send_counts[me]) +
                      " elements but receives " + std::to_string(recv_counts[me]));
    validate::disjoint(in, out, what, "an all-to-all cannot run in place");
    if (!in.device.is_cpu() || !out.device.is_cpu())
      throw Error(ErrorCode::unavailable,
                  what.str() + ": on " + to_string(in.device.is_cpu() ? out.device : in.device) +
                      ": collie's all-to-all moves host memory only for now");
    std::vector<Work> parts;
    parts.reserve(2 * (n - 1));
    {
      std::lock_guard lk(core_->mu);
      // Round k: to rank + k, from rank - k. Every message is sent, the
      // empty ones too, so that counts that disagree with a peer's are an
      // error on both ranks instead of a message left over.
      for (size_t k = 1; k < n; ++k) {
        const size_t to = (me + k) % n, src = (me + n - k) % n;
        Op s =
            p2p_op(in.slice(from[to], send_counts[to]), static_cast<int>(to), kAlltoallTag, true);
        Op r = p2p_op(out.slice(into[src], recv_counts[src]), static_cast<int>(src), kAlltoallTag,
                      false);
        parts.push_back(*core_->issue(s, nullptr));
        parts.push_back(*core_->issue(r, nullptr));
      }
    }
    if (send_counts[me] > 0)
      std::memcpy(static_cast<char*>(out.data) + into[me] * dtype_size(out.dtype),
                  static_cast<const char*>(in.data) + from[me] * dtype_size(in.dtype),
                  send_counts[me] * dtype_size(in.dtype));
    const size_t total = in.numel;
    return AllOf::make(std::string(what.op) + " (" + std::string(to_string(in.dtype)) + " x " +
                           std::to_string(total) + ") on " + rank_str(rank()),
                       std::move(parts), OpCompletion::wait_timeout(core_->ctx.launch.timeout));
  }

  static Op p2p_op(TensorView buf, int peer, int tag, bool is_send) {
    Op op;
    op.desc = {OpKind::p2p, buf.dtype, ReduceOp::sum, 0, tag, buf.numel};
    op.in = op.out = buf;
    op.peer = peer;
    op.is_send = is_send;
    return op;
  }

  Work p2p(TensorView buf, int peer, int tag, bool is_send) {
    const validate::Where what = where(is_send ? "send" : "recv");
    check(buf, what, "buffer");
    validate::rank_in(peer, size(), what, "peer");
    if (peer == rank())
      throw Error(ErrorCode::invalid_argument, what.str() + ": peer is this rank itself");
    if (tag == kAlltoallTag)
      throw Error(ErrorCode::invalid_argument,
                  what.str() + ": tag " + std::to_string(tag) + " is alltoall's own");
    return core_->submit(p2p_op(buf, peer, tag, is_send));
  }

  std::shared_ptr<Core> core_;
  const bool owner_;
};

}  // namespace

std::shared_ptr<trace::Sink> trace_sink(const Communicator& comm) {
  const auto* front = dynamic_cast<const Front*>(&comm);
  return front ? front->trace_sink() : nullptr;
}

std::unique_ptr<Communicator> make_front(const BackendContext& ctx,
                                         std::unique_ptr<Backend> backend) {
  return std::make_unique<Front>(std::make_shared<Core>(ctx, std::move(backend)), true);
}

}  // namespace collie
