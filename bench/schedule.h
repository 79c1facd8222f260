// bench/schedule.h: how collie-bench and the peers under bench/peers/ time
// one size, so that every figure side by side comes from one statistic (the
// one the anchors measured on this machine use, from which the project
// started):
//
//   `samples` samples; one sample = a barrier, then `batch` back-to-back
//   operations timed as one block, time / batch. A sample's time is the
//   largest over the ranks (the operation is done when the slowest rank
//   is). Reported: the median sample, and the best.
//
// batch is 10 up to 64 KiB, so that small-message latency is measured back
// to back (as nccl-tests and OSU do) and not as barrier exit skew, and 1
// above. A mean over one block of back-to-back operations, which collie-bench
// used before, let a single scheduler stall of a few milliseconds (this VM
// has them) turn a 1 us all-reduce into 20 us in one run of five.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <string>
#include <vector>

namespace bench {

// The peers' command line, a subset of collie-bench's: -b, -e, -f, -n.
struct Sweep {
  size_t min_bytes = 8, max_bytes = size_t{256} << 20, factor = 4;
  int samples = 20;

  static size_t parse_size(const char* s) {
    char* end = nullptr;
    double v = std::strtod(s, &end);
    size_t mult = 1;
    if (end && (*end == 'K' || *end == 'k')) mult = 1024;
    if (end && (*end == 'M' || *end == 'm')) mult = 1024 * 1024;
    if (end && (*end == 'G' || *end == 'g')) mult = size_t{1} << 30;
    return static_cast<size_t>(v * mult);
  }
  static Sweep parse(int argc, char** argv) {
    Sweep s;
    for (int i = 1; i + 1 < argc; i += 2) {
      const std::string f = argv[i];
      if (f == "-b") s.min_bytes = parse_size(argv[i + 1]);
      if (f == "-e") s.max_bytes = parse_size(argv[i + 1]);
      if (f == "-f") s.factor = std::strtoul(argv[i + 1], nullptr, 10);
      if (f == "-n") s.samples = std::atoi(argv[i + 1]);
    }
    return s;
  }
  // The x-factor ladder from min_bytes, plus max_bytes when it misses it.
  std::vector<size_t> sizes() const {
    std::vector<size_t> v;
    for (size_t b = min_bytes; b <= max_bytes; b *= factor) {
      v.push_back(b);
      if (b > max_bytes / factor) break;
    }
    if (v.empty() || v.back() != max_bytes) v.push_back(max_bytes);
    return v;
  }
};

inline int batch_for(size_t bytes) {
  return bytes <= (size_t{64} << 10) ? 10 : 1;
}

struct Timing {
  double median_us = 0, best_us = 0;
  double wall_us = 0;  // this rank's time over all samples, barriers included
};

// barrier(), op() and max_over_ranks(std::vector<double>&) (element-wise,
// in place) are the library's own.
template <class Barrier, class Op, class MaxOverRanks>
Timing time_size(int samples, int batch, Barrier barrier, Op op, MaxOverRanks max_over_ranks) {
  using Clock = std::chrono::steady_clock;
  std::vector<double> t(static_cast<size_t>(samples));
  const auto start = Clock::now();
  for (double& x : t) {
    barrier();
    const auto t0 = Clock::now();
    for (int b = 0; b < batch; ++b) op();
    x = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / batch;
  }
  Timing r;
  r.wall_us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
  max_over_ranks(t);
  std::sort(t.begin(), t.end());
  const size_t m = t.size() / 2;
  r.median_us = t.size() % 2 ? t[m] : (t[m - 1] + t[m]) / 2;
  r.best_us = t.front();
  return r;
}

}  // namespace bench
