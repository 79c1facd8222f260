// comm/shm/shm_p2p.cc: point-to-point messages inside the segment: each
// ordered pair of ranks has a mailbox of slots (head and tail counters, a
// header per slot); a send copies into free slots in order, or hands its
// address over where the receiver may read this rank's memory
// (send_by_address); the receiver copies out and advances the tail; a
// rank with nothing to move sleeps on its bell.
#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>

#include "base/reduce.h"
#include "base/shared_file.h"
#include "base/trace.h"
#include "comm/shm/shm_runner.h"

namespace collie::shm {

void ShmRunner::run_p2p(P2pBatch& batch, Deadline dl) {
  std::vector<std::deque<Pending>> sends(n_), recvs(n_);
  size_t taken = 0, left = 0;
  auto take_new = [&] {
    for (; taken < batch.ops.size(); ++taken, ++left) {
      const Op& op = batch.ops[taken];
      (op.is_send ? sends : recvs)[op.peer].push_back({taken});
    }
  };
  take_new();
  const size_t slot = seg_.layout().p2p_slot, slots = seg_.layout().p2p_slots;
  for (;;) {
    const uint32_t seen = seg_.bell(me_).value.load(std::memory_order_acquire);
    bool moved = false;
    for (int p = 0; p < n_; ++p) {
      // Sends to p: fill free slots in order.
      while (!sends[p].empty()) {
        Pending& s = sends[p].front();
        const Op& op = batch.ops[s.index];
        const size_t total = op.in.nbytes();
        Counter& head = seg_.mail_head(me_, p);
        Counter& tail = seg_.mail_tail(me_, p);
        bool finished = false;
        if (s.ack) {  // handed over: wait for the receiver to have read it
          if (static_cast<int32_t>(tail.value.load(std::memory_order_acquire) - s.ack) < 0) break;
          finished = true;
        }
        if (!finished && s.done == 0 && send_by_address(total, seg_.reads_peers(p)) &&
            seg_.pinnable(op.in.data, total, op.in.data, total)) {
          const uint32_t h = head.value.load(std::memory_order_relaxed);
          if (h - tail.value.load(std::memory_order_acquire) >= slots) break;
          SlotHeader& hdr = seg_.mail_header(me_, p, h);
          hdr = {op.desc.seq, op.desc.tag, total, 0, 0, 1};
          const uint64_t addr = reinterpret_cast<uint64_t>(op.in.data);
          std::memcpy(seg_.mail_data(me_, p, h), &addr, sizeof addr);
          s.done = total;
          s.ack = h + 1;
          seg_.publish(head, h + 1);
          seg_.ring(p);
          moved = true;
          break;  // finished once the receiver frees the slot
        }
        for (; !finished;) {
          uint32_t h = head.value.load(std::memory_order_relaxed);
          if (h - tail.value.load(std::memory_order_acquire) >= slots) break;
          const size_t len = std::min(slot, total - s.done);
          SlotHeader& hdr = seg_.mail_header(me_, p, h);
          hdr = {op.desc.seq, op.desc.tag, total, s.done, static_cast<uint32_t>(len), 0};
          if (len > 0)  // an empty message's buffer may be null (an all-to-all's empty block)
            std::memcpy(seg_.mail_data(me_, p, h), static_cast<const uint8_t*>(op.in.data) + s.done,
                        len);
          s.done += len;
          seg_.publish(head, h + 1);
          seg_.ring(p);
          moved = true;
          if (s.done == total) {
            finished = true;
            break;
          }
        }
        if (!finished) break;
        batch.finished(s.index);
        sends[p].pop_front();
        --left;
      }
      // Receives from p: take what has arrived, in order.
      while (!recvs[p].empty()) {
        Pending& rv = recvs[p].front();
        const Op& op = batch.ops[rv.index];
        const size_t total = op.in.nbytes();
        Counter& head = seg_.mail_head(p, me_);
        Counter& tail = seg_.mail_tail(p, me_);
        bool finished = false;
        for (;;) {
          uint32_t tl = tail.value.load(std::memory_order_relaxed);
          if (head.value.load(std::memory_order_acquire) == tl) break;
          const SlotHeader& hdr = seg_.mail_header(p, me_, tl);
          if (hdr.seq != op.desc.seq || hdr.tag != op.desc.tag || hdr.total != total ||
              hdr.offset != rv.done || hdr.len > total - rv.done || (hdr.direct && rv.done != 0))
            throw Error(ErrorCode::mismatch,
                        names_(me_) + " expects message #" + std::to_string(op.desc.seq) +
                            " from " + names_(p) + " (tag " + std::to_string(op.desc.tag) + ", " +
                            std::to_string(total) + " bytes) but " + names_(p) + " sent message #" +
                            std::to_string(hdr.seq) + " (tag " + std::to_string(hdr.tag) + ", " +
                            std::to_string(hdr.total) + " bytes)");
          if (hdr.direct) {  // the whole message, from the sender's buffer
            uint64_t addr = 0;
            std::memcpy(&addr, seg_.mail_data(p, me_, tl), sizeof addr);
            seg_.read_peer(p, op.in.data, addr, total, What(op.desc));
            rv.done = total;
          } else {
            if (hdr.len > 0)
              std::memcpy(static_cast<uint8_t*>(op.in.data) + rv.done, seg_.mail_data(p, me_, tl),
                          hdr.len);
            rv.done += hdr.len;
          }
          seg_.publish(tail, tl + 1);
          seg_.ring(p);
          moved = true;
          if (rv.done == total) {
            finished = true;
            break;
          }
        }
        if (!finished) break;
        batch.finished(rv.index);
        recvs[p].pop_front();
        --left;
      }
    }
    if (moved) continue;
    if (batch.refill()) {
      take_new();
      continue;
    }
    if (left == 0) return;
    std::vector<int> peers;
    std::string what;
    for (int p = 0; p < n_; ++p) {
      if (!sends[p].empty() || !recvs[p].empty()) peers.push_back(p);
      if (what.empty() && !sends[p].empty())
        what = batch.ops[sends[p].front().index].desc.describe() + " to " + names_(p);
      if (what.empty() && !recvs[p].empty())
        what = batch.ops[recvs[p].front().index].desc.describe() + " from " + names_(p);
    }
    seg_.wait_bell(seen, peers, what, dl);
  }
}

}  // namespace collie::shm
