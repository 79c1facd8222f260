// comm/front/context.h: the context of a new communicator made from
// another's (split, shrink, grow): its key, its numbering, and the state
// that must be its own (failure latch, rank names, stall inspector,
// arrivals log).
#pragma once

#include <string>

#include "comm/backend.h"

namespace collie {

// `ctx` for rank `rank` of `size` under `key`. `local`: every rank is on
// this host, so the local numbering is the new one.
BackendContext renumbered(const BackendContext& ctx, const std::string& key, int rank, int size,
                          bool local);

}  // namespace collie
