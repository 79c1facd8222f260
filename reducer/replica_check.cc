#include "reducer/replica_check.h"

#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>

#include "base/cuda_api.h"
#include "base/element.h"

namespace collie {

namespace {

// The tensor's bytes in host memory: itself, or a copy of a CUDA tensor.
const void* on_host(const TensorView& t, std::vector<uint8_t>& staging) {
  if (t.device.is_cpu()) return t.data;
  staging.resize(t.nbytes());
  auto api = cuda::device_api();
  if (!api)
    throw Error(
        ErrorCode::unavailable,
        "the replica check needs the CUDA runtime to read a parameter on " + to_string(t.device));
  api->copy_async(staging.data(), t.data, t.nbytes(), cuda_stream());
  api->synchronize(cuda_stream());
  return staging.data();
}

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

// How one rank's copy of a parameter differs from the reference's.
struct Difference {
  int64_t first = -1;  // the first element that differs (-1: none)
  double mine = 0;     // this rank's value there
  double theirs = 0;   // the reference's value there
  double largest = 0;  // the largest |difference| (inf when one side is not finite)
  int64_t at = -1;     // where
};

Difference compare(DType t, const void* mine, const void* ref, size_t n) {
  Difference d;
  const size_t es = dtype_size(t);
  const auto* a = static_cast<const uint8_t*>(mine);
  const auto* b = static_cast<const uint8_t*>(ref);
  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(a + i * es, b + i * es, es) == 0) continue;
    const double x = get_element(t, mine, i), y = get_element(t, ref, i);
    double diff = std::abs(x - y);
    if (std::isnan(diff)) diff = INFINITY;  // NaN against a number, or +Inf against +Inf's bits
    if (d.first < 0) d = {static_cast<int64_t>(i), x, y, diff, static_cast<int64_t>(i)};
    if (diff > d.largest) {
      d.largest = diff;
      d.at = static_cast<int64_t>(i);
    }
  }
  return d;
}

}  // namespace

uint64_t tensor_fingerprint(const TensorView& t) {
  std::vector<uint8_t> staging;
  return XXH3_64bits(on_host(t, staging), t.nbytes());
}

std::string check_replicas(Communicator& comm, const std::vector<TensorView>& params,
                           const std::function<std::string(size_t)>& name, uint64_t iteration,
                           bool compared) {
  const int n = comm.size();
  const size_t np = params.size();
  std::vector<int64_t> hashes(np);
  for (size_t i = 0; i < np; ++i) hashes[i] = static_cast<int64_t>(tensor_fingerprint(params[i]));
  const int64_t combined = static_cast<int64_t>(XXH3_64bits(hashes.data(), np * sizeof(int64_t)));

  int64_t mine[2] = {compared ? 1 : 0, combined};
  std::vector<int64_t> all(2 * static_cast<size_t>(n));
  comm.allgather(view_of(mine, 2), view_of(all.data(), all.size())).wait();
  // The ranks compared, grouped by their bits; the largest group (the one
  // with the lowest rank, on a tie) is the reference.
  std::map<int64_t, std::vector<int>> groups;
  for (int r = 0; r < n; ++r)
    if (all[2 * r]) groups[all[2 * r + 1]].push_back(r);
  if (groups.size() <= 1) return "";
  const std::vector<int>* majority = nullptr;
  for (const auto& [h, ranks] : groups)
    if (!majority || ranks.size() > majority->size() ||
        (ranks.size() == majority->size() && ranks[0] < (*majority)[0]))
      majority = &ranks;
  const int ref = (*majority)[0];
  std::vector<int> agree = *majority, differ;
  for (const auto& [h, ranks] : groups)
    if (&ranks != majority) differ.insert(differ.end(), ranks.begin(), ranks.end());
  std::sort(differ.begin(), differ.end());

  // Which parameter differs first, from every rank's per-parameter bits.
  std::vector<int64_t> every(np * static_cast<size_t>(n));
  comm.allgather(view_of(hashes.data(), np), view_of(every.data(), every.size())).wait();
  size_t p = np;
  for (size_t i = 0; i < np && p == np; ++i)
    for (int r : differ)
      if (every[r * np + i] != every[ref * np + i]) {
        p = i;
        break;
      }
  if (p == np) p = 0;  // the combined fingerprints collided: no single parameter to name

  // Where and by how much each rank's copy of it differs from the reference's.
  const TensorView& t = params[p];
  std::vector<uint8_t> staging;
  const void* here = on_host(t, staging);
  std::vector<uint8_t> theirs(t.nbytes());
  if (!theirs.empty()) std::memcpy(theirs.data(), here, theirs.size());
  comm.broadcast(TensorView{theirs.data(), t.dtype, t.numel, Device::cpu()}, ref).wait();
  Difference d = compare(t.dtype, here, theirs.data(), t.numel);
  int64_t row[5] = {d.first, 0, 0, 0, d.at};
  std::memcpy(&row[1], &d.mine, 8);
  std::memcpy(&row[2], &d.theirs, 8);
  std::memcpy(&row[3], &d.largest, 8);
  std::vector<int64_t> rows(5 * static_cast<size_t>(n));
  comm.allgather(view_of(row, 5), view_of(rows.data(), rows.size())).wait();

  std::string msg = "replicas disagree at iteration " + std::to_string(iteration) + ": " +
                    rank_list(differ) + (differ.size() == 1 ? " holds" : " hold") +
                    " parameters that differ from those of " + rank_list(agree) +
                    "; the first parameter that differs is " + name(p) + " (" +
                    std::to_string(t.numel) + " " + std::string(to_string(t.dtype)) + ")";
  for (int r : differ) {
    const int64_t* q = &rows[5 * static_cast<size_t>(r)];
    double v, w, largest;
    std::memcpy(&v, &q[1], 8);
    std::memcpy(&w, &q[2], 8);
    std::memcpy(&largest, &q[3], 8);
    msg += "; rank " + std::to_string(r) + ": ";
    if (q[0] < 0) {
      msg += "the same bits in it";
      continue;
    }
    msg += "element " + std::to_string(q[0]) + " is " + number(v) + " where rank " +
           std::to_string(ref) + "'s is " + number(w) + ", largest difference " + number(largest) +
           " (element " + std::to_string(q[4]) + ")";
  }
  return msg;
}

}  // namespace collie
