// reducer/nonfinite_check.h: which rank made the NaN? A NaN or Inf in one
// rank's gradient is averaged into every rank's, and where it came from is
// lost. With ReducerOptions::check_nonfinite the reducer has every rank's
// gradients searched before they are averaged, and the ranks gather what
// each found, so that every rank can name the rank, the parameter, the
// element and the iteration.
//
// Where the search runs: with the default allreduce hook on host buckets,
// inside the all-reduce's own reduction (Communicator::allreduce with a
// kernels::NonFiniteSeen: each element is tested as the reduction loads
// it, so the search adds no pass over memory; each rank sees part of every
// rank's input, and the parts add up). Otherwise (a compressing hook, whose
// all-reduce sees other values) each gradient as it enters its bucket: in
// the copy that puts it there in copy mode, in a pass of its own over its
// slot with bucket views. The findings are gathered once every bucket's
// reduction has ended (a hook may issue collectives late, from
// continuations): one small all-gather of how many each rank found, and
// only when some rank found any, a second with what.
//
// Host memory only. A non-finite value that only the sum makes (finite
// gradients whose sum overflows) is not one this finds.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/nonfinite.h"
#include "collie/comm.h"

namespace collie {

class NonfiniteCheck {
 public:
  // A new iteration: nothing found yet. `in_pass`: this iteration's
  // buckets go to all-reduces that search as they reduce (seen_for), so
  // copy_in only copies and scan does nothing.
  void begin(bool in_pass, size_t buckets);
  bool in_pass() const { return in_pass_; }
  // Gradient `param` is copied from `src` into `slot`, searched as it goes.
  void copy_in(size_t param, const TensorView& slot, const void* src);
  // Gradient `param` is already in `slot` (bucket views): searched there.
  void scan(size_t param, const TensorView& slot);
  // Where bucket b's all-reduce records what it finds (in_pass), its
  // tensors starting at the element offsets `starts`. Lives until the next
  // begin().
  kernels::NonFiniteSeen* seen_for(size_t b, const std::vector<size_t>& starts);
  // Collective and blocking, after every bucket's reduction: every rank's
  // findings, gathered. `param_of(b, k)`: the parameter that is tensor k of
  // bucket b.
  void exchange(Communicator& comm, const std::function<size_t(size_t, size_t)>& param_of);
  // After exchange: "" when no rank's input held any, else a message, the
  // same on every rank, naming each rank whose gradients did, its first
  // parameter (`name(i)`) and element.
  std::string report(const std::function<std::string(size_t)>& name, uint64_t iteration) const;

 private:
  // A parameter of rank `origin`'s with non-finite elements: how many (of
  // those this rank searched), the first, its value.
  struct Found {
    int origin;
    size_t param, count, first;
    double value;
  };
  void note(size_t param, size_t count, size_t first, double value);

  bool in_pass_ = false;
  std::vector<Found> found_;                  // this rank's, this iteration
  std::vector<kernels::NonFiniteSeen> seen_;  // per bucket, in_pass
  int me_ = -1;                               // set by exchange
  // Every rank's, merged by (origin, param); `capped`: some rank found
  // more than one all-gather row holds (kMaxRows), so counts are at least.
  std::vector<Found> all_;
  bool capped_ = false;
  static constexpr size_t kRow = 5, kMaxRows = 16;
};

}  // namespace collie
