// comm/front/context.cc: see context.h.
#include "comm/front/context.h"

#include <memory>

#include "base/arrivals.h"
#include "comm/stall_inspector.h"

namespace collie {

BackendContext renumbered(const BackendContext& ctx, const std::string& key, int rank, int size,
                          bool local) {
  BackendContext c = ctx;
  c.key = key;
  c.launch.rank = rank;
  c.launch.world_size = size;
  if (local) {
    c.launch.local_rank = rank;
    c.launch.local_world_size = size;
  }
  c.failure = std::make_shared<FailureLatch>();
  c.names = RankNames();  // a new communicator: its own numbers
  c.inspector = StallInspector::start(c.store, c.key, rank, size, c.launch.timeout);
  c.arrivals = arrivals::log_for(size, c.launch.arrivals);
  return c;
}

}  // namespace collie
