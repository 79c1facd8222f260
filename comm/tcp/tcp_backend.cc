// comm/tcp/tcp_backend.cc: the TCP backend: rendezvous into a mesh of
// sockets, then collie's algorithms over it, on the host executor.
#include "comm/tcp/tcp_backend.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "base/log.h"
#include "base/topology.h"
#include "comm/algorithms/algorithms.h"
#include "comm/host_executor.h"
#include "comm/net/auth.h"
#include "comm/net/socket.h"
#include "comm/tcp/handshake.h"
#include "comm/tcp/tcp_mesh.h"

namespace collie::tcp {

namespace {

using std::chrono::milliseconds;

// Builds the full mesh, `lanes` connections to each peer (peer-major, as
// Mesh takes them): connect to lower ranks, accept higher ones.
std::vector<net::Fd> build_mesh(const BackendContext& s, int lanes) {
  const int rank = s.launch.rank, n = s.launch.world_size;
  const RankNames& names = s.names;
  auto deadline = net::deadline_after(s.launch.timeout);
  std::string who = names(rank);
  std::vector<net::Fd> peers(static_cast<size_t>(n * lanes));
  const HandshakeKeys secrets{s.launch.secret, s.launch.job};

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
    const Hello h = make_hello(rank, q, c % lanes, lanes, s.key, auth::fresh_nonce());
    net::write_full(fd.get(), &h, sizeof h, deadline, what);
    auto refused = [&](const Error& e) {
      if (e.code() != ErrorCode::peer_lost) throw e;
      return Error(ErrorCode::invalid_argument,
                   what +
                       ": it refused the connection (its COLLIE_JOB_SECRET, COLLIE_TCP_SOCKETS or "
                       "COLLIE_TCP_SPLIT_DIRECTIONS differs, or another job is listening at that "
                       "address)");
    };
    Challenge ch{};
    try {
      net::read_full(fd.get(), &ch, sizeof ch, deadline, what);
    } catch (const Error& e) {
      throw refused(e);
    }
    const auth::Mac proof =
        connector_mac(secrets, h, {reinterpret_cast<const char*>(ch.nonce), sizeof ch.nonce});
    // The proof goes out even when the acceptor's is wrong, so that the
    // acceptor logs the refusal with this rank's address.
    net::write_full(fd.get(), proof.data(), proof.size(), deadline, what);
    if (!acceptor_proved(secrets, h, ch))
      throw Error(ErrorCode::invalid_argument,
                  what +
                      ": it could not prove that it knows this job's secret (COLLIE_JOB_SECRET "
                      "differs, or something else listens at that address)");
    char ack[4];
    try {
      net::read_full(fd.get(), ack, 4, deadline, what);
    } catch (const Error& e) {
      throw refused(e);
    }
    if (std::memcmp(ack, kAck, 4) != 0)
      throw Error(ErrorCode::mismatch, what + ": it answered with something that is not collie");
    peers[c] = std::move(fd);
  }

