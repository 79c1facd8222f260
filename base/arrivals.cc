#include "base/arrivals.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace collie {

namespace {

uint32_t seq_of(uint64_t e) {
  return static_cast<uint32_t>(e >> 32);
}
uint32_t ran_of(uint64_t e) {
  return static_cast<uint32_t>(e);
}

std::string ms(double v) {
  char b[32];
  std::snprintf(b, sizeof b, v >= 10 ? "%.0f" : v >= 0.1 ? "%.2g" : "%.1g", v);
  return b;
}

}  // namespace

std::string Arrivals::summary() const {
  if (collectives == 0) return "";
  std::vector<int> order;
  for (size_t r = 0; r < last.size(); ++r)
    if (last[r]) order.push_back(static_cast<int>(r));
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return last[a] > last[b]; });
  std::string s;
  for (size_t i = 0; i < order.size(); ++i) {
    const int r = order[i];
    const double pct = 100.0 * static_cast<double>(last[r]) / static_cast<double>(collectives);
    char b[64];
    std::snprintf(b, sizeof b, "%.0f %%", pct);
    s += (i ? "; rank " : "rank ") + std::to_string(r) + (i ? " in " : " arrived last in ") + b;
    if (i == 0) s += " of " + std::to_string(collectives) + " collectives";
    s += ", median " + ms(median_late_ms[r]) + " ms after the first";
  }
  return s;
}

namespace arrivals {

Log::Log() : ticks0_(ticks()), time0_(std::chrono::steady_clock::now()) {}

std::vector<uint64_t> Log::snapshot() const {
  std::vector<uint64_t> v(kEntries + 1);
  for (size_t i = 0; i < kEntries; ++i) v[i] = ring_[i].load(std::memory_order_relaxed);
  // The counter's rate over this log's life, at least 1 ms of it (each
  // end read within tens of nanoseconds: an error of 1e-4 at worst).
  const auto least = time0_ + std::chrono::milliseconds(1);
  while (std::chrono::steady_clock::now() < least) {
  }
  const uint64_t t = ticks();
  const double ns =
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - time0_).count();
  const double per_unit = t > ticks0_ ? ns / static_cast<double>(t - ticks0_) * (1 << kShift) : 0;
  std::memcpy(&v[kEntries], &per_unit, sizeof per_unit);
  return v;
}

Arrivals compare(const std::vector<std::vector<uint64_t>>& logs, uint32_t after,
                 uint32_t* through) {
  const size_t n = logs.size();
  Arrivals a;
  a.last.assign(n, 0);
  a.median_late_ms.assign(n, 0);
  // The last collective every rank has ended (each ends them in order).
  uint32_t upto = UINT32_MAX;
  for (const auto& l : logs) {
    uint32_t top = 0;
    for (size_t i = 0; i < std::min(l.size(), Log::kEntries); ++i)
      top = std::max(top, seq_of(l[i]));
    upto = std::min(upto, top);
  }
  if (n == 0 || upto <= after) {
    if (through) *through = after;
    return a;
  }
  // Each rank's runs in nanoseconds (its own unit).
  std::vector<double> unit(n, 0);
  for (size_t r = 0; r < n; ++r)
    if (logs[r].size() == Log::kEntries + 1) std::memcpy(&unit[r], &logs[r][Log::kEntries], 8);
  std::vector<std::vector<double>> late(n);  // per rank, when it was last (ns)
  for (uint64_t seq = upto - std::min<uint32_t>(upto - after, Log::kEntries) + 1; seq <= upto;
       ++seq) {
    double lo = 0, hi = 0;
    size_t who = 0;
    bool everyone = true;
    for (size_t r = 0; r < n && everyone; ++r) {
      const uint64_t e = unit[r] > 0 ? logs[r][seq % Log::kEntries] : 0;
      if (seq_of(e) != static_cast<uint32_t>(seq)) {
        everyone = false;  // a step number, or not a host collective
        break;
      }
      const double ran = ran_of(e) * unit[r];
      if (r == 0 || ran < lo) lo = ran, who = r;  // ties: the lowest rank
      if (r == 0 || ran > hi) hi = ran;
    }
    if (!everyone) continue;
    ++a.collectives;
    ++a.last[who];
    late[who].push_back(hi - lo);
  }
  for (size_t r = 0; r < n; ++r)
    if (!late[r].empty()) {
      auto mid = late[r].begin() + static_cast<std::ptrdiff_t>(late[r].size() / 2);
      std::nth_element(late[r].begin(), mid, late[r].end());
      a.median_late_ms[r] = *mid / 1e6;
    }
  if (through) *through = upto;
  return a;
}

}  // namespace arrivals
}  // namespace collie
