// reducer/nonfinite_check.h: which rank made the NaN? A NaN or Inf in one
// rank's gradient is averaged into every rank's, and where it came from is
// lost. With ReducerOptions::check_nonfinite the reducer searches each
// gradient as it enters its bucket (in the copy that puts it there, in copy
// mode; over its slot with bucket views), before any rank averages it, and
// the ranks gather what each found in one small all-gather issued once
// every bucket's reduction has ended (a hook may issue collectives late,
// from continuations), so that every rank can name the rank, the
// parameter, the element and the iteration.
//
// Host memory only. A non-finite value that only the sum makes (finite
// gradients whose sum overflows) is not one this finds.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "collie/comm.h"

namespace collie {

class NonfiniteCheck {
 public:
  // A new iteration: nothing found yet.
  void begin();
  // Gradient `param` is copied from `src` into `slot`, searched as it goes.
  void copy_in(size_t param, const TensorView& slot, const void* src);
  // Gradient `param` is already in `slot` (bucket views): searched there.
  void scan(size_t param, const TensorView& slot);
  // Collective, after every bucket's reduction: every rank's findings.
  Work exchange(Communicator& comm);
  // Once exchange's Work is done: "" when no rank found any, else a message,
  // the same on every rank, naming each rank that did, its first parameter
  // (`name(i)`) and element.
  std::string report(const std::function<std::string(size_t)>& name, uint64_t iteration) const;

 private:
  void note(size_t param, size_t count, size_t first, double value);
  // This iteration's findings on this rank, a parameter at most once
  // (usually none): how many non-finite elements, the first, its value.
  struct Found {
    size_t param, count, first;
    double value;
  };
  std::vector<Found> found_;
  static constexpr size_t kRow = 5;
  std::vector<int64_t> mine_, all_;
};

}  // namespace collie
