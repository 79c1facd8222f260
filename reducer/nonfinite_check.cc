#include "reducer/nonfinite_check.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

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

void NonfiniteCheck::begin(bool in_pass, size_t buckets) {
  in_pass_ = in_pass;
  found_.clear();
  all_.clear();
  capped_ = false;
  seen_.resize(in_pass ? buckets : 0);
  for (auto& s : seen_) {
    s.hits.clear();
    s.searched = false;
  }
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
  const Found f{-1, param, count, first, value};  // -1: this rank (exchange fills it in)
  if (it != found_.end())
    *it = f;
  else
    found_.push_back(f);
}

void NonfiniteCheck::copy_in(size_t param, const TensorView& slot, const void* src) {
  require_host(slot);
  if (in_pass_) {
    std::memcpy(slot.data, src, slot.nbytes());
    return;
  }
  auto f = kernels::copy_find_nonfinite(slot.dtype, slot.data, src, slot.numel);
  note(param, f.count, f.first, f.value);
}

void NonfiniteCheck::scan(size_t param, const TensorView& slot) {
  require_host(slot);
  if (in_pass_) return;
  auto f = kernels::find_nonfinite(slot.dtype, slot.data, slot.numel);
  note(param, f.count, f.first, f.value);
}

kernels::NonFiniteSeen* NonfiniteCheck::seen_for(size_t b, const std::vector<size_t>& starts) {
  kernels::NonFiniteSeen& s = seen_.at(b);
  s.starts = starts;
  s.hits.clear();
  s.searched = false;
  return &s;
}

void NonfiniteCheck::exchange(Communicator& comm,
                              const std::function<size_t(size_t, size_t)>& param_of) {
  me_ = comm.rank();
  for (auto& f : found_)
    if (f.origin < 0) f.origin = me_;
  for (size_t b = 0; b < seen_.size(); ++b)
    for (const auto& h : seen_[b].hits)
      found_.push_back({h.rank, param_of(b, h.tensor), h.count,
                        h.first - (seen_[b].starts.empty() ? 0 : seen_[b].starts[h.tensor]),
                        h.value});
  const size_t n = static_cast<size_t>(comm.size());
  // First how many each rank found: almost always none anywhere, and then
  // that is all.
  int64_t mine = static_cast<int64_t>(found_.size());
  std::vector<int64_t> counts(n);
  comm.allgather(view_of(&mine, 1), view_of(counts.data(), n)).wait();
  if (std::all_of(counts.begin(), counts.end(), [](int64_t c) { return c == 0; })) return;
  // Then what, up to kMaxRows findings a rank, the lowest parameters first.
  std::sort(found_.begin(), found_.end(), [](const Found& a, const Found& b) {
    return a.origin != b.origin ? a.origin < b.origin : a.param < b.param;
  });
  std::vector<int64_t> rows(kRow * kMaxRows, -1), all(kRow * kMaxRows * n);
  for (size_t i = 0; i < found_.size() && i < kMaxRows; ++i) {
    const Found& f = found_[i];
    int64_t* r = &rows[kRow * i];
    r[0] = f.origin;
    r[1] = static_cast<int64_t>(f.param);
    r[2] = static_cast<int64_t>(f.count);
    r[3] = static_cast<int64_t>(f.first);
    std::memcpy(&r[4], &f.value, sizeof f.value);
  }
  comm.allgather(view_of(rows.data(), rows.size()), view_of(all.data(), all.size())).wait();
  std::map<std::pair<int, size_t>, Found> merged;
  for (size_t q = 0; q < n; ++q) {
    capped_ = capped_ || counts[q] > static_cast<int64_t>(kMaxRows);
    for (size_t i = 0; i < kMaxRows; ++i) {
      const int64_t* r = &all[kRow * (q * kMaxRows + i)];
      if (r[0] < 0) break;
      Found f{static_cast<int>(r[0]), static_cast<size_t>(r[1]), static_cast<size_t>(r[2]),
              static_cast<size_t>(r[3]), 0};
      std::memcpy(&f.value, &r[4], sizeof f.value);
      auto [it, fresh] = merged.try_emplace({f.origin, f.param}, f);
      if (fresh) continue;
      // The same parameter of the same rank, searched in parts by several
      // ranks (each its slice): the counts add up, the first is the lowest.
      it->second.count += f.count;
      if (f.first < it->second.first) {
        it->second.first = f.first;
        it->second.value = f.value;
      }
    }
  }
  for (auto& [key, f] : merged) all_.push_back(f);  // by origin, then parameter
}

std::string NonfiniteCheck::report(const std::function<std::string(size_t)>& name,
                                   uint64_t iteration) const {
  std::string found;
  for (size_t i = 0; i < all_.size();) {
    // Rank all_[i].origin's parameters, the lowest first.
    const Found& lowest = all_[i];
    size_t params = 0, count = 0;
    for (; i < all_.size() && all_[i].origin == lowest.origin; ++i) {
      ++params;
      count += all_[i].count;
    }
    const std::string at_least = capped_ ? "at least " : "";
    found += (found.empty() ? "" : "; ") + std::string("rank ") + std::to_string(lowest.origin) +
             ": parameter " + name(lowest.param) + " has " + what(lowest.value) + " at element " +
             std::to_string(lowest.first) + " (" + at_least + std::to_string(count) +
             (count == 1 ? " non-finite element in " : " non-finite elements in ") + at_least +
             std::to_string(params) + (params == 1 ? " parameter)" : " parameters)");
  }
  if (found.empty()) return "";
  return "non-finite gradients at iteration " + std::to_string(iteration) +
         ", found before averaging: " + found + "; so their averages are NaN or Inf on every rank";
}

}  // namespace collie
