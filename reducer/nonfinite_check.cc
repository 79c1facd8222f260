#include "reducer/nonfinite_check.h"

#include <algorithm>
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
  found_.clear();
}

void NonfiniteCheck::note(size_t param, size_t count, size_t first, double value) {
  // A gradient searched again (it arrived again and its slot holds the
  // sum) replaces what was found in it before.
  auto it =
      std::find_if(found_.begin(), found_.end(), [&](const Found& f) { return f.param == param; });
  if (count == 0) {
    if (it != found_.end()) found_.erase(it);
    return;
  }
  const Found f{param, count, first, value};
  if (it != found_.end())
    *it = f;
  else
    found_.push_back(f);
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
  // Parameters with a non-finite element, the lowest of them, its first
  // such element and value, and how many elements in all.
  mine_.assign(kRow, 0);
  mine_[0] = static_cast<int64_t>(found_.size());
  const Found* lowest = nullptr;
  for (const Found& f : found_) {
    mine_[3] += static_cast<int64_t>(f.count);
    if (!lowest || f.param < lowest->param) lowest = &f;
  }
  if (lowest) {
    mine_[1] = static_cast<int64_t>(lowest->param);
    mine_[2] = static_cast<int64_t>(lowest->first);
    std::memcpy(&mine_[4], &lowest->value, sizeof lowest->value);
  }
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
