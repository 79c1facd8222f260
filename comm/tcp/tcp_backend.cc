// comm/tcp/tcp_backend.cc: the TCP backend: rendezvous into a mesh of
// sockets, then collie's algorithms over it, on the host executor.
#include "comm/tcp/tcp_backend.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "comm/algorithms/algorithms.h"
#include "comm/core/log.h"
#include "comm/core/topology.h"
#include "comm/host_executor.h"
#include "comm/net/socket.h"
#include "comm/tcp/tcp_mesh.h"

namespace collie::tcp {

namespace {

using std::chrono::milliseconds;

// The first bytes on every mesh connection: who is calling, for which
// communicator, which of its connections to this rank it is (`lane` of
// `lanes`), with which secret. Fixed size so that a stray client's garbage
// is read in one bounded piece and refused.
struct Hello {
  uint32_t magic;
  uint32_t version;
  int32_t from;
  int32_t to;
  int16_t lane;
  int16_t lanes;
  char key[108];
  char secret[128];
};
static_assert(sizeof(Hello) == 256);
constexpr uint32_t kHelloMagic = 0x434c4c48;  // "CLLH"
constexpr uint32_t kVersion = 2;
constexpr char kAck[4] = {'c', 'o', 'k', '1'};

Hello make_hello(int from, int to, int lane, int lanes, const std::string& key,
                 const std::string& secret) {
  Hello h{};
  h.magic = kHelloMagic;
  h.version = kVersion;
  h.from = from;
  h.to = to;
  h.lane = static_cast<int16_t>(lane);
  h.lanes = static_cast<int16_t>(lanes);
  std::strncpy(h.key, key.c_str(), sizeof h.key - 1);
  std::strncpy(h.secret, secret.c_str(), sizeof h.secret - 1);
  return h;
}

// Builds the full mesh, `lanes` connections to each peer (peer-major, as
// Mesh takes them): connect to lower ranks, accept higher ones.
std::vector<net::Fd> build_mesh(const BackendContext& s, int lanes) {
  const int rank = s.launch.rank, n = s.launch.world_size;
  const RankNames& names = s.names;
  auto deadline = net::deadline_after(s.launch.timeout);
  std::string who = names(rank);
  std::vector<net::Fd> peers(static_cast<size_t>(n * lanes));

  net::Fd listener = net::listen_tcp(s.listen_host, 0, who + ": mesh listener");
  std::string addr = net::Endpoint{s.listen_host.empty() ? "127.0.0.1" : s.listen_host,
                                   net::local_port(listener.get())}
                         .str();
  s.store->set(s.key + "/addr/" + std::to_string(rank), to_bytes(addr));

  // Wait until every rank has published its address.
  std::vector<std::string> keys;
  for (int q = 0; q < n; ++q) keys.push_back(s.key + "/addr/" + std::to_string(q));
  {
    auto others = keys;
    others[rank].clear();
    wait_for_ranks(*s.store, others, deadline, s.launch.timeout, who, s.names);
  }

  for (int c = 0; c < rank * lanes; ++c) {
    const int q = c / lanes;
    auto ep =
        net::parse_endpoint(collie::to_string(s.store->get(keys[q])), "address of " + names(q));
    std::string what = who + ": connecting to " + names(q) + " at " + ep.str();
    net::Fd fd = net::connect_tcp(ep, deadline, what);
    Hello h = make_hello(rank, q, c % lanes, lanes, s.key, s.launch.secret);
    net::write_full(fd.get(), &h, sizeof h, deadline, what);
    char ack[4];
    try {
      net::read_full(fd.get(), ack, 4, deadline, what);
    } catch (const Error& e) {
      if (e.code() != ErrorCode::peer_lost) throw;
      throw Error(ErrorCode::invalid_argument,
                  what +
                      ": it refused the connection (its COLLIE_JOB_SECRET or COLLIE_TCP_SOCKETS "
                      "differs, or another job is listening at that address)");
    }
    if (std::memcmp(ack, kAck, 4) != 0)
      throw Error(ErrorCode::mismatch, what + ": it answered with something that is not collie");
    peers[c] = std::move(fd);
  }

  // Accept the higher ranks. Connections are read without blocking, each
  // with its own short handshake deadline, so a stray client that sends
  // nothing or garbage is dropped without holding up the real peers.
  struct Pending {
    net::Fd fd;
    Hello hello{};
    size_t got = 0;
    net::Deadline deadline;
  };
  std::vector<Pending> pending;
  int waiting_for = (n - 1 - rank) * lanes;
  net::set_nonblocking(listener.get(), true);
  while (waiting_for > 0) {
    std::vector<pollfd> pfds{{listener.get(), POLLIN, 0}};
    for (auto& p : pending) pfds.push_back({p.fd.get(), POLLIN, 0});
    net::Deadline wake = deadline;
    for (auto& p : pending) wake = std::min(wake, p.deadline);
    int r = ::poll(pfds.data(), pfds.size(), net::poll_timeout_ms(wake));
    if (r < 0 && errno != EINTR) throw system_error(ErrorCode::internal, who + ": poll", errno);
    auto now = net::Clock::now();
    if (now >= deadline) {
      std::vector<int> missing;
      for (int q = rank + 1; q < n; ++q)
        for (int l = 0; l < lanes; ++l)
          if (!peers[q * lanes + l].valid()) {
            missing.push_back(q);
            break;
          }
      throw Error(ErrorCode::timeout, who + ": rendezvous timed out waiting for rank" +
                                          (missing.size() > 1 ? "s " : " ") + names.list(missing) +
                                          " to connect");
    }
    if (pfds[0].revents & POLLIN) {
      int fd = ::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd >= 0)
        pending.push_back({net::Fd(fd), {}, 0, std::min(deadline, now + std::chrono::seconds(10))});
    }
    for (size_t i = 0; i < pending.size();) {
      Pending& p = pending[i];
      bool drop = now >= p.deadline;
      if (!drop && (pfds.size() > i + 1 && pfds[i + 1].revents)) {
        ssize_t got = ::recv(p.fd.get(), reinterpret_cast<char*>(&p.hello) + p.got,
                             sizeof(Hello) - p.got, MSG_DONTWAIT);
        if (got > 0)
          p.got += static_cast<size_t>(got);
        else if (got == 0 || (errno != EAGAIN && errno != EINTR))
          drop = true;
      }
      if (!drop && p.got == sizeof(Hello)) {
        const Hello& h = p.hello;
        bool ok = h.magic == kHelloMagic && h.version == kVersion && h.to == rank &&
                  h.from > rank && h.from < n &&
                  std::string(h.key, strnlen(h.key, sizeof h.key)) == s.key &&
                  net::equal_secret(std::string(h.secret, strnlen(h.secret, sizeof h.secret)),
                                    s.launch.secret.substr(0, sizeof h.secret - 1));
        // A rank of this job (it knows the key and the secret) that opens
        // another number of connections is told so, not refused in silence.
        if (ok && h.lanes != lanes)
          throw Error(ErrorCode::invalid_argument,
                      who + ": " + names(h.from) + " opens " + std::to_string(h.lanes) +
                          " connections to each peer and this rank " + std::to_string(lanes) +
                          ": set the same COLLIE_TCP_SOCKETS on every rank");
        ok = ok && h.lane >= 0 && h.lane < lanes && !peers[h.from * lanes + h.lane].valid();
        if (ok) {
          net::set_nonblocking(p.fd.get(), false);
          net::write_full(p.fd.get(), kAck, 4, deadline, who + ": answering " + names(h.from));
          net::set_nodelay(p.fd.get());
          peers[h.from * lanes + h.lane] = std::move(p.fd);
          --waiting_for;
        } else {
          log::warn(who + ": refused a connection from " + net::peer_host(p.fd.get()) +
                    " that did not present this job's secret and communicator");
        }
        drop = true;
      }
      if (drop) {
        pending.erase(pending.begin() + static_cast<long>(i));
        pfds.erase(pfds.begin() + static_cast<long>(i) + 1);
      } else {
        ++i;
      }
    }
  }
  return peers;
}

class TcpRunner final : public HostRunner {
 public:
  TcpRunner(const BackendContext& ctx, const config::TcpTuning& tuning, std::vector<net::Fd> peers)
      : tuning_(tuning),
        mesh_(
            ctx.launch.rank, ctx.launch.world_size, std::move(peers), tuning_,
            config::ranks_fit_cores(ctx.launch.local_world_size, topology::usable_cpus(), ctx.env),
            ctx.failure, ctx.names) {}

