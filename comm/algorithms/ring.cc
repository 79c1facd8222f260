// comm/algorithms/ring.cc: the ring collectives, each written as the list of
// NCCL's primitives a rank runs, step by step, on every chunk of a segment,
// and one pipeline that runs such a list over a Transport.
#include <algorithm>
#include <cstring>
#include <string>

#include "base/nonfinite.h"
#include "base/reduce.h"
#include "comm/algorithms/algorithms.h"

namespace collie::algo {

namespace {

// What a rank does with one chunk at one step of a ring (NCCL's names,
// src/device/primitives.h). Every step but the first receives from the left
// neighbour the segment that neighbour handled at the step before; every
// step but the last sends to the right one.
enum class Prim : uint8_t {
  send,                   // my segment leaves
  recv_reduce_send,       // combine what arrives with my input; pass the partial on
  recv_reduce_copy_send,  // combine into the result (the segment is complete); pass it on
  recv_reduce_copy,       // combine into the result; the ring ends here
  recv_copy_send,         // a complete segment arrives in the output; pass it on
  recv,                   // a complete segment arrives in the output
};

bool receives(Prim p) {
  return p != Prim::send;
}
bool forwards(Prim p) {
  return p == Prim::send || p == Prim::recv_reduce_send || p == Prim::recv_reduce_copy_send ||
         p == Prim::recv_copy_send;
}
bool reduces(Prim p) {
  return p == Prim::recv_reduce_send || p == Prim::recv_reduce_copy_send ||
         p == Prim::recv_reduce_copy;
}

struct Step {
  Prim prim;
  int seg;
  // A receive of this step writes the output where an earlier step's send
  // read it (in place, or a partial sum sent on): it waits for that send.
  int after_send_of = -1;
};

// The buffers a ring works on; segment s is bytes [seg_off[s], +seg_len[s])
// of `in`, `partials` and `out` alike.
struct Ring {
  std::vector<Step> steps;
  std::vector<size_t> seg_off, seg_len;
  const uint8_t* in = nullptr;          // my contribution: reduce operand
  const uint8_t* first_send = nullptr;  // where step 0 sends from
  uint8_t* partials = nullptr;          // where partial sums are formed and sent on from
  uint8_t* out = nullptr;               // where complete segments land
  uint8_t* final_base = nullptr;        // where the segment this rank completes goes
  DType dtype = DType::u8;
  ReduceOp op = ReduceOp::sum;
  int divisor = 0;  // avg: the rank count, applied where a segment completes
  // Where the search for NaN and Inf records (all-reduce with a
  // NonFiniteSeen), or null: `in` is this rank's input at every reduce
  // step, and what arrives at step 1 is the left neighbour's, untouched.
  kernels::NonFiniteSeen* seen = nullptr;
  int me = 0, left = 0;
};

// Runs a ring: every chunk goes through the steps in order; chunk c of step
// j + 1 leaves as soon as chunk c of step j has arrived (and been reduced),
// so the wire, the reduction and the other direction all run at once.
// Sends to the right and receives from the left are posted in (step, chunk)
// order whatever order completions come in, as the transport's matching
// requires. Received partials land in a chunk-sized staging slot and are
// reduced at once, freeing it.
class RingPipeline {
 public:
  RingPipeline(const Ctx& c, const Ring& ring, size_t chunk)
      : c_(c),
        r_(ring),
        chunk_(chunk),
        right_(mod(c.transport.rank() + 1, c.transport.size())),
        left_(mod(c.transport.rank() - 1, c.transport.size())) {
    const size_t steps = r_.steps.size();
    base_.assign(steps + 1, 0);
    for (size_t j = 0; j < steps; ++j) base_[j + 1] = base_[j] + chunks(j);
    recv_done_.assign(base_[steps], 0);
    send_done_.assign(base_[steps], 0);
    slot_of_.assign(base_[steps], -1);
  }

  void run(uint8_t* staging) {
    staging_ = staging;
    for (int s = kSlots - 1; s >= 0; --s) free_slots_.push_back(s);
    pump();
    c_.transport.run(c_.deadline);
    if (send_j_ < r_.steps.size() || recv_j_ < r_.steps.size())
      throw Error(ErrorCode::internal, c_.desc.describe() + ": the ring pipeline stalled at step " +
                                           std::to_string(std::min(send_j_, recv_j_)));
  }

  // One slot: a reduce step's receive is posted only once the previous one
  // has arrived and been reduced, and a peer's messages arrive one after
  // another anyway. It keeps the staging chunk hot in cache (a 1 MiB working
  // set of two slots measured no faster over TCP).
  static constexpr int kSlots = 1;

