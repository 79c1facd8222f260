#include "comm/tcp/frame.h"

#include <cstring>

namespace collie::tcp {

FrameHeader make_header(FrameKind kind, const OpDesc& d, uint64_t bytes) {
  FrameHeader h{};
  h.magic = kFrameMagic;
  h.kind = static_cast<uint8_t>(kind);
  h.op = static_cast<uint8_t>(d.op);
  h.dtype = static_cast<uint8_t>(d.dtype);
  h.redop = static_cast<uint8_t>(d.redop);
  h.seq = d.seq;
  h.tag = d.tag;
  h.count = d.count;
  h.bytes = bytes;
  return h;
}

std::string last_frame(FrameKind kind, uint8_t code, const std::string& text, const OpDesc* op) {
  FrameHeader h{};
  h.magic = kFrameMagic;
  h.kind = static_cast<uint8_t>(kind);
  h.redop = code;
  if (op) {
    h.op = static_cast<uint8_t>(op->op);
    h.seq = op->seq;
  }
  h.bytes = text.size();
  std::string frame(reinterpret_cast<const char*>(&h), sizeof h);
  frame += text;
  return frame;
}

OpDesc desc_of(const FrameHeader& h) {
  OpDesc d;
  d.op = static_cast<OpKind>(h.op);
  d.dtype = static_cast<DType>(h.dtype < kNumDTypes ? h.dtype : 0);
  d.redop = static_cast<ReduceOp>(h.redop < kNumReduceOps ? h.redop : 0);
  d.seq = h.seq;
  d.tag = h.tag;
  d.count = h.count;
  return d;
}

ErrorCode code_of(uint8_t v) {
  if (v >= 1 && v <= kNumErrorCodes) return static_cast<ErrorCode>(v);
  return ErrorCode::internal;
}

namespace {

// Whether a data frame's fields are ones a collie rank writes: a known op,
// dtype and reduce op.
bool known_fields(const FrameHeader& h) {
  return known_op(h.op) && h.dtype < kNumDTypes && h.redop < kNumReduceOps;
}

}  // namespace

FrameCheck check_frame(const FrameHeader& h, const OpDesc& expected, uint64_t bytes,
                       const std::string& me, const std::string& peer, FrameKind kind) {
  FrameHeader expect = make_header(kind, expected, bytes);
  if (std::memcmp(&h, &expect, sizeof h) == 0) return FrameCheck::expected;
  // The same step of the same operation, of another length (here, or
  // announced as going on another connection): the ranks cut the operation
  // into steps differently.
  for (FrameKind k : {FrameKind::data, FrameKind::elsewhere}) {
    FrameHeader same_step = make_header(k, expected, h.bytes);
    if (h.bytes == bytes || std::memcmp(&h, &same_step, sizeof h) != 0) continue;
    if (expected.op == OpKind::p2p)
      throw Error(ErrorCode::mismatch,
                  expected.describe() + " on " + me + ": " + peer + " sent a message of " +
                      std::to_string(h.bytes) + " bytes where this rank receives " +
                      std::to_string(bytes) + ": a send and its receive must have the same size");
    throw Error(ErrorCode::mismatch,
                expected.describe() + " on " + me + ": " + peer + " sent a step of " +
                    std::to_string(h.bytes) + " bytes where " + std::to_string(bytes) +
                    " were expected: the ranks use different COLLIE_* algorithm settings");
  }
  const Error not_a_frame(ErrorCode::mismatch,
                          expected.describe() + " on " + me + ": the connection from " + peer +
                              " carried bytes that are not a collie frame (different collie "
                              "versions, or a corrupted stream)");
  if (h.magic != kFrameMagic) throw not_a_frame;
  if (h.kind == static_cast<uint8_t>(FrameKind::abort)) return FrameCheck::abort;
  if (h.kind == static_cast<uint8_t>(FrameKind::bye))
    throw Error(ErrorCode::peer_lost, expected.describe() + " on " + me + ": " + peer +
                                          " has already destroyed its communicator (or exited)");
  if ((h.kind != static_cast<uint8_t>(FrameKind::data) &&
       h.kind != static_cast<uint8_t>(FrameKind::elsewhere)) ||
      !known_fields(h))
    throw not_a_frame;
  OpDesc theirs = desc_of(h);
  // Another operation, as its description shows. A header that describes
  // the same one and still differs (a reduce op on a broadcast, a tag on an
  // all-reduce) is none that a rank writes: naming "the same" operation
  // twice would say nothing.
  if (theirs.describe() == expected.describe()) throw not_a_frame;
  throw collective_mismatch(expected.describe() + " on " + me, peer, theirs);
}

Error abort_error(const FrameHeader& h, const std::string& peer, const std::string& text) {
  return Error(code_of(h.redop), peer + " aborted the communicator: " + text);
}

}  // namespace collie::tcp
