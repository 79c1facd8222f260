// tests/test_tcp_mesh.cc: collie's TCP transport (comm/tcp/tcp_mesh.h) on
// its own: two meshes in one process, joined by socket pairs, one thread
// each. What only the mesh decides: which connection a message takes, and
// what a receiver meets when the sender chose another.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <thread>
#include <vector>

#include "comm/tcp/tcp_mesh.h"

namespace collie {
namespace {

using namespace std::chrono_literals;

struct Pair {
  std::unique_ptr<tcp::Mesh> mesh[2];
};

// Two ranks with `tuning`'s connections between them.
Pair connected(const config::TcpTuning& tuning) {
  const int lanes = tcp::lanes_per_peer(tuning);
  std::vector<net::Fd> conns[2];
  for (auto& c : conns) c.resize(static_cast<size_t>(2 * lanes));
  for (int l = 0; l < lanes; ++l) {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) throw std::runtime_error("socketpair");
    conns[0][static_cast<size_t>(lanes + l)] = net::Fd(sv[0]);  // rank 0's lane l to rank 1
    conns[1][static_cast<size_t>(l)] = net::Fd(sv[1]);          // rank 1's lane l to rank 0
  }
  Pair p;
  for (int r = 0; r < 2; ++r)
    p.mesh[r] = std::make_unique<tcp::Mesh>(r, 2, std::move(conns[r]), tuning, false,
                                            std::make_shared<FailureLatch>());
  return p;
}

OpDesc alltoall_desc(uint64_t count) {
  OpDesc d;
  d.op = OpKind::alltoall;
  d.dtype = DType::u8;
  d.seq = 7;
  d.count = count;
  return d;
}

// Runs both meshes to the end; the error each ended with, if any.
std::vector<std::optional<Error>> run_both(Pair& p, std::chrono::milliseconds limit) {
  std::vector<std::optional<Error>> err(2);
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      try {
        p.mesh[r]->run(Deadline::clock::now() + limit);
      } catch (const Error& e) {
        err[static_cast<size_t>(r)] = e;
        p.mesh[r]->abort(e);  // as the backend does: the peer hears of it
      }
    });
  for (auto& t : ts) t.join();
  return err;
}

// A large message goes on its direction's connection and arrives whole,
// both ways at once, beside a small one on the shared connection.
TEST(TcpMesh, LargeMessagesBothWaysArriveWholeOnTheirOwnConnections) {
  config::TcpTuning tuning;
  ASSERT_TRUE(tuning.split_directions);
  Pair p = connected(tuning);
  const size_t big = 3 * tuning.split_min_bytes + 5, small = 100;
  std::vector<uint8_t> out[2], in[2], small_out[2], small_in[2];
  for (int r = 0; r < 2; ++r) {
    out[r].resize(big);
    for (size_t i = 0; i < big; ++i) out[r][i] = static_cast<uint8_t>(i * 7 + r * 13);
    in[r].assign(big, 0);
    small_out[r].assign(small, static_cast<uint8_t>(40 + r));
    small_in[r].assign(small, 0);
    const int q = 1 - r;
    p.mesh[r]->post_recv(alltoall_desc(2 * big), q, in[r].data(), big);
    p.mesh[r]->post_send(alltoall_desc(2 * big), q, out[r].data(), big);
    p.mesh[r]->post_recv(alltoall_desc(2 * small), q, small_in[r].data(), small);
    p.mesh[r]->post_send(alltoall_desc(2 * small), q, small_out[r].data(), small);
  }
  auto err = run_both(p, 20s);
  for (int r = 0; r < 2; ++r) {
    ASSERT_FALSE(err[static_cast<size_t>(r)]) << err[static_cast<size_t>(r)]->what();
    EXPECT_EQ(in[r], out[1 - r]) << "rank " << r;
    EXPECT_EQ(small_in[r], small_out[1 - r]) << "rank " << r;
  }
}

// Rank 1 sends rank 0 a large message (on the connection for its direction)
// where rank 0 expects a small one (on the shared connection), and nothing
// else moves: rank 0 itself must meet the announcement and name rank 1's
// size, long before the deadline.
TEST(TcpMesh, AReceiveOfAnotherSizeMeetsTheAnnouncementOnItsOwnConnection) {
  config::TcpTuning tuning;
  for (auto [sent, expected] :
       {std::pair<size_t, size_t>{1 << 20, 4096}, {1 << 20, (1 << 20) + 8}}) {
    Pair p = connected(tuning);
    std::vector<uint8_t> out(sent, 1), in(expected);
    p.mesh[1]->post_send(alltoall_desc(sent), 0, out.data(), sent);
    p.mesh[0]->post_recv(alltoall_desc(sent), 1, in.data(), expected);
    const auto start = std::chrono::steady_clock::now();
    auto err = run_both(p, 30s);
    ASSERT_TRUE(err[0]) << "rank 0 completed a receive of " << expected << " bytes";
    EXPECT_EQ(err[0]->code(), ErrorCode::mismatch) << err[0]->what();
    EXPECT_NE(std::string(err[0]->what()).find("rank 1 sent a step of " + std::to_string(sent)),
              std::string::npos)
        << err[0]->what();
    EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  }
}