 private:
  size_t chunks(size_t j) const {
    size_t len = r_.seg_len[r_.steps[j].seg];
    return (len + chunk_ - 1) / chunk_;
  }
  size_t at(size_t j, size_t c) const { return base_[j] + c; }
  size_t off(size_t j, size_t c) const { return r_.seg_off[r_.steps[j].seg] + c * chunk_; }
  size_t len(size_t j, size_t c) const {
    return std::min(chunk_, r_.seg_len[r_.steps[j].seg] - c * chunk_);
  }

  const uint8_t* send_source(size_t j, size_t c) const {
    switch (r_.steps[j].prim) {
      case Prim::send:
        return r_.first_send + off(j, c);
      case Prim::recv_reduce_send:
        return r_.partials + off(j, c);
      case Prim::recv_reduce_copy_send:
        return r_.final_base + c * chunk_;
      default:
        return r_.out + off(j, c);
    }
  }

  bool send_ready(size_t j, size_t c) const { return j == 0 || recv_done_[at(j, c)]; }

  bool recv_ready(size_t j, size_t c) const {
    if (reduces(r_.steps[j].prim)) return !free_slots_.empty();
    int w = r_.steps[j].after_send_of;
    return w < 0 || send_done_[at(static_cast<size_t>(w), c)];
  }

  // Posts every send and receive whose turn has come and that can go.
  void pump() {
    Transport& t = c_.transport;
    const size_t steps = r_.steps.size();
    while (send_j_ < steps) {
      if (!forwards(r_.steps[send_j_].prim) || send_c_ >= chunks(send_j_)) {
        ++send_j_;
        send_c_ = 0;
        continue;
      }
      if (!send_ready(send_j_, send_c_)) break;
      size_t j = send_j_, c = send_c_++;
      t.post_send(c_.desc, right_, send_source(j, c), len(j, c), [this, j, c] {
        send_done_[at(j, c)] = 1;
        pump();
      });
    }
    while (recv_j_ < steps) {
      if (!receives(r_.steps[recv_j_].prim) || recv_c_ >= chunks(recv_j_)) {
        ++recv_j_;
        recv_c_ = 0;
        continue;
      }
      if (!recv_ready(recv_j_, recv_c_)) break;
      size_t j = recv_j_, c = recv_c_++;
      uint8_t* dst = r_.out + off(j, c);
      if (reduces(r_.steps[j].prim)) {
        int s = free_slots_.back();
        free_slots_.pop_back();
        slot_of_[at(j, c)] = s;
        dst = staging_ + static_cast<size_t>(s) * chunk_;
      }
      t.post_recv(c_.desc, left_, dst, len(j, c), [this, j, c] { arrived(j, c); });
    }
  }

  void arrived(size_t j, size_t c) {
    const Prim p = r_.steps[j].prim;
    if (reduces(p)) {
      int s = slot_of_[at(j, c)];
      const uint8_t* got = staging_ + static_cast<size_t>(s) * chunk_;
      const bool final = p != Prim::recv_reduce_send;
      uint8_t* dst = final ? r_.final_base + c * chunk_ : r_.partials + off(j, c);
      const size_t es = dtype_size(r_.dtype), n = len(j, c) / es;
      if (r_.seen)
        kernels::reduce_searching(r_.dtype, r_.op, dst, r_.in + off(j, c), got, n,
                                  final ? r_.divisor : 0, *r_.seen, off(j, c) / es, r_.me,
                                  j == 1 ? r_.left : -1);
      else
        kernels::reduce(r_.dtype, r_.op, dst, r_.in + off(j, c), got, n, final ? r_.divisor : 0);
      free_slots_.push_back(s);
    }
    recv_done_[at(j, c)] = 1;
    pump();
  }

