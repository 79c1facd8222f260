// comm/front/context.h: the context of a new communicator made from
// another's (split, shrink, grow): its key, its numbering, and the state
// that must be its own (failure latch, rank names, stall inspector,
// arrivals log); and the end of any communicator's setup (done_with_store).
#pragma once

#include <string>
#include <vector>

#include "comm/backend.h"

namespace collie {

// `ctx` for rank `rank` of `size` under `key`. `local`: every rank is on
// this host, so the local numbering is the new one.
BackendContext renumbered(const BackendContext& ctx, const std::string& key, int rank, int size,
                          bool local);

// The rank that serves the store takes it along when its process ends. A
// backend's last step may be a wait in the store alone (shm's, for every
// rank's mapping): the serving rank sees the others' words, returns, and
// may end while a peer is still in that wait, which then loses the store
// and fails a setup that had succeeded everywhere else (CI: a shrink in
// shm_faults_one_cpu). So each rank ends its part of a communicator's
// setup by saying so in the store, made or failed ("!<code> <message>"),
// and the rank that serves it (BackendContext::serves_store; one rank of
// the job: two that waited would race each other in the same way) returns
// only once every other rank has, throwing the first failure it reads.
// Every rank does so whatever the store, though one that outlives the
// ranks (collie-run's, a file) would need none of it: the ranks may not
// agree on what their store is (one passed in on some, collie-run's on a
// joiner).
// `failed`: this rank's own setup failed with it (then only said).
void done_with_store(const BackendContext& ctx, const Error* failed);

// For the process that serves the store, after a split: waits until every
// key of `keys` (the set-up words of the colors it is not in, as
// done_with_store writes them) is set, up to the timeout, so that it may
// end right after its split. A color whose setup never ends is that
// color's error, not this rank's: a warning, and it returns.
void outlast_setups(const BackendContext& ctx, const std::vector<std::string>& keys);

}  // namespace collie
