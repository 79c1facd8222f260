#include "comm/algorithms/choose.h"

#include <algorithm>
#include <cmath>

namespace collie::algo {

namespace {
int ceil_log2(int n) {
  int k = 0;
  while ((1 << k) < n) ++k;
  return k;
}
int floor_log2(int n) {
  int k = 0;
  while ((2 << k) <= n) ++k;
  return k;
}
}  // namespace

double allreduce_cost(AllreduceAlgo a, size_t bytes, int n, const config::TcpTuning& t) {
  if (n <= 1) return 0;
  double s = static_cast<double>(bytes);
  double us_per_byte = 1e-3 / t.bandwidth_gbps;  // 1 GB/s = 1e3 bytes/us
  double reduce_us_per_byte = 1e-3 / t.reduce_gbps;
  if (a == AllreduceAlgo::ring) {
    // Reduce-scatter then all-gather: 2(n-1) steps of s/n bytes; the
    // reduction of (n-1)/n of the buffer overlaps the transfers in a pipelined
    // ring, so it only adds when it is the slower of the two.
    double steps = 2.0 * (n - 1);
    double wire = steps * (s / n) * us_per_byte;
    double reduce = (n - 1) * (s / n) * reduce_us_per_byte;
    return steps * t.latency_us + std::max(wire, reduce);
  }
  // Recursive doubling over the largest power of two p <= n: log2(p)
  // exchanges of the whole buffer, each followed by a reduction; ranks past p
  // fold in before and get the result after (two more steps).
  int k = floor_log2(n);
  int extra_steps = (1 << k) == n ? 0 : 2;
  double steps = k + extra_steps;
  return steps * (t.latency_us + s * us_per_byte) +
         (k + (extra_steps ? 1 : 0)) * s * reduce_us_per_byte;
}

double broadcast_cost(BroadcastAlgo a, size_t bytes, int n, const config::TcpTuning& t) {
  if (n <= 1) return 0;
  double s = static_cast<double>(bytes);
  double us_per_byte = 1e-3 / t.bandwidth_gbps;
  if (a == BroadcastAlgo::binomial_tree) return ceil_log2(n) * (t.latency_us + s * us_per_byte);
  // A pipelined chain: the last rank gets the last chunk after the whole
  // message plus (n-2) chunk times.
  double chunk = std::min(s, static_cast<double>(t.chunk_bytes));
  double chunks = std::max(1.0, std::ceil(s / chunk));
  return (chunks + n - 2) * (t.latency_us + chunk * us_per_byte);
}

AllreduceAlgo choose_allreduce(size_t bytes, int n, const config::TcpTuning& t) {
  if (t.allreduce_algo == "ring") return AllreduceAlgo::ring;
  if (t.allreduce_algo == "rd") return AllreduceAlgo::recursive_doubling;
  // Fewer elements than ranks leaves ring segments empty: recursive doubling.
  if (bytes < static_cast<size_t>(n) * 8) return AllreduceAlgo::recursive_doubling;
  return allreduce_cost(AllreduceAlgo::ring, bytes, n, t) <
                 allreduce_cost(AllreduceAlgo::recursive_doubling, bytes, n, t)
             ? AllreduceAlgo::ring
             : AllreduceAlgo::recursive_doubling;
}

BroadcastAlgo choose_broadcast(size_t bytes, int n, const config::TcpTuning& t) {
  return broadcast_cost(BroadcastAlgo::chain, bytes, n, t) <
                 broadcast_cost(BroadcastAlgo::binomial_tree, bytes, n, t)
             ? BroadcastAlgo::chain
             : BroadcastAlgo::binomial_tree;
}

}  // namespace collie::algo