 private:
  void run_collective(const Op& op, Deadline deadline) override {
    algo::Ctx c{mesh_, op.desc, tuning_.chunk_bytes, scratch_, deadline};
    algo::run_collective(c, op, tuning_);
  }

  void run_p2p(P2pBatch& batch, Deadline deadline) override {
    // Each op completes as soon as its bytes have moved; ops issued while
    // the batch runs join it, so that the classic exchange (send, then
    // receive, on both sides) does not wait for the send before receiving.
    size_t posted = 0;
    auto post_new = [&] {
      for (; posted < batch.ops.size(); ++posted) {
        const Op& op = batch.ops[posted];
        auto done = [&batch, i = posted] { batch.finished(i); };
        if (op.is_send)
          mesh_.post_send(op.desc, op.peer, op.in.data, op.in.nbytes(), done);
        else
          mesh_.post_recv(op.desc, op.peer, op.in.data, op.in.nbytes(), done);
      }
    };
    post_new();
    mesh_.run(deadline, [&] {
      if (!batch.refill()) return false;
      post_new();
      return true;
    });
  }

  void abort_peers(const Error& e) noexcept override { mesh_.abort(e); }
  void close() noexcept override { mesh_.close(); }
  void wake() noexcept override { mesh_.wake(); }

  const config::TcpTuning tuning_;
  Mesh mesh_;
  algo::Scratch scratch_;
};

}  // namespace

std::unique_ptr<HostRunner> make_runner(const BackendContext& ctx) {
  // Read once: the connections per peer shape the mesh, and the rest tunes
  // the runner (parsing may read COLLIE_TUNING_FILE).
  const config::TcpTuning tuning = config::tcp_tuning(ctx.env);
  const int lanes = tuning.sockets_per_peer;
  std::vector<net::Fd> peers;
  if (ctx.launch.world_size > 1)
    peers = build_mesh(ctx, lanes);
  else
    peers.resize(static_cast<size_t>(lanes));
  return std::make_unique<TcpRunner>(ctx, tuning, std::move(peers));
}

BackendEntry backend_entry() {
  return {"tcp", true, "", nullptr,
          [](const BackendContext& ctx) { return make_host_backend("tcp", &make_runner, ctx); }};
}

}  // namespace collie::tcp
