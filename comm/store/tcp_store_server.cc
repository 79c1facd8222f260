// comm/store/tcp_store_server.cc: the server of the TCP key-value store
// ranks rendezvous through (comm/store/tcp_store.cc is its client; the wire
// format is there).
//
// The server is one thread with a poll() loop over the listening socket,
// every connection and a wake-up pipe: no thread per client, no spinning, no
// periodic tick (poll sleeps until I/O, shutdown, or the next handshake
// deadline). A request that must wait (get, wait) is parked on its
// connection and answered when a later set, add or compare_set makes its
// keys exist; the client enforces the deadline. Every message is a
// length-prefixed record with hard caps, and a client must pass the
// handshake within 10 s or it is dropped: garbage or silence on the port
// costs the server one socket for a moment, and nothing else. The handshake
// names the job (a client of another job is refused, and told so) and proves
// on both sides that the job secret is known, without sending it
// (comm/net/auth.h).
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "base/log.h"
#include "collie/store.h"
#include "comm/net/auth.h"
#include "comm/net/socket.h"
#include "comm/store/parse_int.h"
#include "comm/store/store_protocol.h"

namespace collie {

namespace {

using net::Clock;
using net::Deadline;

using namespace store_detail;

constexpr auto kHandshakeTime = std::chrono::seconds(10);
// How long to pause accepting when the process is out of file descriptors:
// the listener stays readable, so polling it would spin.
constexpr auto kAcceptPause = std::chrono::milliseconds(100);

class Server final : public TcpStoreServer {
 public:
  Server(net::Fd listener, StoreAuth auth)
      : listener_(std::move(listener)), proto_(std::move(auth)) {
    port_ = net::local_port(listener_.get());
    net::set_nonblocking(listener_.get(), true);
    int p[2];
    if (::pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0)
      throw system_error(ErrorCode::internal, "store server: pipe", errno);
    wake_r_.reset(p[0]);
    wake_w_.reset(p[1]);
    thread_ = std::thread([this] { loop(); });
  }

  ~Server() override {
    stop_ = true;
    [[maybe_unused]] ssize_t n = ::write(wake_w_.get(), "x", 1);
    thread_.join();
    // The members close the listener and every connection.
  }

  int port() const override { return port_; }

 private:
  struct Conn {
    net::Fd fd;
    Session* s;  // owned by proto_
    Deadline hello_deadline;
  };

  void loop() {
    std::vector<pollfd> pfds;
    Deadline accept_resume{};
    while (!stop_) {
      auto now = Clock::now();
      Deadline wake = now + std::chrono::hours(1);
      bool accepting = now >= accept_resume;
      if (!accepting) wake = std::min(wake, accept_resume);
      pfds.clear();
      pfds.push_back({listener_.get(), static_cast<short>(accepting ? POLLIN : 0), 0});
      pfds.push_back({wake_r_.get(), POLLIN, 0});
      for (auto& c : conns_) {
        short ev = c.s->closing ? 0 : POLLIN;
        if (c.s->has_output()) ev |= POLLOUT;
        pfds.push_back({c.fd.get(), ev, 0});
        if (!c.s->authed) wake = std::min(wake, c.hello_deadline);
      }
      int n = ::poll(pfds.data(), pfds.size(), net::poll_timeout_ms(wake));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        // Cannot wait any more (out of memory): close everything, so that
        // clients see a lost store at once instead of waiting for deadlines.
        for (auto& c : conns_) proto_.close(c.s);
        conns_.clear();
        listener_.reset();
        return;
      }
      if (pfds[1].revents) continue;  // shutdown: the loop condition ends it
      const size_t polled = conns_.size();
      if (pfds[0].revents & POLLIN && !accept_all()) accept_resume = Clock::now() + kAcceptPause;
      now = Clock::now();
      for (size_t i = 0; i < polled; ++i) {
        Conn& c = conns_[i];
        if (!c.s->authed && now >= c.hello_deadline) c.fd.reset();
        short re = pfds[i + 2].revents;
        if (c.fd.valid() && !c.s->closing && (re & (POLLIN | POLLHUP | POLLERR))) read_from(c);
      }
      // A set by one connection may have answered requests parked on any
      // other, so send to every connection, not only those polled writable.
      for (auto& c : conns_) {
        if (c.fd.valid() && c.s->has_output()) flush(c);
        if (c.fd.valid() && c.s->closing && !c.s->has_output()) c.fd.reset();
      }
      std::erase_if(conns_, [this](const Conn& c) {
        if (c.fd.valid()) return false;
        proto_.close(c.s);
        return true;
      });
    }
  }

  // Accepts every pending connection; false when out of descriptors.
  bool accept_all() {
    for (;;) {
      int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        return !(errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM);
      }
      net::set_nodelay(fd);
      conns_.push_back({net::Fd(fd), proto_.open(), Clock::now() + kHandshakeTime});
    }
  }

  void read_from(Conn& c) {
    char buf[65536];
    for (;;) {
      ssize_t n = ::recv(c.fd.get(), buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0) {
        if (proto_.receive(*c.s, {buf, static_cast<size_t>(n)})) continue;
        if (c.s->dropped) {
          c.fd.reset();
        } else if (c.s->closing) {
          // Logged here, with the address, for whoever runs rank 0.
          log::warn("store on port " + std::to_string(port_) + ": refused a client at " +
                    net::peer_host(c.fd.get()) + ": " + c.s->refusal);
        }
        return;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (n < 0 && errno == EINTR) continue;
      c.fd.reset();  // closed or broken: forget the connection and what it had parked
      return;
    }
  }

  void flush(Conn& c) {
    Session& s = *c.s;
    while (s.has_output()) {
      ssize_t n = ::send(c.fd.get(), s.out.data() + s.out_at, s.out.size() - s.out_at,
                         MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n > 0) {
        s.out_at += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      c.fd.reset();
      return;
    }
    // Advancing an offset instead of erasing keeps a 64 MiB reply linear.
    s.out.clear();
    s.out_at = 0;
  }

  net::Fd listener_;
  ServerProtocol proto_;
  int port_ = 0;
  net::Fd wake_r_, wake_w_;
  std::atomic<bool> stop_{false};
  std::vector<Conn> conns_;
  std::thread thread_;
};

}  // namespace

std::unique_ptr<TcpStoreServer> TcpStoreServer::start(int port, const StoreAuth& auth,
                                                      int listen_fd) {
  net::Fd fd;
  if (listen_fd >= 0) {
    int listening = 0;
    socklen_t len = sizeof listening;
    if (::getsockopt(listen_fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening)
      throw Error(ErrorCode::invalid_argument,
                  "rank 0: COLLIE_STORE_FD=" + std::to_string(listen_fd) +
                      " is not a listening socket; unset it unless collie-run set it");
    fd.reset(listen_fd);
  } else {
    fd = net::listen_tcp("", port, "rank 0: serving the store");
  }
  net::set_cloexec(fd.get(), true);
  return std::make_unique<Server>(std::move(fd), auth);
}

}  // namespace collie
