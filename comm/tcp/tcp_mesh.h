// comm/tcp/tcp_mesh.h: one TCP connection to every peer of a communicator,
// the framing on them, and the progress loop: collie's TCP Transport.
//
// Every message is a frame (comm/tcp/frame.h): a 32-byte header (what op, which step of the op
// sequence, dtype, count, payload length) and a payload. Receivers check
// the header against what they expect, so ranks that call different
// collectives, or the same one with different counts or dtypes, get an error
// naming the rank that differs, never bytes read as something else. Abort
// frames carry an error to peers; a bye frame says a peer left cleanly.
//
// A peer may have several connections (COLLIE_TCP_SOCKETS, NCCL's
// NCCL_NSOCKS_PERTHREAD): each is a lane with its own frames and queues. A
// message of at least twice COLLIE_TCP_SOCKET_MIN_BYTES is cut into one part
// per lane (each at least that long, parts on lanes 0, 1, ...), a smaller
// one goes whole on lane 0. The cut depends on the size alone, so both sides
// put every part on the same lane in the same order, and a size that
// differs between them still shows up as a frame that does not match.
//
// One way per connection (COLLIE_TCP_SPLIT_DIRECTIONS, on by default): a
// peer has twice the lanes, and the large messages of the ops that measured
// faster so (the all-to-all's, a large all-gather's) go on the lanes of
// their direction; comm/tcp/lanes.h decides which lane a message takes.
// The first message of an op on the higher rank's one-way lanes is
// announced by an elsewhere frame on lane 0 (comm/tcp/frame.h), so a
// receiver expecting another size still meets a frame that does not match
// on the lane it reads; later messages of that op need none, since every
// header carries the op's count and a count that differs fails the first.
//
// Sockets are non-blocking; run() moves all of them on one thread, spinning
// briefly on the sockets before sleeping in poll() (for a budget that adapts:
// base/spin.h), and watches every other
// peer's socket for hang-ups, so that a dead rank is reported by every
// survivor, not only by its neighbours. Per peer, sends go out and receives
// are filled in the order they were posted.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/config.h"
#include "base/spin.h"
#include "collie/error.h"
#include "comm/backend.h"
#include "comm/net/socket.h"
#include "comm/tcp/lanes.h"
#include "comm/transport.h"

namespace collie::tcp {

struct FrameHeader;

class Mesh final : public Transport {
 public:
  // `conns`: lanes_per_peer(tuning) connections per peer (comm/tcp/lanes.h),
  // peer-major (peer q's lane l at q x lanes_per_peer + l); none for this
  // rank.
  Mesh(int rank, int size, std::vector<net::Fd> conns, const config::TcpTuning& tuning,
       bool spin_allowed, std::shared_ptr<FailureLatch> failure, RankNames names = {});
  ~Mesh() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void post_send(const OpDesc& desc, int peer, const void* data, size_t bytes,
                 Callback on_done = {}) override;
  void post_recv(const OpDesc& desc, int peer, void* data, size_t bytes,
                 Callback on_done = {}) override;
  // Also stops, with the latch's error, when another thread has recorded a
  // failure (an abort) and called wake().
  void run(Deadline deadline, const std::function<bool()>& idle = {}) override;

  // Interrupts run()'s sleep. Any thread.
  void wake() noexcept;
  // Tells every peer (where a frame boundary allows) and closes all sockets.
  void abort(const Error& e) noexcept;
  // Says goodbye to every peer and closes all sockets.
  void close() noexcept;

 private:
  struct Lane;
  // Lanes are numbered peer-major: lane `l` of peer `q` is q x lanes_ + l.
  int lane(int q, int l) const { return q * lanes_ + l; }
  int peer_of(int c) const { return c / lanes_; }
  void post(bool send, const OpDesc& d, int q, uint8_t* data, size_t bytes, Callback on_done);
  // Queues one item on lane c (`announce`: an elsewhere frame of `bytes`).
  void queue(bool send, int c, const OpDesc& d, uint8_t* data, size_t bytes, bool announce,
             Callback done);
  bool pump_send(int c);
  bool pump_recv(int c);
  void activate(int c, const OpDesc& d);
  [[noreturn]] void timed_out();
  // Peeks lane c's next frame header (recv's result).
  ssize_t peek_header(int c, FrameHeader& h);
  // A watched lane became readable while the running op reads nothing
  // there: throws what a hang-up or an abort means; data ahead (the peer
  // ran on to a later op) or a bye only stop the watch.
  void check_hangup(int c);
  void on_hangup(int c, FrameHeader& h, ssize_t n);  // with the peeked header
  // A hang-up on a lane the running op is not reading: check_hangup now,
  // or, for a peer that finished its part of this op (it died, or aborted a
  // later op), nothing until an op reads or writes that lane.
  void watched_hangup(int c);
  // Throws the error for losing the peer on lane `c`: its abort frame's,
  // when it sent one (`can_read`: this rank's read side of the lane is at a
  // frame boundary), else peer_lost naming it and any other rank whose
  // connection has closed.
  [[noreturn]] void lost(int c, const OpDesc& desc, const std::string& how, bool can_read);
  // Sends `kind` (abort or bye) to every peer where a frame boundary allows,
  // then half-closes every socket.
  void send_last_frame(uint8_t kind, uint8_t code, const std::string& text,
                       const OpDesc* op = nullptr) noexcept;

  const int rank_;
  const RankNames names_;  // for messages
  const int size_;
  const int lanes_;  // connections per peer
  std::vector<Lane> conns_;
  config::TcpTuning tuning_;
  SpinBudget spin_;
  // More ranks than CPUs (no spin): how long run() polls its sockets,
  // handing the CPU over between looks, before it sleeps in poll().
  std::chrono::microseconds yield_{0};
  std::shared_ptr<FailureLatch> failure_;
  net::Fd wake_;
  bool closed_ = false;
  // The current run: posted and not yet completed, the lanes with work, and
  // the operation messages name.
  size_t pending_ = 0;
  std::vector<int> active_;
  std::vector<uint8_t> is_active_;
  OpDesc current_;
  // Per peer, the op (kind << 32 | seq) whose large messages from the
  // higher rank were last announced, sending and receiving.
  std::vector<uint64_t> announced_send_, announced_recv_;
};

}  // namespace collie::tcp
