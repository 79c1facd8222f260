// comm/front/front.h: the one Communicator every backend sits behind.
//
// The front does, once for all backends, what c10d's and Gloo's fronts do:
// checks arguments (counts, dtypes, ops, roots, peers, devices, in-place
// rules) before a backend sees the call; numbers operations (collectives in
// issue order, point-to-point per pair of ranks) under one lock, so that the
// backend receives them in issue order; refuses every call after the first
// failure with that failure (Gloo's pattern); does split's bookkeeping; and
// makes destruction safe for the hooks that still hold a share().
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "collie/comm.h"
#include "comm/backend.h"

namespace collie {

// The owning communicator over `backend`, created from `ctx`.
std::unique_ptr<Communicator> make_front(const BackendContext& ctx,
                                         std::unique_ptr<Backend> backend);

// shrink's check that the survivors completed the same collectives: for
// each survivor (its rank, the last collective it completed), "" when they
// all agree, else which ranks completed up to which collective ("rank 2
// completed up to #12; ranks 0, 1 up to #11").
std::string survivors_disagree(const std::vector<std::pair<int, uint32_t>>& completed);

}  // namespace collie