  const Ctx& c_;
  const Ring& r_;
  const size_t chunk_;
  const int right_, left_;
  std::vector<size_t> base_;  // step j's chunks are [base_[j], base_[j + 1])
  std::vector<uint8_t> recv_done_, send_done_;
  std::vector<int> slot_of_;
  std::vector<int> free_slots_;
  uint8_t* staging_ = nullptr;
  size_t send_j_ = 0, send_c_ = 0, recv_j_ = 0, recv_c_ = 0;
};

// Splits `count` elements into n segments that differ by at most one.
void split_even(size_t count, int n, size_t esize, std::vector<size_t>& off,
                std::vector<size_t>& len) {
  off.resize(n);
  len.resize(n);
  size_t q = count / n, rem = count % n;
  size_t at = 0;
  for (int k = 0; k < n; ++k) {
    size_t l = q + (static_cast<size_t>(k) < rem ? 1 : 0);
    off[k] = at * esize;
    len[k] = l * esize;
    at += l;
  }
}

size_t chunk_for(size_t chunk_bytes, size_t esize) {
  return std::max<size_t>(esize, chunk_bytes / esize * esize);
}

}  // namespace

void ring_allreduce(const Ctx& c, const void* in, void* out, size_t count, DType t, ReduceOp op,
                    kernels::NonFiniteSeen* seen) {
  const int k = c.transport.size(), r = c.transport.rank();
  const size_t es = dtype_size(t), chunk = chunk_for(c.chunk_bytes, es);
  if (k == 1) {
    if (seen) seen->search(r, t, in, 0, count);
    if (op == ReduceOp::avg)
      kernels::divide(t, out, in, count, 1);
    else if (out != in)
      std::memmove(out, in, count * es);
    return;
  }
  Ring ring;
  split_even(count, k, es, ring.seg_off, ring.seg_len);
  auto seg = [k](int s) { return mod(s, k); };
  // Rank r of k; segment s is completed by rank s and starts at rank s + 1.
  ring.steps.push_back({Prim::send, seg(r - 1)});
  for (int j = 1; j <= k - 2; ++j) ring.steps.push_back({Prim::recv_reduce_send, seg(r - 1 - j)});
  ring.steps.push_back({Prim::recv_reduce_copy_send, seg(r)});
  for (int j = k; j <= 2 * k - 3; ++j)
    ring.steps.push_back({Prim::recv_copy_send, seg(r - 1 - j), j - k});
  ring.steps.push_back({Prim::recv, seg(r + 1), k - 2});
  ring.in = ring.first_send = static_cast<const uint8_t*>(in);
  // The output is free until the complete segments arrive in it, so the
  // partial sums are formed there: out of place needs no copy of the input.
  ring.partials = ring.out = static_cast<uint8_t*>(out);
  ring.final_base = ring.out + ring.seg_off[r];
  ring.dtype = t;
  ring.op = op;
  ring.divisor = op == ReduceOp::avg ? k : 0;
  ring.seen = seen;
  ring.me = r;
  ring.left = mod(r - 1, k);
  RingPipeline p(c, ring, chunk);
  p.run(c.scratch.get(RingPipeline::kSlots * chunk));
}

void ring_reduce_scatter(const Ctx& c, const void* in, void* out, size_t count, DType t,
                         ReduceOp op) {
  const int k = c.transport.size(), r = c.transport.rank();
  const size_t es = dtype_size(t), block = count * es;
  auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  if (k == 1) {
    if (op == ReduceOp::avg)
      kernels::divide(t, dst, src, count, 1);
    else if (dst != src)
      std::memmove(dst, src, block);
    return;
  }
  const size_t chunk = chunk_for(c.chunk_bytes, es);
  Ring ring;
  ring.seg_off.resize(k);
  ring.seg_len.assign(k, block);
  for (int s = 0; s < k; ++s) ring.seg_off[s] = s * block;
  auto seg = [k](int s) { return mod(s, k); };
  ring.steps.push_back({Prim::send, seg(r - 1)});
  for (int j = 1; j <= k - 2; ++j) ring.steps.push_back({Prim::recv_reduce_send, seg(r - 1 - j)});
  ring.steps.push_back({Prim::recv_reduce_copy, seg(r)});
  // Partial sums travel through a workspace laid out like the input (the
  // input itself is left untouched); the last step writes the output.
  uint8_t* mem = c.scratch.get(k * block + RingPipeline::kSlots * chunk);
  ring.in = ring.first_send = src;
  ring.partials = mem;
  ring.out = mem;
  ring.final_base = dst;
  ring.dtype = t;
  ring.op = op;
  ring.divisor = op == ReduceOp::avg ? k : 0;
  RingPipeline p(c, ring, chunk);
  p.run(mem + k * block);
}

void ring_allgather(const Ctx& c, const void* in, void* out, size_t block_bytes) {
  const int k = c.transport.size(), r = c.transport.rank();
  auto* dst = static_cast<uint8_t*>(out);
  if (in != dst + r * block_bytes) std::memmove(dst + r * block_bytes, in, block_bytes);
  if (k == 1) return;
  Ring ring;
  ring.seg_off.resize(k);
  ring.seg_len.assign(k, block_bytes);
  for (int s = 0; s < k; ++s) ring.seg_off[s] = s * block_bytes;
  auto seg = [k](int s) { return mod(s, k); };
  ring.steps.push_back({Prim::send, r});
  for (int j = 1; j <= k - 2; ++j) ring.steps.push_back({Prim::recv_copy_send, seg(r - j)});
  ring.steps.push_back({Prim::recv, seg(r + 1)});
  ring.first_send = ring.out = dst;
  RingPipeline p(c, ring, std::max<size_t>(1, c.chunk_bytes));
  p.run(nullptr);
}

}  // namespace collie::algo
