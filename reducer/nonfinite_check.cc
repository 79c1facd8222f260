#include "reducer/nonfinite_check.h"

#include <cmath>
#include <cstring>

#include "base/nonfinite.h"

namespace collie {

namespace {

std::string what(double v) {
  return std::isnan(v) ? "NaN" : v > 0 ? "+Inf" : "-Inf";
}

void require_host(const TensorView& slot) {
  if (!slot.device.is_cpu())
    throw Error(ErrorCode::unavailable,
                "reducer: the non-finite gradient check (check_nonfinite, "
                "COLLIE_CHECK_NONFINITE) searches host memory only; this bucket is on " +
                    to_string(slot.device));
}

}  // namespace

void NonfiniteCheck::begin() {
  params_ = 0;
  param_ = -1;
  element_ = elements_ = 0;
  value_ = 0;
}

void NonfiniteCheck::note(size_t param, size_t count, size_t first, double value) {
  if (count == 0) return;
  ++params_;
  elements_ += static_cast<int64_t>(count);
  if (param_ < 0 || static_cast<int64_t>(param) < param_) {
    param_ = static_cast<int64_t>(param);
    element_ = static_cast<int64_t>(first);
    value_ = value;
  }
}

void NonfiniteCheck::copy_in(size_t param, const TensorView& slot, const void* src) {
  require_host(slot);
  auto f = kernels::copy_find_nonfinite(slot.dtype, slot.data, src, slot.numel);
  note(param, f.count, f.first, f.value);
}

void NonfiniteCheck::scan(size_t param, const TensorView& slot) {
  require_host(slot);
  auto f = kernels::find_nonfinite(slot.dtype, slot.data, slot.numel);
  note(param, f.count, f.first, f.value);
}

Work NonfiniteCheck::exchange(Communicator& comm) {
  mine_ = {params_, param_, element_, elements_, 0};
  std::memcpy(&mine_[4], &value_, sizeof value_);
  all_.assign(kRow * static_cast<size_t>(comm.size()), 0);
  return comm.allgather(view_of(mine_.data(), kRow), view_of(all_.data(), all_.size()));
}

std::string NonfiniteCheck::report(const std::function<std::string(size_t)>& name,
                                   uint64_t iteration) const {
  std::string found;
  for (size_t r = 0; r * kRow < all_.size(); ++r) {
    const int64_t* q = &all_[r * kRow];
    if (q[0] == 0) continue;
    double v;
    std::memcpy(&v, &q[4], sizeof v);
    found += (found.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) +
             ": parameter " + name(static_cast<size_t>(q[1])) + " has " + what(v) + " at element " +
             std::to_string(q[2]) + " (" + std::to_string(q[3]) +
             (q[3] == 1 ? " non-finite element in " : " non-finite elements in ") +
             std::to_string(q[0]) + (q[0] == 1 ? " parameter)" : " parameters)");
  }
  if (found.empty()) return "";
  return "non-finite gradients at iteration " + std::to_string(iteration) +
         ", found before averaging: " + found + "; so their averages are NaN or Inf on every rank";
}

}  // namespace collie
