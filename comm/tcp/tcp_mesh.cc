#include "comm/tcp/tcp_mesh.h"

#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/log.h"
#include "comm/tcp/frame.h"

namespace collie::tcp {

struct Mesh::Lane {
  struct Item {
    OpDesc desc;
    uint8_t* data;
    size_t bytes;
    Callback on_done;
    bool announce = false;  // an elsewhere frame saying `bytes` go on another lane
  };
  net::Fd fd;
  bool watch = true;          // report hang-ups while this peer has nothing for us
  bool departed = false;      // peeked a bye frame
  bool gone = false;          // hung up, or aborted a later op, while not read (watched_hangup)
  bool gone_checked = false;  // pump_send looked at a gone lane's end
  // Posted and not yet complete, in posting order.
  std::deque<Item> sends, recvs;
  FrameHeader send_hdr{};
  size_t send_done = 0;  // bytes of the current frame written (header + payload)
  FrameHeader recv_hdr{};
  size_t recv_hdr_got = 0;
  size_t recv_got = 0;
};

Mesh::Mesh(int rank, int size, std::vector<net::Fd> conns, const config::TcpTuning& tuning,
           bool spin_allowed, std::shared_ptr<FailureLatch> failure, RankNames names)
    : rank_(rank),
      names_(std::move(names)),
      size_(size),
      lanes_(lanes_per_peer(tuning)),
      conns_(static_cast<size_t>(size * lanes_)),
      tuning_(tuning),
      spin_(SpinBudget::from_setting(tuning.spin_us, spin_allowed)),
      yield_(spin_allowed          ? 0
             : tuning.yield_us < 0 ? config::kYieldUs
                                   : tuning.yield_us),
      failure_(std::move(failure)),
      wake_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
      is_active_(conns_.size(), 0),
      announced_send_(static_cast<size_t>(size), ~uint64_t{0}),
      announced_recv_(static_cast<size_t>(size), ~uint64_t{0}) {
  if (!wake_.valid()) throw system_error(ErrorCode::internal, "eventfd", errno);
  if (conns.size() != conns_.size())
    throw Error(ErrorCode::internal, "tcp mesh on " + names_(rank_) + ": " +
                                         std::to_string(conns.size()) + " connections for " +
                                         std::to_string(conns_.size()) + " lanes");
  for (size_t c = 0; c < conns_.size(); ++c) {
    conns_[c].fd = std::move(conns[c]);
    if (conns_[c].fd.valid()) {
      net::set_nonblocking(conns_[c].fd.get(), true);
      if (tuning.socket_buffer_bytes > 0)
        net::set_buffer_sizes(conns_[c].fd.get(), tuning.socket_buffer_bytes);
    }
  }
}

Mesh::~Mesh() {
  close();
}

namespace {

// Reads the text of an abort frame whose header is already consumed.
std::string read_abort_text(int fd, uint64_t bytes) {
  size_t n = static_cast<size_t>(std::min<uint64_t>(bytes, kMaxAbortText));
  std::string text(n, '\0');
  try {
    net::read_full(fd, text.data(), n, net::deadline_after(std::chrono::seconds(2)), "abort frame");
  } catch (const Error&) {
    text = "(its message was cut off)";
  }
  return text;
}

}  // namespace

void Mesh::lost(int c, const OpDesc& desc, const std::string& how, bool can_read) {
  const int q = peer_of(c);
  // A peer that failed first tells the others why in an abort frame (on
  // every lane); look for it (skipping data frames it sent before it) so
  // the error names the cause, not only the messenger.
  if (can_read) {
    int fd = conns_[c].fd.get();
    auto until = net::deadline_after(std::chrono::milliseconds(200));
    std::vector<uint8_t> sink(64 * 1024);
    for (int frames = 0; frames < 4096; ++frames) {
      FrameHeader h{};
      try {
        net::read_full(fd, &h, sizeof h, until, "");
      } catch (const Error&) {
        break;
      }
      if (h.magic != kFrameMagic) break;
      if (h.kind == static_cast<uint8_t>(FrameKind::abort))
        throw abort_error(h, names_(q), read_abort_text(fd, h.bytes));
      if (h.kind != static_cast<uint8_t>(FrameKind::data)) break;
      try {
        for (uint64_t left = h.bytes; left > 0;) {
          size_t n = static_cast<size_t>(std::min<uint64_t>(left, sink.size()));
          net::read_full(fd, sink.data(), n, until, "");
          left -= n;
        }
      } catch (const Error&) {
        break;
      }
    }
  }
  // Other peers whose connections have closed without a word died too.
  std::string also;
  int n_also = 0;
  for (int r = 0; r < size_; ++r) {
    if (r == q || r == rank_ || !conns_[lane(r, 0)].fd.valid()) continue;
    pollfd pf{conns_[lane(r, 0)].fd.get(), POLLRDHUP, 0};
    char c;
    if (::poll(&pf, 1, 0) == 1 && (pf.revents & (POLLRDHUP | POLLHUP | POLLERR)) &&
        ::recv(pf.fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) <= 0) {
      also += (also.empty() ? "" : ", ") + std::to_string(names_[r]);
      ++n_also;
      failure_->lost(names_[r]);
    }
  }
  failure_->lost(names_[q]);
  throw Error(ErrorCode::peer_lost,
              desc.describe() + " on " + names_(rank_) + ": lost " + names_(q) + " " + how +
                  (also.empty() ? ""
                                : (n_also > 1 ? "; ranks " : "; rank ") + also +
                                      (n_also > 1 ? " are gone too" : " is gone too")));
}

ssize_t Mesh::peek_header(int c, FrameHeader& h) {
  return ::recv(conns_[c].fd.get(), &h, sizeof h, MSG_PEEK | MSG_DONTWAIT);
}

void Mesh::check_hangup(int c) {
  FrameHeader h{};
  const ssize_t n = peek_header(c, h);
  on_hangup(c, h, n);
}

void Mesh::on_hangup(int c, FrameHeader& h, ssize_t n) {
  const int q = peer_of(c);
  Lane& p = conns_[c];
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (n <= 0)
    lost(c, current_, "(its connection closed: the process died, was killed, or aborted)", false);
  if (static_cast<size_t>(n) == sizeof h && h.magic == kFrameMagic &&
      h.kind == static_cast<uint8_t>(FrameKind::abort)) {
    ::recv(p.fd.get(), &h, sizeof h, MSG_DONTWAIT);
    std::string text = read_abort_text(p.fd.get(), h.bytes);
    throw abort_error(h, names_(q), text);
  }
  if (static_cast<size_t>(n) == sizeof h && h.magic == kFrameMagic &&
      h.kind == static_cast<uint8_t>(FrameKind::bye))
    p.departed = true;
  // Data ahead of us (the peer ran on to a later op and then left): it is
  // read, and any loss reported, when this rank gets to that op.
  p.watch = false;
}

void Mesh::watched_hangup(int c) {
  // The running op reads nothing from that peer now. A peer that closed
  // without a word (it died), or that aborted a later collective than this
  // one, finished its part of this op first: what this op needs of it has
  // come already (it is read when the op posts that receive, before the
  // socket's end), or the op fails when it reads that end, or through the
  // abort of a peer that does. So the op goes on, and completes as on the
  // ranks that never looked at that socket: the survivors agree on which
  // op failed. The lane is not watched again. Anything else (an abort of
  // this op, a bye) is read now.
  Lane& p = conns_[c];
  FrameHeader h{};
  const ssize_t n = peek_header(c, h);
  const bool died = n == 0 || (n < 0 && errno == ECONNRESET);
  const bool later_abort = static_cast<size_t>(n) == sizeof h && h.magic == kFrameMagic &&
                           h.kind == static_cast<uint8_t>(FrameKind::abort) &&
                           current_.op != OpKind::p2p && known_op(h.op) &&
                           h.op != static_cast<uint8_t>(OpKind::p2p) &&
                           static_cast<int32_t>(h.seq - current_.seq) > 0;
  if (died || later_abort) {
    if (died) failure_->lost(names_[peer_of(c)]);
    p.watch = false;
    p.gone = true;
    return;
  }
  on_hangup(c, h, n);
}

void Mesh::activate(int c, const OpDesc& d) {
  if (closed_)
    throw Error(ErrorCode::internal, "the communicator on " + names_(rank_) + " is closed");
  if (pending_ == 0) current_ = d;
  ++pending_;
  if (!is_active_[c]) {
    is_active_[c] = 1;
    active_.push_back(c);
  }
}

void Mesh::queue(bool send, int c, const OpDesc& d, uint8_t* data, size_t bytes, bool announce,
                 Callback done) {
  activate(c, d);
  (send ? conns_[c].sends : conns_[c].recvs).push_back({d, data, bytes, std::move(done), announce});
}

void Mesh::post(bool send, const OpDesc& d, int q, uint8_t* data, size_t bytes, Callback on_done) {
  const LanePlan plan = plan_lanes(tuning_, d, bytes, send ? rank_ : q, send ? q : rank_, size_);
  const size_t parts = plan.parts;
  const int first = plan.first;
  // Announced once per op and peer: the header carries the op's count, so
  // a size that differs shows in its first message (an announce per 512 KiB
  // chunk measured 9-25 % slower from 2 MiB: it is return traffic on the
  // shared connection).
  bool announce = false;
  if (plan.elsewhere) {
    const uint64_t key = (uint64_t{static_cast<uint8_t>(d.op)} << 32) | d.seq;
    uint64_t& last = (send ? announced_send_ : announced_recv_)[static_cast<size_t>(q)];
    announce = last != key;
    last = key;
  }
  const size_t items = parts + (announce ? 1 : 0);
  if (items == 1) return queue(send, lane(q, first), d, data, bytes, false, std::move(on_done));
  // The message is done when its last item is, on whichever lane.
  auto left = std::make_shared<std::pair<size_t, Callback>>(items, std::move(on_done));
  auto one_done = [left] {
    if (--left->first == 0 && left->second) left->second();
  };
  if (announce) queue(send, lane(q, 0), d, nullptr, bytes, true, one_done);
  const size_t per = (bytes + parts - 1) / parts;
  for (size_t i = 0; i < parts; ++i) {
    const size_t lo = i * per;
    queue(send, lane(q, first + static_cast<int>(i)), d, data + lo, std::min(bytes, lo + per) - lo,
          false, one_done);
  }
}

void Mesh::post_send(const OpDesc& d, int q, const void* data, size_t bytes, Callback on_done) {
  post(true, d, q, static_cast<uint8_t*>(const_cast<void*>(data)), bytes, std::move(on_done));
}

void Mesh::post_recv(const OpDesc& d, int q, void* data, size_t bytes, Callback on_done) {
  post(false, d, q, static_cast<uint8_t*>(data), bytes, std::move(on_done));
}

bool Mesh::pump_send(int c) {
  Lane& p = conns_[c];
  bool progressed = false;
  size_t written = 0;
  // A send to a peer seen gone: its end (or abort) is the error, not the
  // first write, which may still land in the dead socket's buffer.
  // Once: what the peek finds (data ahead, or nothing) stays so.
  if (p.gone && !p.gone_checked && !p.sends.empty() && p.send_done == 0 && p.recv_hdr_got == 0 &&
      p.recv_got == 0) {
    p.gone_checked = true;
    check_hangup(c);
  }
  while (!p.sends.empty()) {
    Lane::Item& it = p.sends.front();
    if (p.send_done == 0)
      p.send_hdr =
          make_header(it.announce ? FrameKind::elsewhere : FrameKind::data, it.desc, it.bytes);
    const size_t payload = it.announce ? 0 : it.bytes;
    iovec iov[2];
    int niov = 0;
    if (p.send_done < sizeof(FrameHeader)) {
      iov[niov++] = {reinterpret_cast<uint8_t*>(&p.send_hdr) + p.send_done,
                     sizeof(FrameHeader) - p.send_done};
      if (payload) iov[niov++] = {it.data, payload};
    } else {
      size_t off = p.send_done - sizeof(FrameHeader);
      iov[niov++] = {it.data + off, payload - off};
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(niov);
    ssize_t n = ::sendmsg(p.fd.get(), &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      if (errno == EINTR) continue;
      lost(c, it.desc, std::string("while sending to it (") + std::strerror(errno) + ")",
           p.recv_hdr_got == 0 && p.recv_got == 0);
    }
    progressed = true;
    p.send_done += static_cast<size_t>(n);
    written += static_cast<size_t>(n);
    if (p.send_done == sizeof(FrameHeader) + payload) {
      p.send_done = 0;
      const OpDesc done_desc = it.desc;
      const size_t done_bytes = it.bytes;
      Callback done = std::move(it.on_done);
      p.sends.pop_front();
      --pending_;
      if (done) done();
      // Back to the receives once a pass has written enough of a one-way
      // op: both directions then keep flowing (bench/RESULTS.md, "One
      // connection per direction").
      if (written >= kSendPassBytes && one_way(tuning_, done_desc, done_bytes, size_)) break;
    }
  }
  return progressed;
}

bool Mesh::pump_recv(int c) {
  const int q = peer_of(c);
  Lane& p = conns_[c];
  bool progressed = false;
  while (!p.recvs.empty()) {
    Lane::Item& it = p.recvs.front();
    if (p.recv_hdr_got < sizeof(FrameHeader)) {
      ssize_t n = ::recv(p.fd.get(), reinterpret_cast<uint8_t*>(&p.recv_hdr) + p.recv_hdr_got,
                         sizeof(FrameHeader) - p.recv_hdr_got, MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0)
        lost(c, it.desc, "(its connection closed: the process died, was killed, or aborted)",
             false);
      progressed = true;
      p.recv_hdr_got += static_cast<size_t>(n);
      if (p.recv_hdr_got < sizeof(FrameHeader)) continue;
      const FrameHeader& h = p.recv_hdr;
      if (check_frame(h, it.desc, it.bytes, names_(rank_), names_(q),
                      it.announce ? FrameKind::elsewhere : FrameKind::data) == FrameCheck::abort)
        throw abort_error(h, names_(q), read_abort_text(p.fd.get(), h.bytes));
    }
    while (!it.announce && p.recv_got < it.bytes) {
      ssize_t n = ::recv(p.fd.get(), it.data + p.recv_got, it.bytes - p.recv_got, MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return progressed;
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0)
        lost(c, it.desc, "in the middle of a message (the process died or was killed)", false);
      progressed = true;
      p.recv_got += static_cast<size_t>(n);
    }
    p.recv_hdr_got = p.recv_got = 0;
    Callback done = std::move(it.on_done);
    p.recvs.pop_front();
    --pending_;
    if (done) done();
  }
  return progressed;
}

void Mesh::timed_out() {
  std::string who;
  for (int c : active_) {
    Lane& p = conns_[c];
    if (!p.recvs.empty()) {
      who = "waiting for " + names_(peer_of(c)) + " to send";
      break;
    }
    if (!p.sends.empty()) who = "waiting for " + names_(peer_of(c)) + " to receive";
  }
  // Peers that have acknowledged nothing this rank sent them, resent and
  // all, for a second or more: a network fault, not a stalled rank (whose
  // kernel acknowledges). Named here, since the rank this op waits for may
  // be a neighbour that waits on the broken link itself.
  std::vector<int> cut;
  std::chrono::milliseconds longest{0};
  for (int q = 0; q < size_; ++q) {
    std::chrono::milliseconds silent{0};
    for (int l = 0; l < lanes_; ++l)
      if (conns_[lane(q, l)].fd.valid())
        silent = std::max(silent, net::unacknowledged_for(conns_[lane(q, l)].fd.get()));
    if (silent >= std::chrono::seconds(1)) {
      cut.push_back(q);
      longest = std::max(longest, silent);
    }
  }
  std::string network;
  if (!cut.empty()) {
    const bool many = cut.size() > 1;
    network = "; nothing sent to " + std::string(many ? "ranks " : "rank ") + names_.list(cut) +
              " has been acknowledged for " + (many ? "up to " : "") + log::seconds(longest) +
              ", though resent: the network to " +
              (many ? "them (or their hosts)" : "it (or its host)") + " is down";
  }
  throw Error(ErrorCode::timeout, current_.describe() + " on " + names_(rank_) + " timed out " +
                                      who +
                                      " (that rank is stalled, or is not calling the same "
                                      "collective; COLLIE_TIMEOUT sets the deadline)" +
                                      network);
}

void Mesh::run(Deadline deadline, const std::function<bool()>& idle) {
  if (closed_)
    throw Error(ErrorCode::internal, "the communicator on " + names_(rank_) + " is closed");
  for (Lane& p : conns_)
    if (!p.departed && !p.gone) p.watch = true;
  std::vector<pollfd> pfds;
  std::vector<int> pfd_lane;
  auto spin = spin_.get();
  auto spin_until = net::Clock::now() + spin;
  // With more ranks than CPUs, a rank asleep in poll() costs its sender a
  // wake-up through another CPU (16 us on this VM): hand the CPU over
  // between looks instead, for a while (Open MPI's oversubscribed loop).
  auto yield_until = std::min(spin_until + yield_, deadline);
  for (;;) {
    if (failure_->failed()) throw *failure_->get();
    bool progressed = false;
    // Callbacks may post to peers not yet active: index, do not iterate.
    for (size_t i = 0; i < active_.size(); ++i) {
      progressed |= pump_send(active_[i]);
      progressed |= pump_recv(active_[i]);
    }
    if (pending_ == 0 && !(idle && idle())) break;
    if (pending_ == 0) continue;
    auto now = net::Clock::now();
    if (progressed) {
      spin_until = now + spin;
      yield_until = std::min(spin_until + yield_, deadline);
      continue;
    }
    if (idle && idle()) continue;
    if (now < spin_until) continue;  // busy-poll the sockets: ~4 us vs ~40 us to wake
    if (now < yield_until) {
      sched_yield();
      continue;
    }

    pfds.clear();
    pfd_lane.clear();
    for (int c = 0; c < static_cast<int>(conns_.size()); ++c) {
      Lane& p = conns_[c];
      if (!p.fd.valid()) continue;
      bool want_in = !p.recvs.empty();
      short ev = 0;
      if (want_in) ev |= POLLIN;
      if (!p.sends.empty()) ev |= POLLOUT;
      if (p.watch && !want_in) ev |= POLLRDHUP;
      if (ev == 0) continue;
      pfds.push_back({p.fd.get(), ev, 0});
      pfd_lane.push_back(c);
    }
    pfds.push_back({wake_.get(), POLLIN, 0});
    pfd_lane.push_back(-1);
    const auto asleep = net::Clock::now();
    int n = ::poll(pfds.data(), pfds.size(), net::poll_timeout_ms(deadline));
    if (n < 0 && errno != EINTR)
      throw system_error(ErrorCode::internal, "poll on " + names_(rank_), errno);
    if (n == 0 && net::Clock::now() >= deadline) timed_out();
    bool answered = false;  // by a peer, not by wake()
    for (size_t i = 0; i < pfds.size(); ++i) {
      int c = pfd_lane[i];
      answered |= c >= 0 && pfds[i].revents != 0;
      if (c < 0) {
        uint64_t count;
        if (pfds[i].revents & POLLIN) [[maybe_unused]]
          ssize_t r = ::read(wake_.get(), &count, sizeof count);
        continue;
      }
      if (conns_[c].recvs.empty() && (pfds[i].revents & (POLLRDHUP | POLLHUP | POLLERR)))
        watched_hangup(c);
    }
    if (answered) {
      spin_.slept(net::Clock::now() - asleep);
      spin = spin_.get();
    }
    spin_until = net::Clock::now() + spin;
    yield_until = std::min(spin_until + yield_, deadline);
  }
  for (int c : active_) is_active_[c] = 0;
  active_.clear();
}

void Mesh::wake() noexcept {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_.get(), &one, sizeof one);
}

void Mesh::send_last_frame(uint8_t kind, uint8_t code, const std::string& text,
                           const OpDesc* op) noexcept {
  for (Lane& p : conns_) {
    if (!p.fd.valid()) continue;
    // Only at a frame boundary: in the middle of a frame the peer would read
    // this as payload; there the half-close below tells it instead.
    if (p.send_done == 0) {
      std::string frame = last_frame(static_cast<FrameKind>(kind), code, text, op);
      [[maybe_unused]] ssize_t n =
          ::send(p.fd.get(), frame.data(), frame.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    }
    // Half-close: the peer reads what was sent, then end-of-stream. Closing
    // outright could turn into a reset that discards the frame.
    ::shutdown(p.fd.get(), SHUT_WR);
  }
  closed_ = true;
}

void Mesh::abort(const Error& e) noexcept {
  if (!closed_)
    send_last_frame(static_cast<uint8_t>(FrameKind::abort), static_cast<uint8_t>(e.code()),
                    std::string(e.what()).substr(0, kMaxAbortText),
                    pending_ > 0 ? &current_ : nullptr);
  // Whatever was posted belongs to an operation that has failed: its
  // callbacks point into state that is gone, and never run.
  for (Lane& p : conns_) {
    p.sends.clear();
    p.recvs.clear();
  }
  pending_ = 0;
  for (int c : active_) is_active_[c] = 0;
  active_.clear();
}

void Mesh::close() noexcept {
  if (!closed_) send_last_frame(static_cast<uint8_t>(FrameKind::bye), 0, "");
  for (Lane& p : conns_) p.fd.reset();
}

}  // namespace collie::tcp