  // Accept the higher ranks. Connections are read without blocking, each
  // with its own short handshake deadline, so a stray client that sends
  // nothing or garbage is dropped without holding up the real peers. A
  // connection in its handshake reads the hello, then (once the challenge is
  // sent) the connector's proof (comm/tcp/handshake.h).
  struct Pending {
    net::Fd fd;
    net::Deadline deadline;
    AcceptorHandshake hs;
  };
  std::vector<Pending> pending;
  std::string refused;  // the last refusal, for the timeout's message
  auto refuse = [&](const std::string& why) {
    refused = who + ": refused a connection from " + why;
    log::warn(refused);
  };
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
                                          " to connect" +
                                          (refused.empty() ? "" : " (" + refused + ")"));
    }
    if (pfds[0].revents & POLLIN) {
      int fd = ::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd >= 0)
        pending.push_back({net::Fd(fd), std::min(deadline, now + std::chrono::seconds(10)),
                           AcceptorHandshake(secrets, rank, n, s.key, auth::fresh_nonce())});
    }
    for (size_t i = 0; i < pending.size();) {
      Pending& p = pending[i];
      bool drop = now >= p.deadline;
      auto step = AcceptorHandshake::Step::reading;
      if (!drop && (pfds.size() > i + 1 && pfds[i + 1].revents)) {
        ssize_t got = ::recv(p.fd.get(), p.hs.into(), p.hs.want(), MSG_DONTWAIT);
        if (got > 0)
          step = p.hs.advance(static_cast<size_t>(got));
        else if (got == 0 || (errno != EAGAIN && errno != EINTR))
          drop = true;
      }
      using Step = AcceptorHandshake::Step;
      if (drop || step == Step::reading) {
        // (nothing more to do with it now)
      } else if (step == Step::challenge) {
        // Answer with this side's nonce and proof; the connector's proof
        // comes next. A challenge is 64 bytes on a fresh socket: it fits in
        // the send buffer, so the write does not wait.
        try {
          net::write_full(p.fd.get(), p.hs.challenge().data(), p.hs.challenge().size(), p.deadline,
                          who + ": answering " + net::peer_host(p.fd.get()));
        } catch (const Error&) {
          drop = true;  // it hung up: whoever it was, the real peers go on
        }
      } else if (step == Step::stranger) {
        refuse(net::peer_host(p.fd.get()) +
               " that is not a rank of this communicator (a stray client, or another job's "
               "rank)");
        drop = true;
      } else {
        const Hello& h = p.hs.hello();
        if (step == Step::unproved) {
          refuse(net::peer_host(p.fd.get()) + " claiming to be " + names(h.from) +
                 " that could not prove it knows this job's secret");
        } else if (h.lanes != lanes) {
          // A rank of this job that opens another number of connections is
          // told so, not refused in silence.
          throw Error(ErrorCode::invalid_argument,
                      who + ": " + names(h.from) + " opens " + std::to_string(h.lanes) +
                          (h.lanes == 1 ? " connection" : " connections") +
                          " to each peer and this rank " + std::to_string(lanes) +
                          " (COLLIE_TCP_SOCKETS, twice that with COLLIE_TCP_SPLIT_DIRECTIONS=1, "
                          "the default): set the same on every rank");
        } else if (h.lane < lanes && !peers[h.from * lanes + h.lane].valid()) {
          net::set_nonblocking(p.fd.get(), false);
          net::write_full(p.fd.get(), kAck, 4, deadline, who + ": answering " + names(h.from));
          net::set_nodelay(p.fd.get());
          peers[h.from * lanes + h.lane] = std::move(p.fd);
          --waiting_for;
        } else {
          refuse(net::peer_host(p.fd.get()) + " claiming to be " + names(h.from) +
                 " for its lane " + std::to_string(h.lane) +
                 ", which is connected already (a replayed handshake?)");
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
        mesh_(ctx.launch.rank, ctx.launch.world_size, std::move(peers), tuning_,
              config::ranks_fit_cores(ctx.busy_threads_on_host(), topology::usable_cpus(), ctx.env),
              ctx.failure, ctx.names) {}

 private:
  bool runs_alltoall() const override { return true; }  // algo::pairwise_alltoall
  // algo::run_collective's all-reduces search as they reduce (op.seen).
  bool searches_nonfinite(const Op& op) const override { return op.desc.op == OpKind::allreduce; }

  void run_collective(const Op& op, Deadline deadline) override {
    algo::Ctx c{mesh_, op.desc, tuning_.chunk_bytes, scratch_, deadline};
    algo::run_collective(c, op, tuning_);
  }

  void run_p2p(P2pBatch& batch, Deadline deadline) override {
    algo::run_p2p(mesh_, batch, deadline);
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
  const int lanes = lanes_per_peer(tuning);
  std::vector<net::Fd> peers;
  if (ctx.launch.world_size > 1)
    peers = build_mesh(ctx, lanes);
  else
    peers.resize(static_cast<size_t>(lanes));
  return std::make_unique<TcpRunner>(ctx, tuning, std::move(peers));
}

BackendEntry backend_entry() {
  BackendEntry e{"tcp", true, "", nullptr, [](const BackendContext& ctx) {
                   return make_host_backend("tcp", &make_runner, ctx);
                 }};
  e.make_runner = &make_runner;
  return e;
}

}  // namespace collie::tcp
