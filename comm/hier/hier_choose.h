// comm/hier/hier_choose.h: the hier backend's choices: which all-reduces
// go the hierarchical way (reduce-scatter inside each host, all-reduce
// across, all-gather inside), pipelined or in one piece, and which take two
// stages (all-reduce inside, all-reduce across). Every rank must choose
// alike: `crowded` is the job's (any host's) answer, agreed on through the
// store (hier_backend.cc).
#pragma once

#include <cstddef>

#include "base/config.h"
#include "comm/backend.h"

namespace collie::hier {

// Up to this size, on crowded hosts (more busy threads than CPUs: each rank
// and its stage across hosts), an all-reduce runs in two stages in the
// caller's thread, on runners of their own that run alone and never spin:
// an all-reduce inside each host over shm, then one across hosts among the
// ranks of the same local index over tcp (each host's sum, whole). 2 hosts
// x 2 ranks sharing 2 cores over a 10 Gbit/s link: 10-53 us from 8 B to
// 32 KiB, 1.0-2.0 x Open MPI's best; the three stages of the pipeline
// (their waiters asleep, each hand-off a wake-up) took 106-170 us, the flat
// mesh of all ranks 22-58 (bench/RESULTS.md, "Two hosts on a shaped link").
constexpr size_t kTwoStageCrowdedBytes = 32 * 1024;

// On crowded hosts, larger all-reduces go the hierarchical way in one piece
// (unless COLLIE_HIER_PIECE is set): its three stages in the caller's
// thread, on the runners that run alone, as the two stages above. With the
// pipeline's thread beside them the stages took turns for the same CPUs:
// 2 hosts x 2 ranks on 2 cores, 10 Gbit/s, one piece ran 1.15-1.2 x faster
// from 2 to 8 MiB and 1.1-2.4 x from 64 KiB to 1 MiB (where the message was
// one piece before too, on the pipeline's runners, whose waiters sleep),
// and at par from 16 to 256 MiB (bench/RESULTS.md, "Two hosts on a shaped
// link").
constexpr size_t kCrowdedPieceBytes = size_t{1} << 62;

// Whether an all-reduce of `bytes` runs the two stages rather than the
// hierarchical way.
inline bool two_stage_allreduce(size_t bytes, bool crowded) {
  return crowded && bytes <= kTwoStageCrowdedBytes;
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
