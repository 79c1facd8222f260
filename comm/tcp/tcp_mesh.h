// comm/tcp/tcp_mesh.h: one TCP connection to every peer of a communicator,
// the framing on them, and the progress loop that collectives run on.
//
// Every message is a frame: a 32-byte header (what op, which step of the
// op sequence, dtype, count) and a payload. Receivers check the header
// against what they expect, so ranks that call different collectives, or the
// same one with different counts or dtypes, get an error naming the rank that
// differs, never bytes read as something else. Abort frames carry an error
// to peers; a bye frame says a peer left cleanly.
//
// Exchange::run drives an algorithm written as two ordered lists per peer,
// sends and receives, with a callback when a receive completes (to reduce it
// and release the sends that depend on it). Sockets are non-blocking; one
// thread moves all of them, spinning briefly on the sockets before sleeping
// in poll(), and watches every other peer's socket for hang-ups so that a
// dead rank is reported by every survivor, not only by its neighbours.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "collie/error.h"
#include "collie/types.h"
#include "comm/config/config.h"
#include "comm/net/socket.h"

namespace collie::tcp {

enum class OpKind : uint8_t {
  allreduce = 1,
  broadcast,
  allgather,
  reduce_scatter,
  barrier,
  p2p,
  split,
};
std::string_view to_string(OpKind k);

// What a frame belongs to; a receiver's expectation is one of these too.
struct OpDesc {
  OpKind op = OpKind::allreduce;
  DType dtype = DType::u8;
  ReduceOp redop = ReduceOp::sum;
  uint32_t seq = 0;              // collective number, or per-pair message number for p2p
  int32_t tag = 0;               // p2p tag, broadcast root
  uint64_t count = 0;            // elements as the caller passed them
  std::string describe() const;  // "allreduce #3 (f32 x 1000, sum)"
};

struct SendItem {
  int peer;
  const void* data;
  size_t bytes;
  bool ready = true;  // false until a receive's callback releases it
};

struct RecvItem {
  int peer;
  void* data;
  size_t bytes;
  std::function<void()> on_done;  // runs as soon as the bytes are in
};

class Mesh {
 public:
  Mesh(int rank, int size, std::vector<net::Fd> peers, const config::TcpTuning& tuning,
       bool spin_allowed);
  ~Mesh();

  int rank() const { return rank_; }
  int size() const { return size_; }

  // Moves every item (per peer, in list order) or throws: peer_lost (names
  // the peer), mismatch (names the peer and both descriptions), timeout
  // (names the peers still owed data), or a peer's abort. Receive callbacks
  // may set SendItem::ready on items of `sends`.
  void run(const OpDesc& desc, std::vector<SendItem>& sends, std::vector<RecvItem>& recvs,
           net::Deadline deadline);
  // Point-to-point batches: each item carries its own description, and
  // `refill` (called whenever the loop is about to wait) may append more
  // items to the four vectors, so that sends and receives issued while the
  // batch runs join it.
  using Refill = std::function<void()>;
  void run_p2p(std::vector<SendItem>& sends, std::vector<OpDesc>& send_desc,
               std::vector<RecvItem>& recvs, std::vector<OpDesc>& recv_desc, net::Deadline deadline,
               const Refill& refill);

  // A descriptor whose readability interrupts the loop's sleep (an eventfd
  // the owner signals when it queues work that a refill should pick up).
  void set_wake_fd(int fd) { wake_fd_ = fd; }

  // Tells every peer (where a frame boundary allows) and closes all sockets.
  void abort(const Error& e) noexcept;
  // Says goodbye to every peer and closes all sockets.
  void close() noexcept;

 private:
  struct Peer;
  void run_impl(const OpDesc* common, std::vector<SendItem>& sends, std::vector<OpDesc>* send_desc,
                std::vector<RecvItem>& recvs, std::vector<OpDesc>* recv_desc,
                net::Deadline deadline, const Refill* refill);
  void check_hangup(int peer, const OpDesc& desc);
  // Throws the error for losing `peer`: its abort frame's, when it sent one
  // (`can_read_peer`: this rank's read side of it is at a frame boundary),
  // else peer_lost naming it and any other rank whose connection has closed.
  [[noreturn]] void lost(int peer, const OpDesc& desc, const std::string& how, bool can_read_peer);
  // Sends `kind` (abort or bye) to every peer where a frame boundary allows,
  // then half-closes every socket.
  void send_last_frame(uint8_t kind, uint8_t code, const std::string& text) noexcept;
  [[noreturn]] void fail_from_frame(int peer, const struct FrameHeader& h, const OpDesc& expected);

  int rank_;
  int size_;
  std::vector<Peer> peers_;
  config::TcpTuning tuning_;
  int spin_us_;
  int wake_fd_ = -1;
  bool closed_ = false;
};

}  // namespace collie::tcp
