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

}  // namespace collie
