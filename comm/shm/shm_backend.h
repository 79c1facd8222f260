// comm/shm/shm_backend.h: collie's shared-memory backend, for ranks on one
// host.
//
// The ranks map one segment (segment.h) and run every collective inside it:
// small all-reduces in one step (each rank puts its input in its slot and
// reduces every slot straight into its output), large ones as a
// reduce-scatter and all-gather in rounds small enough to stay in the shared
// L3 (each rank copies a round in, reduces its own slice of everyone's
// round in place, then copies every slice out). Point-to-point messages go
// through a ring of slots per ordered pair. Operations run on the host
// executor, like tcp's.
#pragma once

#include "comm/host_executor.h"

namespace collie::shm {

// The registry's line for this backend.
BackendEntry backend_entry();

// The runner behind the backend, for backends built of others (comm/hier/):
// collective over the ranks of `ctx`.
std::unique_ptr<HostRunner> make_runner(const BackendContext& ctx);

}  // namespace collie::shm
