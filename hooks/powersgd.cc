// hooks/powersgd.cc: PowerSGD and batched PowerSGD over BLAS (see
// powersgd.h for the algorithm and its parameters).
//
// Where collie departs from PyTorch, on purpose:
//  - the uncompressed tensors and the P factors travel in one all-reduce,
//    not two: one latency fewer per bucket, the same bytes;
//  - a gradient that is exactly zero gives a zero P column, which stays zero
//    instead of becoming NaN when orthogonalization_epsilon is 0;
//  - the error feedback memory doubles as the step's input (no second copy
//    of the bucket);
//  - batched: the error is kept for the bucket, not for its zero padding
//    (PyTorch also feeds back what the approximation put in the padding).
#include "hooks/powersgd.h"

#include <cmath>

#include "base/cuda_api.h"
#include "base/fingerprint.h"
#include "base/state_bytes.h"
#include "collie_build_config.h"
#include "hooks/stream_scope.h"

namespace collie {

namespace {

Error bad(const std::string& msg) {
  return Error(ErrorCode::invalid_argument, "comm hook: " + msg);
}

// splitmix64 of (seed, n): independent-looking seeds for the n-th fresh Q.
uint64_t mix_seed(uint64_t seed, uint64_t n) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * (n + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

constexpr uint64_t kStateMagic = 0x3144475352574f50ull;  // "POWRSGD1"

// Bytes of the hook's state on its bucket's device: a host vector, or
// device memory through cuda::device_api(), freed with it. Zeroing and
// copies on a device are queued on the calling thread's current stream.
class StateMemory {
 public:
  void* data() const { return dev_ ? dev_.get() : const_cast<uint8_t*>(host_.data()); }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  // `bytes` on `d`; what it held is kept only if neither changed.
  void resize(size_t bytes, Device d) {
    if (bytes == size_ && d == device_) return;
    if (d.is_cpu() || bytes == 0) {
      dev_.reset();
      host_.resize(bytes);
    } else {
      host_.clear();
      dev_ = device_alloc(bytes);
    }
    size_ = bytes;
    device_ = d;
  }
  void assign_zero(size_t bytes, Device d) {
    resize(bytes, d);
    cuda::zero(data(), bytes, d);
  }
  // The same bytes on `d` (a checkpoint loaded on the host, then used on a
  // CUDA bucket); waits for the copy.
  void move_to(Device d) {
    if (d == device_) return;
    StateMemory moved;
    moved.resize(size_, d);
    const Device copier = d.is_cpu() ? device_ : d;
    cuda::copy(moved.data(), data(), size_, copier);
    cuda::wait_queued(copier);
    *this = std::move(moved);
  }
  Bytes to_host() const {
    Bytes out(size_);
    cuda::copy(out.data(), data(), size_, device_);
    cuda::wait_queued(device_);
    return out;
  }
  static StateMemory of_host(Bytes b) {
    StateMemory m;
    m.size_ = b.size();
    m.host_ = std::move(b);
    return m;
  }

 private:
  static std::shared_ptr<void> device_alloc(size_t bytes) {
    auto api = cuda::device_api();
    if (!api)
      throw Error(ErrorCode::unavailable, "powersgd: a CUDA bucket, but this build has no CUDA");
    return std::shared_ptr<void>(api->device_alloc(bytes), [api](void* p) { api->device_free(p); });
  }
  Device device_ = Device::cpu();
  size_t size_ = 0;
  std::vector<uint8_t> host_;
  std::shared_ptr<void> dev_;
};

// --- the hook -------------------------------------------------------------------

class PowerSgdHook final : public CommHook {
 public:
  explicit PowerSgdHook(const PowerSgdOptions& o) : opt_(o) {}

  std::string name() const override { return opt_.batched ? "batched_powersgd" : "powersgd"; }

  Work run(Communicator& comm, GradBucket& b) override {
    const bool compress = iter_ >= opt_.start_iter;
    if (b.is_last) ++iter_;  // PyTorch's PowerSGDState.maybe_increase_iter
    if (!compress) {
      count_bytes(b.buffer.nbytes());
      return comm.allreduce(b.buffer, ReduceOp::avg);
    }
    State& st = state_for(b);
    // A 16-bit bucket (inside fp16_wrap/bf16_wrap) is widened to f32 for the
    // arithmetic, and P and Q travel in the bucket's 16-bit type, as
    // PyTorch's fp16_compress_wrapper(powerSGD_hook) does: half the bytes.
    const TensorView outer = b.buffer;
    const Device dev = outer.device;
    const bool narrow = outer.dtype == DType::f16 || outer.dtype == DType::bf16;
    const DType t = narrow ? DType::f32 : outer.dtype;
    const size_t es = dtype_size(t);
    auto view = [t, dev](const StateMemory& v) {
      return TensorView{v.data(), t, v.size() / dtype_size(t), dev};
    };
    if (narrow) st.wide.resize(outer.numel * es, dev);
    TensorView buf = narrow ? view(st.wide) : outer;
    // On a CUDA bucket every step is queued on the stream the bucket came
    // on, whichever thread runs it.
    void* const stream = cuda_stream();

    // Memory is sized here, on the caller's thread; the arithmetic runs in
    // the chain below.
    State* sp = &st;
    if (opt_.error_feedback) {
      // PyTorch: a bucket's first compressed step has no error yet.
      if (st.error.empty()) st.error.assign_zero(buf.nbytes(), dev);
    }
    if (opt_.batched) st.square.resize(st.side * st.side * es, dev);
    st.pbuf.resize((st.plain_numel + st.p_numel) * es, dev);
    TensorView pv = view(st.pbuf), qv = view(st.q);
    // What goes on the wire: P and Q themselves, or their 16-bit copies.
    TensorView pw = pv, qw = qv;
    if (narrow) {
      st.pwire.resize(pv.numel * 2, dev);
      st.qwire.resize(qv.numel * 2, dev);
      pw = TensorView{st.pwire.data(), outer.dtype, pv.numel, dev};
      qw = TensorView{st.qwire.data(), outer.dtype, qv.numel, dev};
    }
    // With error feedback the error memory first becomes this step's input
    // (gradient + error), the matrices are read from there and the result
    // written into the bucket, and then the memory becomes input - result,
    // the next error: no separate copy of the input (PyTorch keeps one).
    // Batched, the matrix is the input copied into a zero-padded square.
    TensorView src_all = opt_.error_feedback ? view(st.error) : buf;
    auto matrix_in = [sp, batched = opt_.batched](TensorView all, const Slot& s) {
      return batched ? TensorView{sp->square.data(), all.dtype, sp->side * sp->side, all.device}
                     : all.slice(s.offset, s.n * s.m);
    };
    auto source = [matrix_in, src_all](const Slot& s) { return matrix_in(src_all, s); };
    auto target = [matrix_in, buf](const Slot& s) { return matrix_in(buf, s); };
    const double world = comm.size();
    // The chain issues its second all-reduce later, from a continuation: it
    // holds a share(), which fails cleanly if the communicator is gone by then.
    std::shared_ptr<Communicator> cp = comm.share();
    const PowerSgdOptions opt = opt_;

    // Each bucket takes two all-reduces, the second issued when the first
    // completes. Every rank must issue them in the same order, so a bucket
    // starts only after the previous bucket's chain is done: P0 Q0 P1 Q1 ...
    // on every rank (without this, one rank could issue P1 before Q0 and
    // another after it).
    // The chain's handle names the bucket and carries the communicator's
    // deadline (twice it, plus a second, like every op's own wait).
    Work start = Work::pending(name() + " on bucket " + std::to_string(b.index) + " (rank " +
                                   std::to_string(comm.rank()) + ")",
                               comm.timeout() * 2 + std::chrono::seconds(1));
    if (b.index == 0)
      start.complete();
    else
      tail_.then([start](const Work&) { start.complete(); });
    Work first = start.then_work([this, sp, cp, pv, qv, pw, qw, buf, outer, narrow, src_all, opt,
                                  source, dev, stream](const Work&) -> Work {
      StreamScope on(stream, dev);
      LowRankMath& m = low_rank_math_for(dev);
      const size_t es = dtype_size(buf.dtype);
      if (narrow) hook_math_for(dev).decompress(outer, buf);
      if (opt.error_feedback) m.axpby(1.0, buf, 1.0, src_all);  // error += gradient
      if (opt.batched) {
        uint8_t* sq = static_cast<uint8_t*>(sp->square.data());
        cuda::zero(sq + buf.nbytes(), sp->square.size() - buf.nbytes(), dev);
        cuda::copy(sq, src_all.data, buf.nbytes(), dev);
      }
      // [uncompressed tensors | P factors] go in one all-reduce.
      size_t at_plain = 0;
      for (const auto& [off, n] : sp->plain) {
        cuda::copy(static_cast<uint8_t*>(pv.data) + at_plain * es,
                   static_cast<uint8_t*>(src_all.data) + off * es, n * es, dev);
        at_plain += n;
      }
      if (!opt.warm_start || !sp->have_q) {
        // Every rank derives the same seed, so every rank starts from the
        // same Q; a hash of (seed, draws) costs the same at any step.
        m.fill_normal(qv, mix_seed(opt.seed, rng_draws_++));
        sp->have_q = true;
      }
      // Orthogonalised every step, the warm-started Q too (as PyTorch does):
      // the last step's Q is M^T P, and reusing it as it stands squares the
      // condition number, so with singular values far apart the later
      // columns drown in rounding.
      for (const Slot& s : sp->slots)
        m.orthogonalize(qv.slice(s.q_off, s.m * s.r), s.m, s.r, opt.orthogonalization_epsilon);
      for (const Slot& s : sp->slots)
        m.gemm(false, false, s.n, s.r, s.m, source(s), qv.slice(s.q_off, s.m * s.r),
               pv.slice(sp->plain_numel + s.p_off, s.n * s.r));
      count_bytes(pw.nbytes() + qw.nbytes());
      if (narrow && pv.numel) hook_math_for(dev).compress(pv, pw, 1);
      // Issued on this thread with `stream` current: ordered after the above.
      return pv.numel ? cp->allreduce(pw, ReduceOp::sum) : Work();
    });
    tail_ =
        first
            .then_work(
                [sp, cp, pv, qv, pw, qw, narrow, opt, source, dev, stream](const Work& w) -> Work {
                  if (auto e = w.error()) throw *e;
                  StreamScope on(stream, dev);
                  if (!dev.is_cpu()) w.wait_on(stream);  // P, reduced, before it is read
                  LowRankMath& m = low_rank_math_for(dev);
                  if (narrow && pv.numel) hook_math_for(dev).decompress(pw, pv);
                  for (const Slot& s : sp->slots) {
                    TensorView p = pv.slice(sp->plain_numel + s.p_off, s.n * s.r);
                    m.orthogonalize(p, s.n, s.r, opt.orthogonalization_epsilon);
                    m.gemm(true, false, s.m, s.r, s.n, source(s), p, qv.slice(s.q_off, s.m * s.r));
                  }
                  if (narrow && qv.numel) hook_math_for(dev).compress(qv, qw, 1);
                  return qv.numel ? cp->allreduce(qw, ReduceOp::sum) : Work();
                })
            .then([sp, pv, qv, qw, buf, outer, narrow, src_all, opt, target, world, dev,
                   stream](const Work& w) {
              if (auto e = w.error()) throw *e;
              StreamScope on(stream, dev);
              if (!dev.is_cpu()) w.wait_on(stream);  // Q, reduced, before it is read
              LowRankMath& m = low_rank_math_for(dev);
              if (narrow && qv.numel) hook_math_for(dev).decompress(qw, qv);
              m.axpby(0.0, qv, 1.0 / world, qv);
              for (const Slot& s : sp->slots)
                m.gemm(false, true, s.n, s.m, s.r, pv.slice(sp->plain_numel + s.p_off, s.n * s.r),
                       qv.slice(s.q_off, s.m * s.r), target(s));
              if (opt.batched) cuda::copy(buf.data, sp->square.data(), buf.nbytes(), dev);
              size_t at = 0;
              for (const auto& [off, n] : sp->plain) {
                TensorView src = pv.slice(at, n), dst = buf.slice(off, n);
                m.axpby(1.0 / world, src, 0.0, dst);
                at += n;
              }
              // What this rank meant to send minus what everyone now holds.
              if (opt.error_feedback) m.axpby(-1.0, buf, 1.0, src_all);
              if (!opt.warm_start) sp->have_q = false;
              if (narrow) hook_math_for(dev).compress(buf, outer, 1);
              // The bucket holds the result when the hook's Work ends (the
              // reducer then copies it out on the caller's stream, which
              // need not be this one).
              cuda::wait_queued(dev);
            });
    return tail_;
  }

  Bytes save_state() const override {
    Bytes out;
    put_u64(out, kStateMagic);
    put_u64(out, static_cast<uint64_t>(opt_.rank));
    put_u64(out, opt_.batched);
    put_u64(out, iter_);
    put_u64(out, rng_draws_);
    put_u64(out, states_.size());
    for (const auto& [index, st] : states_) {
      put_u64(out, index);
      put_u64(out, st.layout);
      put_u64(out, st.have_q);
      put_bytes(out, st.q.to_host());
      put_bytes(out, st.error.to_host());
    }
    return out;
  }

  void load_state(const Bytes& in) override {
    StateReader r(in, "comm hook: powersgd: the saved state is truncated or not PowerSGD's");
    if (r.u64() != kStateMagic) throw bad("powersgd: the state to load is not PowerSGD's");
    uint64_t rank = r.u64(), batched = r.u64();
    if (rank != static_cast<uint64_t>(opt_.rank) || batched != opt_.batched)
      throw bad("powersgd: the state was saved by " + std::string(batched ? "batched_" : "") +
                "powersgd at rank " + std::to_string(rank) + ", and this hook is " + name() +
                " at rank " + std::to_string(opt_.rank));
    uint64_t iter = r.u64(), draws = r.u64(), count = r.u64();
    std::map<size_t, State> states;
    for (uint64_t i = 0; i < count; ++i) {
      State st;
      size_t index = r.u64();
      st.layout = r.u64();
      st.have_q = r.u64() != 0;
      st.q = StateMemory::of_host(r.bytes());
      st.error = StateMemory::of_host(r.bytes());
      states[index] = std::move(st);
    }
    if (r.remaining() != 0) throw bad("powersgd: the state to load has trailing bytes");
    iter_ = iter;
    rng_draws_ = draws;
    states_ = std::move(states);
  }

 private:
  struct Slot {
    size_t offset, n, m, r;  // a gradient at `offset` viewed as n x m, compressed at rank r
    size_t p_off, q_off;     // its factors' places in the P and Q buffers
  };
  struct State {
    uint64_t layout = 0;  // fingerprint of the bucket's gradients and dtype
    bool laid_out = false;
    std::vector<Slot> slots;
    std::vector<std::pair<size_t, size_t>> plain;  // uncompressed gradients: offset, numel
    size_t plain_numel = 0, p_numel = 0, side = 0;
    bool have_q = false;
    StateMemory q, error;            // kept across iterations (and saved)
    StateMemory pbuf, square;        // scratch
    StateMemory wide, pwire, qwire;  // 16-bit buckets: f32 copy, P and Q on the wire
  };

  State& state_for(const GradBucket& b) {
    const DType t = b.buffer.dtype;
    const Device dev = b.buffer.device;
    if (!is_floating(t))
      throw Error(ErrorCode::invalid_argument,
                  "comm hook " + name() + ": bucket " + std::to_string(b.index) + " holds " +
                      std::string(to_string(t)) + " gradients; PowerSGD takes floating-point ones");
    uint64_t h = kFnvBasis;
    auto mix = [&h](uint64_t v) { h = fnv_mix(h, v); };
    mix(static_cast<uint64_t>(t));
    mix(b.buffer.numel);
    for (size_t k = 0; k < b.grads.size(); ++k) {
      mix(b.grads[k].numel);
      mix(k < b.rows.size() ? b.rows[k] : 0);
    }
    State& st = states_[b.index];
    if (st.laid_out && st.layout == h) return st;
    if (!st.laid_out && st.layout == h) {
      // Loaded from a checkpoint: keep Q and the error, rebuild the layout.
    } else {
      // A new bucket, or one whose contents changed: its history does not apply.
      st = State();
    }
    st.layout = h;
    st.laid_out = true;
    const size_t es = dtype_size(t);
    size_t p_numel = 0, q_numel = 0;
    if (opt_.batched) {
      st.side = static_cast<size_t>(std::ceil(std::sqrt(static_cast<double>(b.buffer.numel))));
      while (st.side * st.side < b.buffer.numel) ++st.side;
      size_t r = std::min<size_t>(st.side, static_cast<size_t>(opt_.rank));
      st.slots.push_back({0, st.side, st.side, r, 0, 0});
      p_numel = q_numel = st.side * r;
    } else {
      const uint8_t* base = static_cast<const uint8_t*>(b.buffer.data);
      for (size_t k = 0; k < b.grads.size(); ++k) {
        const TensorView& g = b.grads[k];
        size_t off = (static_cast<const uint8_t*>(g.data) - base) / es;
        size_t n = k < b.rows.size() ? b.rows[k] : 0;
        size_t m = n ? g.numel / n : 0;
        size_t r = std::min({n, m, static_cast<size_t>(opt_.rank)});
        if (n > 0 && powersgd_compresses(n, m, r, opt_.min_compression_rate)) {
          st.slots.push_back({off, n, m, r, p_numel, q_numel});
          p_numel += n * r;
          q_numel += m * r;
        } else if (g.numel) {
          st.plain.emplace_back(off, g.numel);
          st.plain_numel += g.numel;
        }
      }
    }
    st.p_numel = p_numel;
    // The arithmetic runs in f64 for f64 buckets, else in f32.
    const size_t ws = t == DType::f64 ? 8 : 4;
    // A loaded checkpoint's state is on the host until its bucket shows
    // which device it belongs on.
    st.q.move_to(dev);
    st.error.move_to(dev);
    if (st.q.size() != q_numel * ws) {
      st.q.assign_zero(q_numel * ws, dev);
      st.have_q = false;
    }
    const size_t wide_bytes = b.buffer.numel * ws;
    if (!st.error.empty() && st.error.size() != wide_bytes)
      throw bad(name() + ": the loaded state's error for bucket " + std::to_string(b.index) +
                " does not fit the bucket; was it saved with another model or bucket size?");
    return st;
  }

  PowerSgdOptions opt_;
  uint64_t iter_ = 0;
  uint64_t rng_draws_ = 0;
  std::map<size_t, State> states_;
  Work tail_;  // the last bucket's chain: the next one starts after it
};

}  // namespace

bool powersgd_compresses(size_t n, size_t m, size_t r, double min_compression_rate) {
  if (n == 0 || m == 0 || r == 0) return false;
  return static_cast<double>(n + m) * static_cast<double>(r) * min_compression_rate <
         static_cast<double>(n) * static_cast<double>(m);
}

std::vector<std::string> powersgd_param_names() {
  return {"rank",
          "start_iter",
          "min_compression_rate",
          "error_feedback",
          "warm_start",
          "orthogonalization_epsilon",
          "seed"};
}

std::unique_ptr<CommHook> make_powersgd_hook(const PowerSgdOptions& o) {
  const std::string name = o.batched ? "batched_powersgd" : "powersgd";
#if !COLLIE_HAVE_BLAS
  throw Error(ErrorCode::unavailable, "comm hook " + name +
                                          ": collie was built without BLAS "
                                          "(install libopenblas-dev and reconfigure)");
#endif
  if (o.rank < 1) throw bad(name + ": rank must be at least 1, not " + std::to_string(o.rank));
  if ((o.error_feedback || o.warm_start) && o.start_iter <= 1)
    throw bad(name + ": start_iter=" + std::to_string(o.start_iter) +
              " with error_feedback or warm_start: it must be > 1, because buckets are rebuilt "
              "after the first iteration and the state kept per bucket would not fit them");
  if (!(o.min_compression_rate >= 1)) throw bad(name + ": min_compression_rate must be at least 1");
  return std::make_unique<PowerSgdHook>(o);
}

std::unique_ptr<CommHook> make_powersgd_hook(const HookParams& p, bool batched) {
  const std::string name = batched ? "batched_powersgd" : "powersgd";
  PowerSgdOptions o;
  o.batched = batched;
  o.rank = static_cast<int>(hook_param_int(p, name, "rank", o.rank, 1, 1 << 20));
  o.start_iter = static_cast<uint64_t>(
      hook_param_int(p, name, "start_iter", static_cast<int64_t>(o.start_iter), 0, INT64_MAX));
  o.min_compression_rate =
      hook_param_double(p, name, "min_compression_rate", o.min_compression_rate, 1, 1e30);
  o.error_feedback = hook_param_bool(p, name, "error_feedback", o.error_feedback);
  o.warm_start = hook_param_bool(p, name, "warm_start", o.warm_start);
  o.orthogonalization_epsilon =
      hook_param_double(p, name, "orthogonalization_epsilon", o.orthogonalization_epsilon, 0, 1);
  o.seed = static_cast<uint64_t>(hook_param_int(p, name, "seed", 0, 0, INT64_MAX));
  return make_powersgd_hook(o);
}

}  // namespace collie
