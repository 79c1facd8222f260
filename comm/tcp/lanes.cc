// comm/tcp/lanes.cc: see lanes.h.
#include "comm/tcp/lanes.h"

#include <algorithm>

#include "collie/types.h"

namespace collie::tcp {

int lanes_per_peer(const config::TcpTuning& tuning) {
  return std::max(tuning.sockets_per_peer, 1) * (tuning.split_directions ? 2 : 1);
}

bool one_way(const config::TcpTuning& tuning, const OpDesc& d, size_t bytes, int world) {
  if (!tuning.split_directions || bytes < tuning.split_min_bytes) return false;
  if (d.op == OpKind::alltoall) return true;
  return d.op == OpKind::allgather &&
         d.count * dtype_size(d.dtype) * static_cast<uint64_t>(world) >= kOneWayAllgatherBytes;
}

LanePlan plan_lanes(const config::TcpTuning& tuning, const OpDesc& d, size_t bytes, int from,
                    int to, int world) {
  const int sockets = std::max(tuning.sockets_per_peer, 1);
  const size_t min = std::max<size_t>(tuning.lane_min_bytes, 1);
  LanePlan p;
  p.parts = sockets == 1 || bytes < 2 * min ? 1 : std::min<size_t>(sockets, bytes / min);
  if (from > to && one_way(tuning, d, bytes, world)) {
    p.first = sockets;
    p.elsewhere = true;
  }
  return p;
}

}  // namespace collie::tcp
