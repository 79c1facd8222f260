// base/fingerprint.h: 64-bit FNV-1a fingerprints, and the check that
// every rank holds the same one. The reducer, the hooks and the averagers
// use it to turn "ranks were configured differently" into an error that
// names the rank, instead of collectives that silently stop matching.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "collie/comm.h"

namespace collie {

constexpr uint64_t kFnvBasis = 1469598103934665603ull;
constexpr uint64_t kFnvPrime = 1099511628211ull;

// Folds one 64-bit word into h.
inline uint64_t fnv_mix(uint64_t h, uint64_t v) {
  return (h ^ v) * kFnvPrime;
}

// Folds n bytes into h, one at a time.
inline uint64_t fnv1a(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * kFnvPrime;
  return h;
}

// Collective: gathers every rank's fingerprint and returns the lowest rank
// whose fingerprint differs from rank 0's, or -1 when they all agree.
inline int first_rank_differing(Communicator& comm, uint64_t fingerprint) {
  int64_t mine = static_cast<int64_t>(fingerprint);
  std::vector<int64_t> all(static_cast<size_t>(comm.size()));
  comm.allgather(view_of(&mine, 1), view_of(all.data(), all.size())).wait();
  for (size_t q = 1; q < all.size(); ++q)
    if (all[q] != all[0]) return static_cast<int>(q);
  return -1;
}

}  // namespace collie
