// comm/tcp/frame.h: the TCP transport's wire frame, and what a receiver
// makes of a header that arrives (comm/tcp/tcp_mesh.cc moves the bytes).
//
// Every message is a frame: a 32-byte header (what op, which step of the op
// sequence, dtype, reduce op, tag or root, count, payload length) and a
// payload. An abort frame carries an error's code and text to the peers; a
// bye frame says a peer left cleanly. An elsewhere frame has no payload: it
// says that a message of `bytes` goes on another connection to this peer
// (comm/tcp/tcp_mesh.h: one connection per direction), so that a receiver
// that expects another size, and reads the connection where its own size
// would go, still meets a frame that does not match. The checks live here, apart from the
// sockets, so that they can be run on any bytes (tests/fuzz/fuzz_frame.cc).
#pragma once

#include <cstdint>
#include <string>

#include "base/op.h"
#include "collie/error.h"

namespace collie::tcp {

constexpr uint32_t kFrameMagic = 0x434c4c31;  // "CLL1"
// An abort frame's text is cut to this; a longer claimed length is not read.
constexpr size_t kMaxAbortText = 4096;

enum class FrameKind : uint8_t { data = 1, abort = 2, bye = 3, elsewhere = 4 };

struct FrameHeader {
  uint32_t magic;
  uint8_t kind;
  uint8_t op;
  uint8_t dtype;
  uint8_t redop;  // for abort frames: the ErrorCode
  uint32_t seq;
  int32_t tag;
  uint64_t count;
  uint64_t bytes;
};
static_assert(sizeof(FrameHeader) == 32);

// Whether `op` names an operation kind a collie rank writes in a header.
inline bool known_op(uint8_t op) {
  return op >= static_cast<uint8_t>(OpKind::allreduce) && op <= static_cast<uint8_t>(kLastOpKind);
}

// The header of a frame of `kind` for `d` with `bytes` of payload.
FrameHeader make_header(FrameKind kind, const OpDesc& d, uint64_t bytes);
// An abort (`code`: the ErrorCode) or bye frame, header and text, as a rank
// sends it last. An abort of a running op carries that op's kind and number
// (`op`, `seq`; 0 otherwise), so that a peer still in an earlier collective
// can tell that this one is later (Mesh::watched_hangup).
std::string last_frame(FrameKind kind, uint8_t code, const std::string& text,
                       const OpDesc* op = nullptr);
// The operation a header describes (an out-of-range dtype or op reads as 0).
OpDesc desc_of(const FrameHeader& h);
// An abort frame's error code (an unknown one reads as internal).
ErrorCode code_of(uint8_t v);

// What a receiver does with a header that arrived where the frame of `kind`
// (data, or elsewhere) of `expected` with `bytes` was due.
enum class FrameCheck {
  expected,  // it is that frame: read the payload
  abort,     // the peer's abort frame: read its text (h.bytes, at most
             // kMaxAbortText) and throw abort_error
};
// Returns what the header is, or throws the error it means: mismatch (bytes
// that are not a collie frame, or another operation than `expected`, naming
// both) or peer_lost (the peer said bye). `me` and `peer` name the two ranks
// in messages ("rank 0").
FrameCheck check_frame(const FrameHeader& h, const OpDesc& expected, uint64_t bytes,
                       const std::string& me, const std::string& peer,
                       FrameKind kind = FrameKind::data);
// The error an abort frame from `peer` with `text` carries.
Error abort_error(const FrameHeader& h, const std::string& peer, const std::string& text);

}  // namespace collie::tcp
