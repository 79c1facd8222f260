// comm/net/socket.h: the thin layer over POSIX sockets that the store, the
// TCP backend and collie-run share: an owning fd, listening, connecting with
// retries until a deadline, and whole-buffer reads and writes that honour a
// deadline. Everything throws collie::Error with the peer named in the text.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "collie/error.h"

namespace collie::net {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

inline Deadline deadline_after(std::chrono::milliseconds ms) {
  return Clock::now() + ms;
}
// Milliseconds left until `d` for poll(): 0 when passed, capped at INT_MAX.
int poll_timeout_ms(Deadline d);

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

struct Endpoint {
  std::string host;
  int port = 0;
  std::string str() const;  // "host:port", "[v6]:port"
};

// "host:port" or "[v6addr]:port"; throws invalid_argument naming `what`.
Endpoint parse_endpoint(const std::string& s, const std::string& what);

// A listening TCP socket on `host` ("" = all interfaces) and `port` (0 = any).
// A port already in use throws invalid_argument with `what` in the message.
Fd listen_tcp(const std::string& host, int port, const std::string& what, int backlog = 128);
int local_port(int fd);
std::string local_host(int fd);  // numeric address of the local end
std::string peer_host(int fd);   // numeric address of the remote end

// Connects to `ep`, retrying refused/unreachable attempts until `deadline`.
// Throws Error{timeout} whose message names `what` and the last errno.
Fd connect_tcp(const Endpoint& ep, Deadline deadline, const std::string& what);

// Accepts one connection, waiting until `deadline` (throws timeout).
Fd accept_tcp(int listen_fd, Deadline deadline, const std::string& what);

void set_nonblocking(int fd, bool on);
void set_nodelay(int fd);
void set_cloexec(int fd, bool on);
void set_buffer_sizes(int fd, int bytes);

// How long the TCP socket `fd` has had data for the other end and heard no
// acknowledgement, when the kernel has already tried again without one:
// data in flight resent after a retransmission timeout, or (nothing in
// flight, as when this host's own link is down and nothing can leave)
// unanswered probes, twice or more. The network to the other end, or its
// host, is then gone. Zero otherwise: a peer process that is only stalled
// does not count, since its kernel acknowledges data and probes alike (its
// window closes instead).
std::chrono::milliseconds unacknowledged_for(int fd);

// Reads/writes exactly `n` bytes or throws: timeout when `deadline` passes,
// peer_lost when the connection closes or breaks. Works on blocking and
// non-blocking sockets (waits with poll). `what` names the other end.
void read_full(int fd, void* buf, size_t n, Deadline deadline, const std::string& what);
void write_full(int fd, const void* buf, size_t n, Deadline deadline, const std::string& what);

// Length-prefixed byte strings (u32 little-endian length, then the bytes),
// with a cap so that garbage cannot make the reader allocate gigabytes.
void write_blob(int fd, const std::string& s, Deadline deadline, const std::string& what);
std::string read_blob(int fd, size_t max_len, Deadline deadline, const std::string& what);

}  // namespace collie::net
