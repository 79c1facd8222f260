// comm/tcp/lanes.h: which of a peer's TCP connections (lanes) a message
// takes, decided from the message's op and size alone so that both ends
// agree without asking: the cut of a large message across
// COLLIE_TCP_SOCKETS connections, and whether it goes on a connection of
// its own direction (COLLIE_TCP_SPLIT_DIRECTIONS). The mesh
// (comm/tcp/tcp_mesh.h) moves the bytes; this is the choice, apart from
// the sockets, so that its rules are unit-tested (tests/test_tcp_mesh.cc).
//
// A peer's lanes: [0, S) carry the lower rank's messages to the higher
// (and every small message, both ways), [S, 2 S) the higher rank's large
// one-way messages, where S is COLLIE_TCP_SOCKETS and the second half
// exists when the split is on.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/config.h"
#include "base/op.h"

namespace collie::tcp {

// A pass of the progress loop writes whole frames of a one-way op to a lane
// until this much has gone (or the socket is full), then reads. Writing
// until the socket was full measured as slow over one-way connections as
// over shared ones (2 ranks, 2 to 32 MiB: 1.1-1.6 x the time), where a rank
// filled its send queue while the peer's data waited to be read; for other
// ops the early return cost the ring 5 % at 2 MiB, so they write on.
constexpr size_t kSendPassBytes = 256 * 1024;
// An all-gather goes one way from this size of its result.
constexpr uint64_t kOneWayAllgatherBytes = 4 << 20;

// The connections a rank opens to each peer.
int lanes_per_peer(const config::TcpTuning& tuning);

// Whether a message of `bytes` of op `d` in a communicator of `world` ranks
// goes on a connection of its own direction. The all-to-all from 2 MiB and
// the ring all-gather from 8 MiB measured 1.2-1.8 x faster so at 2 ranks;
// the ring all-reduce 5-16 % slower, the all-gather of 2 MiB 8 %, the
// all-to-all of 512 KiB (256 KiB blocks) 4 % (bench/RESULTS.md).
bool one_way(const config::TcpTuning& tuning, const OpDesc& d, size_t bytes, int world);

struct LanePlan {
  int first = 0;           // the lane of the first part
  size_t parts = 1;        // on lanes first, first + 1, ...: equal cuts but the last
  bool elsewhere = false;  // a one-way message of the higher rank: lane 0 may
                           // carry its announcement (the mesh sends one per op)
};

// The lanes of a message of `bytes` of op `d` from rank `from` to rank `to`.
LanePlan plan_lanes(const config::TcpTuning& tuning, const OpDesc& d, size_t bytes, int from,
                    int to, int world);

}  // namespace collie::tcp
