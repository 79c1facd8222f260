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
  const int lanes = tcp::Mesh::lanes_per_peer(tuning);
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

}  // namespace
}  // namespace collie
