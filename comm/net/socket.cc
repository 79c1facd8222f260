#include "comm/net/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <thread>

namespace collie::net {

int poll_timeout_ms(Deadline d) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(d - Clock::now()).count();
  if (left <= 0) return 0;
  // Round up so a wait never ends a hair before its deadline and spins.
  return left >= INT_MAX ? INT_MAX : static_cast<int>(left) + 1;
}

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

std::string Endpoint::str() const {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

Endpoint parse_endpoint(const std::string& s, const std::string& what) {
  Endpoint ep;
  std::string port;
  if (!s.empty() && s[0] == '[') {
    auto close = s.find(']');
    if (close == std::string::npos || close + 1 >= s.size() || s[close + 1] != ':')
      throw Error(ErrorCode::invalid_argument, what + ": '" + s + "' is not [address]:port");
    ep.host = s.substr(1, close - 1);
    port = s.substr(close + 2);
  } else {
    auto colon = s.rfind(':');
    if (colon == std::string::npos)
      throw Error(ErrorCode::invalid_argument, what + ": '" + s + "' is not host:port");
    ep.host = s.substr(0, colon);
    port = s.substr(colon + 1);
  }
  char* end = nullptr;
  long p = std::strtol(port.c_str(), &end, 10);
  if (port.empty() || *end != '\0' || p < 0 || p > 65535)
    throw Error(ErrorCode::invalid_argument,
                what + ": port '" + port + "' is not a number in 0..65535");
  ep.port = static_cast<int>(p);
  return ep;
}

namespace {

struct AddrInfo {
  addrinfo* head = nullptr;
  ~AddrInfo() {
    if (head) freeaddrinfo(head);
  }
};

void resolve(const std::string& host, int port, bool passive, AddrInfo& out,
             const std::string& what) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  std::string service = std::to_string(port);
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &out.head);
  if (rc != 0)
    throw Error(ErrorCode::invalid_argument,
                what + ": cannot resolve host '" + host + "': " + gai_strerror(rc));
}

std::string numeric_host(const sockaddr_storage& ss) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(ss).sin_addr, buf, sizeof buf);
  } else if (ss.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(ss).sin6_addr, buf, sizeof buf);
  }
  return buf;
}

}  // namespace

Fd listen_tcp(const std::string& host, int port, const std::string& what, int backlog) {
  AddrInfo ai;
  resolve(host, port, true, ai, what);
  int last_errno = 0;
  // Prefer IPv4 when both are offered for "all interfaces": the peers'
  // MASTER_ADDR is far more often an IPv4 address.
  for (int pass = 0; pass < 2; ++pass) {
    for (addrinfo* a = ai.head; a; a = a->ai_next) {
      if ((pass == 0) != (a->ai_family == AF_INET)) continue;
      Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
      if (!fd.valid()) {
        last_errno = errno;
        continue;
      }
      int one = 1;
      ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd.get(), backlog) != 0) {
        last_errno = errno;
        continue;
      }
      return fd;
    }
  }
  if (last_errno == EADDRINUSE)
    throw Error(ErrorCode::invalid_argument,
                what + ": port " + std::to_string(port) +
                    " is already in use; choose another (MASTER_PORT / --master-port) "
                    "or let collie-run pick a free one");
  throw system_error(
      ErrorCode::invalid_argument,
      what + ": cannot listen on " + (host.empty() ? "*" : host) + ":" + std::to_string(port),
      last_errno);
}

int local_port(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0)
    throw system_error(ErrorCode::internal, "getsockname", errno);
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in&>(ss).sin_port);
  return ntohs(reinterpret_cast<sockaddr_in6&>(ss).sin6_port);
}

std::string local_host(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0)
    throw system_error(ErrorCode::internal, "getsockname", errno);
  return numeric_host(ss);
}

std::string peer_host(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  return numeric_host(ss);
}

Fd connect_tcp(const Endpoint& ep, Deadline deadline, const std::string& what) {
  int last_errno = 0;
  auto backoff = std::chrono::milliseconds(5);
  for (;;) {
    AddrInfo ai;
    resolve(ep.host, ep.port, false, ai, what);
    for (addrinfo* a = ai.head; a; a = a->ai_next) {
      Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
      if (!fd.valid()) {
        last_errno = errno;
        continue;
      }
      set_nonblocking(fd.get(), true);
      int rc = ::connect(fd.get(), a->ai_addr, a->ai_addrlen);
      if (rc != 0 && errno == EINPROGRESS) {
        pollfd p{fd.get(), POLLOUT, 0};
        int n = ::poll(&p, 1, poll_timeout_ms(deadline));
        if (n <= 0) {
          last_errno = n == 0 ? ETIMEDOUT : errno;
          continue;
        }
        int err = 0;
        socklen_t len = sizeof err;
        ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
        rc = err == 0 ? 0 : -1;
        errno = err;
      }
      if (rc == 0) {
        set_nonblocking(fd.get(), false);
        set_nodelay(fd.get());
        return fd;
      }
      last_errno = errno;
    }
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(
        std::min<std::chrono::nanoseconds>(backoff, deadline - Clock::now()));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
  throw Error(ErrorCode::timeout, what + ": could not connect to " + ep.str() +
                                      " before the deadline (last error: " +
                                      std::strerror(last_errno ? last_errno : ETIMEDOUT) + ")");
}

Fd accept_tcp(int listen_fd, Deadline deadline, const std::string& what) {
  for (;;) {
    pollfd p{listen_fd, POLLIN, 0};
    int n = ::poll(&p, 1, poll_timeout_ms(deadline));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw system_error(ErrorCode::internal, what + ": poll", errno);
    if (n == 0)
      throw Error(ErrorCode::timeout, what + ": no connection arrived before the deadline");
    int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) {
      set_nodelay(fd);
      return Fd(fd);
    }
    if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
      throw system_error(ErrorCode::internal, what + ": accept", errno);
  }
}

