// tests/fuzz/models.h: what the checkpoint targets (fuzz_reducer_state,
// fuzz_hook_state) and their seed maker (make_seeds.cc) share: a
// communicator of one rank, the hooks and averagers whose state is loaded,
// and a small model whose gradients travel through them. The seed maker
// saves real checkpoints of exactly these, so that the fuzzer starts from
// inputs that load and mutates them from there. The targets read the
// checkpoint formats here too, independently of collie's own readers, to
// check what a loaded state saves.
#pragma once

#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "collie/comm.h"
#include "hooks/comm_hook.h"
#include "hooks/model_averager.h"
#include "reducer/reducer.h"

namespace collie::fuzz {

// One rank, on the TCP backend (no sockets at one rank), made once per
// process: every input runs over it.
inline Communicator& solo() {
  static std::unique_ptr<Communicator> comm = [] {
    Options o;
    o.rank = 0;
    o.world_size = 1;
    o.local_rank = 0;
    o.local_world_size = 1;
    o.backend = "tcp";
    o.timeout = std::chrono::seconds(20);
    return connect(o);
  }();
  return *comm;
}

// Hook specs a checkpoint is loaded into: the first byte of an input picks
// one (modulo the count). start_iter=2 so that a few iterations reach the
// compressed path.
inline const std::vector<std::string>& hook_specs() {
  static const std::vector<std::string> specs = {
      "allreduce",
      "noop",
      "fp16",
      "bf16_wrap:allreduce",
      "powersgd:rank=1,start_iter=2",
      "powersgd:rank=2,start_iter=2,warm_start=0",
      "powersgd:rank=1,start_iter=2,error_feedback=0",
      "batched_powersgd:rank=1,start_iter=2",
      "fp16_wrap:powersgd:rank=1,start_iter=2",
      "bf16_wrap:batched_powersgd:rank=2,start_iter=2",
      "post_local_sgd:start_iter=2",
      "post_local_sgd:start_iter=2,subgroup=none",
  };
  return specs;
}

// Builds the hook, or null where this build cannot (PowerSGD without BLAS:
// an `unavailable` error, which is not the input's fault).
inline std::unique_ptr<CommHook> hook_or_null(const std::string& spec) {
  try {
    return make_comm_hook(spec);
  } catch (const Error& e) {
    if (e.code() == ErrorCode::unavailable) return nullptr;
    throw;
  }
}

// The model: a few parameters of two dtypes, matrices (rows > 0) and
// vectors, in buckets small enough that there are several.
struct Model {
  std::vector<float> w0 = std::vector<float>(8 * 6), g0 = w0;
  std::vector<float> b0 = std::vector<float>(6), gb0 = b0;
  std::vector<double> w1 = std::vector<double>(4 * 5), g1 = w1;
  std::vector<float> w2 = std::vector<float>(3 * 3), g2 = w2;