OpDesc op_of(OpKind k, DType t, uint64_t count) {
  OpDesc d;
  d.op = k;
  d.dtype = t;
  d.count = count;
  return d;
}

// The lane rules (comm/tcp/lanes.h), against what they were measured to be.
TEST(TcpLanes, LargeAlltoallMessagesOfTheHigherRankTakeTheSecondHalf) {
  config::TcpTuning t;  // defaults: 1 socket, split on, one way from 512 KiB
  EXPECT_EQ(tcp::lanes_per_peer(t), 2);
  const OpDesc a2a = op_of(OpKind::alltoall, DType::f32, 1 << 20);
  const size_t big = t.split_min_bytes, small = t.split_min_bytes - 1;
  EXPECT_TRUE(tcp::one_way(t, a2a, big, 2));
  EXPECT_FALSE(tcp::one_way(t, a2a, small, 2));
  // Upward (lower rank to higher): lane 0, announced never.
  tcp::LanePlan up = tcp::plan_lanes(t, a2a, big, 0, 1, 2);
  EXPECT_EQ(up.first, 0);
  EXPECT_EQ(up.parts, 1u);
  EXPECT_FALSE(up.elsewhere);
  // Downward: lane 1 (the second half), announced on lane 0.
  tcp::LanePlan down = tcp::plan_lanes(t, a2a, big, 3, 1, 4);
  EXPECT_EQ(down.first, 1);
  EXPECT_TRUE(down.elsewhere);
  // Below the cut, both ways on lane 0.
  tcp::LanePlan small_down = tcp::plan_lanes(t, a2a, small, 1, 0, 2);
  EXPECT_EQ(small_down.first, 0);
  EXPECT_FALSE(small_down.elsewhere);
}

TEST(TcpLanes, TheAllReduceNeverAndTheAllGatherFromAFourMiBResultGoOneWay) {
  config::TcpTuning t;
  const size_t chunk = t.split_min_bytes;
  EXPECT_FALSE(tcp::one_way(t, op_of(OpKind::allreduce, DType::f32, 64 << 20), chunk, 2));
  EXPECT_FALSE(tcp::one_way(t, op_of(OpKind::broadcast, DType::f32, 64 << 20), chunk, 2));
  // An all-gather's count is each rank's part: 2 ranks of 512 Ki floats
  // make a 4 MiB result; 2 ranks of 256 Ki floats, 2 MiB.
  EXPECT_TRUE(tcp::one_way(t, op_of(OpKind::allgather, DType::f32, 512 << 10), chunk, 2));
  EXPECT_FALSE(tcp::one_way(t, op_of(OpKind::allgather, DType::f32, 256 << 10), chunk, 2));
  EXPECT_TRUE(tcp::one_way(t, op_of(OpKind::allgather, DType::f32, 256 << 10), chunk, 4));
  EXPECT_TRUE(tcp::one_way(t, op_of(OpKind::allgather, DType::f64, 256 << 10), chunk, 2));
}

TEST(TcpLanes, SplitOffKeepsOneSetOfConnectionsBothWays) {
  config::TcpTuning t;
  t.split_directions = false;
  EXPECT_EQ(tcp::lanes_per_peer(t), 1);
  const OpDesc a2a = op_of(OpKind::alltoall, DType::f32, 64 << 20);
  EXPECT_FALSE(tcp::one_way(t, a2a, 16 << 20, 2));
  EXPECT_EQ(tcp::plan_lanes(t, a2a, 16 << 20, 1, 0, 2).first, 0);
}

TEST(TcpLanes, SeveralSocketsCutALargeMessageWithinItsDirectionsHalf) {
  config::TcpTuning t;
  t.sockets_per_peer = 3;
  t.lane_min_bytes = 4096;
  EXPECT_EQ(tcp::lanes_per_peer(t), 6);
  const OpDesc a2a = op_of(OpKind::alltoall, DType::f32, 64 << 20);
  // Under twice the part minimum: whole, on the first lane of its half.
  EXPECT_EQ(tcp::plan_lanes(t, op_of(OpKind::allreduce, DType::f32, 1000), 8191, 1, 0, 2).parts,
            1u);
  // Two parts' worth: cut in two; three or more: in three (the sockets).
  EXPECT_EQ(tcp::plan_lanes(t, op_of(OpKind::allreduce, DType::f32, 1 << 20), 8192, 1, 0, 2).parts,
            2u);
  tcp::LanePlan down = tcp::plan_lanes(t, a2a, 1 << 20, 1, 0, 2);
  EXPECT_EQ(down.parts, 3u);
  EXPECT_EQ(down.first, 3);  // lanes 3, 4, 5: the higher rank's half
  tcp::LanePlan up = tcp::plan_lanes(t, a2a, 1 << 20, 0, 1, 2);
  EXPECT_EQ(up.parts, 3u);
  EXPECT_EQ(up.first, 0);
}

}  // namespace
}  // namespace collie
