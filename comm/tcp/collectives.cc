#include "comm/tcp/collectives.h"

#include <algorithm>
#include <cstring>
#include <functional>

#include "comm/core/reduce.h"

namespace collie::tcp {

namespace {

int mod(int a, int n) {
  return ((a % n) + n) % n;
}

// A ring pass: `steps` steps; at step t every rank sends segment
// send_seg(t) to its right neighbour and receives segment send_seg(t) - 1
// from its left one, which is what it sends on at step t + 1.
// Segments are cut into chunks, and chunk k of step t + 1 leaves as soon as
// chunk k of step t has arrived (and been reduced): that pipelining is what
// lets the wire, the reduction and the other direction all run at once.
struct RingPass {
  int steps = 0;
  std::vector<size_t> seg_off, seg_len;  // bytes
  std::function<int(int t)> send_seg;
  std::function<const uint8_t*(int t)> send_base;  // buffer the segment is sent from
  std::function<uint8_t*(int t)> recv_base;        // buffer it lands in (at seg_off)
  // Called when a chunk of step t has arrived: bytes [off, off + n) of the
  // segment. null: nothing to do (it landed where it belongs).
  std::function<void(int t, size_t off, size_t n)> on_chunk;
  // Steps whose chunks land in `staging` (to be reduced) instead.
  std::function<bool(int t)> staged;
  uint8_t* staging = nullptr;
};

void run_ring(const Ctx& c, const RingPass& p, size_t chunk) {
  Mesh& m = c.mesh;
  int n = m.size(), r = m.rank();
  int right = mod(r + 1, n), left = mod(r - 1, n);
  auto chunks_of = [&](int seg) { return (p.seg_len[seg] + chunk - 1) / chunk; };

  std::vector<size_t> base(static_cast<size_t>(p.steps) + 1, 0);
  for (int t = 0; t < p.steps; ++t) base[t + 1] = base[t] + chunks_of(p.send_seg(t));
  std::vector<SendItem> sends;
  std::vector<RecvItem> recvs;
  sends.reserve(base[p.steps]);
  recvs.reserve(base[p.steps]);
  for (int t = 0; t < p.steps; ++t) {
    int seg = p.send_seg(t);
    const uint8_t* src = p.send_base(t) + p.seg_off[seg];
    for (size_t k = 0; k < chunks_of(seg); ++k) {
      size_t off = k * chunk, len = std::min(chunk, p.seg_len[seg] - off);
      sends.push_back({right, src + off, len, t == 0});
    }
  }
  for (int t = 0; t < p.steps; ++t) {
    // What arrives at step t is what the left neighbour sent at step t: one
    // segment further round the ring than this rank's own send.
    int seg = mod(p.send_seg(t) - 1, n);
    bool staged = p.staged && p.staged(t);
    uint8_t* dst = p.recv_base(t) + p.seg_off[seg];
    for (size_t k = 0; k < chunks_of(seg); ++k) {
      size_t off = k * chunk, len = std::min(chunk, p.seg_len[seg] - off);
      size_t release = t + 1 < p.steps ? base[t + 1] + k : SIZE_MAX;
      RecvItem item{left, staged ? p.staging : dst + off, len, nullptr};
      item.on_done = [&sends, &p, t, off, len, release] {
        if (p.on_chunk) p.on_chunk(t, off, len);
        if (release != SIZE_MAX) sends[release].ready = true;
      };
      recvs.push_back(std::move(item));
    }
  }
  m.run(c.desc, sends, recvs, c.deadline);
}

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

void ring_allreduce(const Ctx& c, const void* in, void* out, size_t count, DType t, ReduceOp op) {
  int n = c.mesh.size(), r = c.mesh.rank();
  size_t es = dtype_size(t);
  size_t chunk = chunk_for(c.chunk_bytes, es);
  auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  uint8_t* staging = c.scratch.get(chunk);

  RingPass p;
  p.steps = 2 * (n - 1);
  split_even(count, n, es, p.seg_off, p.seg_len);
  // Reduce-scatter steps 0..n-2 leave rank r with segment r complete; the
  // all-gather steps n-1..2n-3 pass the complete segments round. Step 0
  // sends straight from the input, so out-of-place needs no copy.
  p.send_seg = [=](int s) { return s < n - 1 ? mod(r - s - 1, n) : mod(r - (s - (n - 1)), n); };
  p.send_base = [=](int s) { return s == 0 ? src : dst; };
  p.recv_base = [=](int) { return dst; };
  // Reduce-scatter chunks land in the staging buffer and are combined with
  // this rank's input into the output (avg divides in the same pass, on the
  // last step); all-gather chunks are final and land in the output.
  p.staging = staging;
  p.staged = [=](int s) { return s < n - 1; };
  p.on_chunk = [=, &p](int s, size_t off, size_t len) {
    if (s >= n - 1) return;
    size_t at = p.seg_off[mod(p.send_seg(s) - 1, n)] + off;
    int divisor = (op == ReduceOp::avg && s == n - 2) ? n : 0;
    kernels::reduce(t, op, dst + at, src + at, staging, len / es, divisor);
  };
  run_ring(c, p, chunk);
}

void rd_allreduce(const Ctx& c, const void* in, void* out, size_t count, DType t, ReduceOp op) {
  Mesh& m = c.mesh;
  int n = m.size(), r = m.rank();
  size_t bytes = count * dtype_size(t);
  int p = 1;
  while (p * 2 <= n) p *= 2;
  int extra = n - p;
  uint8_t* tmp = c.scratch.get(bytes);
  auto exchange = [&](int peer, const void* send_buf, void* recv_buf) {
    std::vector<SendItem> s;
    std::vector<RecvItem> rv;
    if (send_buf) s.push_back({peer, send_buf, bytes, true});
    if (recv_buf) rv.push_back({peer, recv_buf, bytes, nullptr});
    m.run(c.desc, s, rv, c.deadline);
  };
  if (r >= p) {
    // Fold in: hand this rank's data to its partner below p, get the result.
    exchange(r - p, in, nullptr);
    exchange(r - p, nullptr, out);
    return;
  }
  if (r < extra) {
    exchange(r + p, nullptr, tmp);
    kernels::reduce(t, op == ReduceOp::avg ? ReduceOp::sum : op, out, in, tmp, count);
  } else if (out != in) {
    std::memcpy(out, in, bytes);
  }
  for (int k = 1; k < p; k <<= 1) {
    // Both partners compute a op b on the same two operands; the ops are
    // commutative, so every rank ends with bit-identical results.
    exchange(r ^ k, out, tmp);
    int divisor = (op == ReduceOp::avg && k * 2 == p) ? n : 0;
    kernels::reduce(t, op, out, out, tmp, count, divisor);
  }
  if (op == ReduceOp::avg && p == 1) kernels::divide(t, out, out, count, n);
  if (r < extra) exchange(r + p, out, nullptr);
}

void chain_broadcast(const Ctx& c, void* buf, size_t bytes, int root) {
  Mesh& m = c.mesh;
  int n = m.size();
  int v = mod(m.rank() - root, n);
  int prev = mod(m.rank() - 1, n), next = mod(m.rank() + 1, n);
  size_t chunk = std::max<size_t>(1, c.chunk_bytes);
  size_t nchunks = (bytes + chunk - 1) / chunk;
  auto* b = static_cast<uint8_t*>(buf);
  std::vector<SendItem> sends;
  std::vector<RecvItem> recvs;
  if (v < n - 1)
    for (size_t k = 0; k < nchunks; ++k)
      sends.push_back({next, b + k * chunk, std::min(chunk, bytes - k * chunk), v == 0});
  if (v > 0)
    for (size_t k = 0; k < nchunks; ++k) {
      RecvItem item{prev, b + k * chunk, std::min(chunk, bytes - k * chunk), nullptr};
      if (v < n - 1) item.on_done = [&sends, k] { sends[k].ready = true; };
      recvs.push_back(std::move(item));
    }
  m.run(c.desc, sends, recvs, c.deadline);
}

void tree_broadcast(const Ctx& c, void* buf, size_t bytes, int root) {
  Mesh& m = c.mesh;
  int n = m.size();
  int v = mod(m.rank() - root, n);
  auto actual = [&](int rel) { return mod(rel + root, n); };
  std::vector<SendItem> sends;
  std::vector<RecvItem> recvs;
  int mask = 1;
  while (mask < n) {
    if (v & mask) {
      recvs.push_back({actual(v - mask), buf, bytes, nullptr});
      break;
    }
    mask <<= 1;
  }
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (v + mask < n) sends.push_back({actual(v + mask), buf, bytes, v == 0});
  if (!recvs.empty())
    recvs[0].on_done = [&sends] {
      for (auto& s : sends) s.ready = true;
    };
  m.run(c.desc, sends, recvs, c.deadline);
}

void ring_allgather(const Ctx& c, const void* in, void* out, size_t block_bytes) {
  int n = c.mesh.size(), r = c.mesh.rank();
  auto* dst = static_cast<uint8_t*>(out);
  if (in != dst + r * block_bytes) std::memmove(dst + r * block_bytes, in, block_bytes);
  if (n == 1) return;
  RingPass p;
  p.steps = n - 1;
  p.seg_off.resize(n);
  p.seg_len.assign(n, block_bytes);
  for (int k = 0; k < n; ++k) p.seg_off[k] = k * block_bytes;
  p.send_seg = [=](int s) { return mod(r - s, n); };
  p.send_base = [=](int) { return static_cast<const uint8_t*>(dst); };
  p.recv_base = [=](int) { return dst; };
  run_ring(c, p, std::max<size_t>(1, c.chunk_bytes));
}

void ring_reduce_scatter(const Ctx& c, const void* in, void* out, size_t count, DType t,
                         ReduceOp op) {
  int n = c.mesh.size(), r = c.mesh.rank();
  size_t es = dtype_size(t), block = count * es;
  auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  if (n == 1) {
    if (op == ReduceOp::avg)
      kernels::divide(t, dst, src, count, 1);
    else if (dst != src)
      std::memmove(dst, src, block);
    return;
  }
  size_t chunk = chunk_for(c.chunk_bytes, es);
  // Partial sums travel through a workspace the size of the input (the
  // input itself is left untouched); the last step writes the output.
  uint8_t* ws = c.scratch.get(n * block + chunk);
  uint8_t* staging = ws + n * block;
  RingPass p;
  p.steps = n - 1;
  p.seg_off.resize(n);
  p.seg_len.assign(n, block);
  for (int k = 0; k < n; ++k) p.seg_off[k] = k * block;
  p.send_seg = [=](int s) { return mod(r - s - 1, n); };
  p.send_base = [=](int s) { return s == 0 ? src : ws; };
  p.recv_base = [=](int) { return ws; };
  p.staging = staging;
  p.staged = [](int) { return true; };
  p.on_chunk = [=](int s, size_t off, size_t len) {
    int seg = mod(r - s - 2, n);
    size_t at = seg * block + off;
    bool last = s == n - 2;
    int divisor = (op == ReduceOp::avg && last) ? n : 0;
    kernels::reduce(t, op, last ? dst + off : ws + at, src + at, staging, len / es, divisor);
  };
  run_ring(c, p, chunk);
}

void dissemination_barrier(const Ctx& c) {
  Mesh& m = c.mesh;
  int n = m.size(), r = m.rank();
  uint8_t token = 0, sink = 0;
  for (int k = 1; k < n; k <<= 1) {
    std::vector<SendItem> s{{mod(r + k, n), &token, 1, true}};
    std::vector<RecvItem> rv{{mod(r - k, n), &sink, 1, nullptr}};
    m.run(c.desc, s, rv, c.deadline);
  }
}

}  // namespace collie::tcp
