// comm/transport.h: what collie's collective algorithms need from a network:
// this rank, the world size, posting sends and receives with completion
// callbacks, and running them to the end before a deadline.
//
// The algorithms in comm/algorithms/ are written against this and nothing
// else, so they run unchanged over the TCP mesh, over a future transport,
// and over the in-process fake transport that unit-tests them.
//
// The contract, which every transport keeps and every algorithm may rely on:
//  * Messages from one rank to another are matched with the receiver's posted
//    receives in the order both sides posted them (MPI's non-overtaking
//    rule). Algorithms therefore post in an order that does not depend on
//    when completions arrive.
//  * A send's bytes must stay unchanged, and a receive's buffer untouched,
//    until its callback has run; completions of different messages may be
//    reported in any order, and a send may be reported complete late.
//  * The sizes of a matched send and receive must be equal: a difference, or
//    a peer running another operation, is an error naming the peer (never
//    bytes read as something else).
//  * Callbacks run inside run(), on its thread, one at a time; they may post
//    more messages, which the same run() completes.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>

#include "base/op.h"

namespace collie {

using Deadline = std::chrono::steady_clock::time_point;

class Transport {
 public:
  using Callback = std::function<void()>;
  virtual ~Transport() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // `desc` names the operation the message belongs to (it travels with the
  // message, so that ranks running different operations are told so).
  virtual void post_send(const OpDesc& desc, int peer, const void* data, size_t bytes,
                         Callback on_done = {}) = 0;
  virtual void post_recv(const OpDesc& desc, int peer, void* data, size_t bytes,
                         Callback on_done = {}) = 0;

  // Moves bytes until every posted message (and every one that callbacks
  // post) has completed. `idle`, when given, is called whenever nothing can
  // move and returns whether it posted more (a batch of sends and receives
  // takes in those issued while it runs). Throws Error: timeout when
  // `deadline` passes (naming the peers still owed data), peer_lost,
  // mismatch, or a peer's abort.
  virtual void run(Deadline deadline, const std::function<bool()>& idle = {}) = 0;
};

}  // namespace collie
