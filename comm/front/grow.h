// comm/front/grow.h: Communicator::grow and collie::join's meeting through
// the job's store (grow.cc says how): the members of a communicator take
// the first joiners that wait in the store's queue, and every one of them
// gets the new communicator's context, a generation of its own.
#pragma once

#include <chrono>
#include <string>

#include "base/validate.h"
#include "comm/backend.h"

namespace collie {

// The context of this member's communicator after grow number `no` of the
// one `ctx` made: this communicator's ranks keep their numbers, and the
// `joiners` processes that join next (collie::join) become ranks size()
// .. size() + joiners - 1, in the order they queued. Rank 0 of `ctx` takes
// the joiners and says the outcome; the others wait for its word. Waits
// up to `wait` (0: the timeout) for the joiners to come; a timeout names
// how many came.
BackendContext grown_context(const BackendContext& ctx, int joiners, int no,
                             std::chrono::milliseconds wait, const validate::Where& what);

// The context of a process that joins a running job (collie::join): `ctx`
// is what connect() made of its launch variables and store; it queues in
// the store and waits up to `wait` for a communicator of the job to grow
// by it, then returns that communicator's context for this rank, its
// backend named in `backend`.
BackendContext joiner_context(const BackendContext& ctx, std::chrono::milliseconds wait,
                              std::string& backend);

}  // namespace collie
