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

std::string last_frame(FrameKind kind, uint8_t code, const std::string& text) {
  FrameHeader h{};
  h.magic = kFrameMagic;
  h.kind = static_cast<uint8_t>(kind);
  h.redop = code;
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

FrameCheck check_frame(const FrameHeader& h, const OpDesc& expected, uint64_t bytes,
                       const std::string& me, const std::string& peer) {
  FrameHeader expect = make_header(FrameKind::data, expected, bytes);
  if (std::memcmp(&h, &expect, sizeof h) == 0) return FrameCheck::expected;
  if (h.magic == kFrameMagic && h.kind == expect.kind &&
      desc_of(h).describe() == expected.describe())
    throw Error(ErrorCode::mismatch,
                expected.describe() + " on " + me + ": " + peer + " sent a step of " +
                    std::to_string(h.bytes) + " bytes where " + std::to_string(bytes) +
                    " were expected: the ranks use different COLLIE_* algorithm settings");
  if (h.magic != kFrameMagic)
    throw Error(ErrorCode::mismatch, expected.describe() + " on " + me + ": the connection from " +
                                         peer +
                                         " carried bytes that are not a collie frame "
                                         "(different collie versions, or a corrupted stream)");
  if (h.kind == static_cast<uint8_t>(FrameKind::abort)) return FrameCheck::abort;
  if (h.kind == static_cast<uint8_t>(FrameKind::bye))
    throw Error(ErrorCode::peer_lost, expected.describe() + " on " + me + ": " + peer +
                                          " has already destroyed its communicator (or exited)");
  OpDesc theirs = desc_of(h);
  throw Error(ErrorCode::mismatch, expected.describe() + " on " + me + " does not match " + peer +
                                       ", which called " + theirs.describe() +
                                       ": every rank must issue the same collectives in the same "
                                       "order with the same counts, dtypes and ops");
}

Error abort_error(const FrameHeader& h, const std::string& peer, const std::string& text) {
  return Error(code_of(h.redop), peer + " aborted the communicator: " + text);
}

}  // namespace collie::tcp