  std::vector<Parameter> params() {
    return {{view_of(w0.data(), w0.size()), view_of(g0.data(), g0.size()), 8},
            {view_of(b0.data(), b0.size()), view_of(gb0.data(), gb0.size()), 0},
            {view_of(w1.data(), w1.size()), view_of(g1.data(), g1.size()), 4},
            {view_of(w2.data(), w2.size()), view_of(g2.data(), g2.size()), 3}};
  }
  // Gradients of iteration `it`: small, exact in f16 and bf16 (multiples of
  // 1/8 below 4), so that the compressing hooks return them unchanged.
  void fill(uint64_t it) {
    size_t k = 0;
    auto value = [&] { return static_cast<double>((k++ * 7 + it * 3) % 29) / 8.0 - 1.75; };
    for (auto& g : g0) g = static_cast<float>(value());
    for (auto& g : gb0) g = static_cast<float>(value());
    for (auto& g : g1) g = value();
    for (auto& g : g2) g = static_cast<float>(value());
  }
};

inline ReducerOptions reducer_options(const std::string& spec) {
  ReducerOptions o;
  o.comm_hook = spec;
  o.first_bucket_bytes = 64;  // several buckets
  o.bucket_bytes = 128;
  return o;
}

// One iteration of the reducer over the model; `it` picks the gradients.
inline void train_step(Reducer& red, Model& m, uint64_t it) {
  red.prepare_for_backward();
  m.fill(it);
  for (size_t i = 4; i-- > 0;) red.mark_grad_ready(i);
  red.finalize_backward();
}

// The averagers whose step count is loaded: index 0 periodic, 1 hierarchical.
inline constexpr int kNumAveragers = 2;
inline std::vector<float> averaged_values() {
  return {1.5f, -2.0f, 0.25f};
}

// --- the checkpoint formats, read here independently of collie's readers ---

// Little-endian u64s and length-prefixed byte strings; nullopt past the end.
class Reader {
 public:
  explicit Reader(const Bytes& b) : b_(b) {}
  std::optional<uint64_t> u64() {
    if (b_.size() - at_ < 8) return std::nullopt;
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(b_[at_ + i]) << (8 * i);
    at_ += 8;
    return v;
  }
  std::optional<Bytes> bytes() {
    auto n = u64();
    if (!n || *n > b_.size() - at_) return std::nullopt;
    Bytes v(b_.begin() + static_cast<long>(at_), b_.begin() + static_cast<long>(at_ + *n));
    at_ += *n;
    return v;
  }
  Bytes rest() const { return Bytes(b_.begin() + static_cast<long>(at_), b_.end()); }

 private:
  const Bytes& b_;
  size_t at_ = 0;
};

inline void put(Bytes& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

// A reducer checkpoint: magic, parameter count, iteration, rebuilt, the
// bucket order (count, then each), the hook's state (length, then bytes).
struct ReducerCheckpoint {
  uint64_t params = 0, iteration = 0;
  bool rebuilt = false;
  std::vector<uint64_t> order;
  Bytes hook;
};
inline std::optional<ReducerCheckpoint> read_reducer_checkpoint(const Bytes& b) {
  Reader r(b);
  ReducerCheckpoint c;
  auto magic = r.u64(), params = r.u64(), iteration = r.u64(), rebuilt = r.u64(), count = r.u64();
  if (!count) return std::nullopt;
  c.params = *params;
  c.iteration = *iteration;
  c.rebuilt = *rebuilt != 0;
  for (uint64_t i = 0; i < *count; ++i) {
    auto p = r.u64();
    if (!p) return std::nullopt;
    c.order.push_back(*p);
  }
  auto hook = r.bytes();
  if (!hook || !r.rest().empty()) return std::nullopt;
  (void)magic;
  c.hook = *hook;
  return c;
}

// What PowerSGD saves after loading `b` (which it accepted): the same
// header, then its per-bucket states in bucket order, the last of any
// bucket given twice, have_q as 0 or 1.
inline Bytes powersgd_canonical(const Bytes& b) {
  Reader r(b);
  Bytes out;
  for (int i = 0; i < 5; ++i) put(out, r.u64().value_or(0));  // magic, rank, batched, iter, draws
  uint64_t count = r.u64().value_or(0);
  std::map<uint64_t, std::tuple<uint64_t, bool, Bytes, Bytes>> states;
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t index = r.u64().value_or(0), layout = r.u64().value_or(0);
    bool have_q = r.u64().value_or(0) != 0;
    Bytes q = r.bytes().value_or(Bytes{}), error = r.bytes().value_or(Bytes{});
    states[index] = {layout, have_q, q, error};
  }
  put(out, states.size());
  for (const auto& [index, st] : states) {
    put(out, index);
    put(out, std::get<0>(st));
    put(out, std::get<1>(st));
    for (const Bytes* v : {&std::get<2>(st), &std::get<3>(st)}) {
      put(out, v->size());
      out.insert(out.end(), v->begin(), v->end());
    }
  }
  return out;
}

// What a hook of `spec` saves after loading `state` (which it accepted).
inline Bytes hook_canonical(const std::string& spec, const Bytes& state) {
  return spec.find("powersgd") != std::string::npos ? powersgd_canonical(state) : state;
}

}  // namespace collie::fuzz
