// comm/front/shrink.h: Communicator::shrink's agreement among the
// survivors, through the job's store (shrink.cc says how).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "base/validate.h"
#include "comm/backend.h"

namespace collie {

// The context of this rank's communicator after shrink number `no` of the
// one `ctx` made: its members are the ranks that said they are alive in
// time (not those in `out`, nor those this rank saw die), as the first
// proposal in the store has them. Throws peer_lost, naming the members,
// when the survivors agreed on a set without this rank.
BackendContext survivors_context(const BackendContext& ctx, std::vector<bool> out, int no,
                                 std::chrono::milliseconds wait, std::chrono::milliseconds timeout,
                                 const validate::Where& what);

// shrink's check that the survivors completed the same collectives: for
// each survivor (its rank, the last collective it completed), "" when they
// all agree, else which ranks completed up to which collective ("rank 2
// completed up to #12; ranks 0, 1 up to #11").
std::string survivors_disagree(const std::vector<std::pair<int, uint32_t>>& completed);

}  // namespace collie
