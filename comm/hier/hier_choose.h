// comm/hier/hier_choose.h: the hier backend's one choice: which all-reduces
// go the hierarchical way (reduce-scatter inside each host, all-reduce
// across, all-gather inside) and which the flat tcp mesh of all ranks
// takes. Every rank must choose alike: `crowded` is the job's (any host's)
// answer, agreed on through the store (hier_backend.cc).
#pragma once

#include <cstddef>

#include "base/config.h"
#include "comm/backend.h"

namespace collie::hier {

// Up to this size, on crowded hosts (more busy threads than CPUs: each rank
// and its stage across hosts), an all-reduce takes the flat mesh: its
// waiters hand the CPU over, where the three stages' waiters sleep, each
// hand-off a wake-up. 2 hosts x 2 ranks sharing 2 cores, 10 Gbit/s link:
// hier 106-149 us up to 32 KiB against 37-68 flat (2.0-2.8 x); 128 KiB at
// par; from 512 KiB hier ahead (bench/RESULTS.md, "Two hosts on a shaped
// link").
constexpr size_t kFlatCrowdedBytes = 32 * 1024;

// Whether an all-reduce of `bytes` runs on the flat mesh rather than the
// hierarchy.
inline bool flat_allreduce(size_t bytes, bool crowded) {
  return crowded && bytes <= kFlatCrowdedBytes;
}

// While the pipeline runs, each rank of a host has a thread beside the
// stage it runs: the stage across hosts beside the one inside (hier_backend.cc's
// Beside). A staged runner counts it where it chooses to spin
// (BackendContext::beside_per_rank).
constexpr int kBesideEachStage = 1;

// Whether a host of `local_world_size` ranks on `usable_cpus` CPUs is
// crowded while hier runs (each rank and the thread beside its stage), or
// the launcher says it is.
inline bool host_crowded(int local_world_size, int usable_cpus, const config::Env& env) {
  return !config::ranks_fit_cores(BackendContext::busy_threads(local_world_size, kBesideEachStage),
                                  usable_cpus, env);
}

}  // namespace collie::hier