void set_nonblocking(int fd, bool on) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  ::fcntl(fd, F_SETFL, on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK));
}

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

void set_cloexec(int fd, bool on) {
  int flags = ::fcntl(fd, F_GETFD, 0);
  ::fcntl(fd, F_SETFD, on ? (flags | FD_CLOEXEC) : (flags & ~FD_CLOEXEC));
}

void set_buffer_sizes(int fd, int bytes) {
  ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes);
}

std::chrono::milliseconds unacknowledged_for(int fd) {
  tcp_info ti{};
  socklen_t len = sizeof ti;
  if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0) return {};
  // tcpi_retransmits and tcpi_probes count the tries since the last
  // acknowledgement (any acknowledgement resets them), so the age of that
  // acknowledgement is how long the link has been silent.
  const bool resent = ti.tcpi_unacked > 0 && ti.tcpi_retransmits > 0;
  const bool unanswered_probes = ti.tcpi_probes >= 2;
  if (!resent && !unanswered_probes) return {};
  return std::chrono::milliseconds(ti.tcpi_last_ack_recv);
}

namespace {
void wait_io(int fd, short events, Deadline deadline, const std::string& what, const char* verb) {
  for (;;) {
    pollfd p{fd, events, 0};
    int n = ::poll(&p, 1, poll_timeout_ms(deadline));
    if (n > 0) return;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw system_error(ErrorCode::internal, what + ": poll", errno);
    throw Error(ErrorCode::timeout, what + ": timed out while " + verb);
  }
}
}  // namespace

void read_full(int fd, void* buf, size_t n, Deadline deadline, const std::string& what) {
  auto* p = static_cast<uint8_t*>(buf);
  while (n > 0) {
    ssize_t r = ::recv(fd, p, n, MSG_DONTWAIT);
    if (r > 0) {
      p += r;
      n -= static_cast<size_t>(r);
    } else if (r == 0) {
      throw Error(ErrorCode::peer_lost, what + ": connection closed by the other end");
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      wait_io(fd, POLLIN, deadline, what, "reading");
    } else if (errno != EINTR) {
      throw system_error(ErrorCode::peer_lost, what + ": read failed", errno);
    }
  }
}

void write_full(int fd, const void* buf, size_t n, Deadline deadline, const std::string& what) {
  auto* p = static_cast<const uint8_t*>(buf);
  while (n > 0) {
    ssize_t r = ::send(fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (r >= 0) {
      p += r;
      n -= static_cast<size_t>(r);
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      wait_io(fd, POLLOUT, deadline, what, "writing");
    } else if (errno != EINTR) {
      throw system_error(ErrorCode::peer_lost, what + ": write failed", errno);
    }
  }
}

void write_blob(int fd, const std::string& s, Deadline deadline, const std::string& what) {
  uint32_t len = static_cast<uint32_t>(s.size());
  uint8_t hdr[4] = {static_cast<uint8_t>(len), static_cast<uint8_t>(len >> 8),
                    static_cast<uint8_t>(len >> 16), static_cast<uint8_t>(len >> 24)};
  std::string msg(reinterpret_cast<char*>(hdr), 4);
  msg += s;
  write_full(fd, msg.data(), msg.size(), deadline, what);
}

std::string read_blob(int fd, size_t max_len, Deadline deadline, const std::string& what) {
  uint8_t hdr[4];
  read_full(fd, hdr, 4, deadline, what);
  uint32_t len = hdr[0] | (hdr[1] << 8) | (hdr[2] << 16) | (static_cast<uint32_t>(hdr[3]) << 24);
  if (len > max_len)
    throw Error(ErrorCode::invalid_argument, what + ": message of " + std::to_string(len) +
                                                 " bytes exceeds the limit of " +
                                                 std::to_string(max_len));
  std::string s(len, '\0');
  read_full(fd, s.data(), len, deadline, what);
  return s;
}

}  // namespace collie::net
