// tests/fuzz/fuzz_frame.cc: the TCP transport's frame header
// (comm/tcp/frame.h), as a receiver meets it.
//
// Input: 32 bytes from which the receive the rank has posted is made (a
// header whose op, dtype and reduce op are taken modulo their ranges: the
// receiver's own operation is always a valid one; a kind of `elsewhere`
// expects that frame, any other a data frame), then the bytes that
// arrive on the connection: a header and what follows it (an abort frame's
// text). Contract: the header is taken as the expected frame exactly when it
// is the header the sender of that operation writes; an abort frame gives
// the peer's error with a valid code and its text; anything else is a
// mismatch or peer_lost error that names both ranks and, when it says the
// ranks called different operations or sent different step sizes, names
// two that differ.
#include <cstring>
#include <string>

#include "comm/tcp/frame.h"
#include "tests/fuzz/fuzz.h"

using namespace collie;
using namespace collie::tcp;

namespace {

const std::string kMe = "rank 5", kPeer = "rank 7";

FrameHeader header_at(const uint8_t* data, size_t size) {
  FrameHeader h{};
  std::memcpy(&h, data, std::min(size, sizeof h));
  return h;
}

// The text between `start` and `end` in `s` ("" when absent).
std::string between(const std::string& s, const std::string& start, const std::string& end) {
  size_t a = s.find(start);
  if (a == std::string::npos) return "";
  a += start.size();
  size_t b = s.find(end, a);
  return s.substr(a, b == std::string::npos ? std::string::npos : b - a);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const FrameHeader posted = header_at(data, size);
  OpDesc expected;
  expected.op = static_cast<OpKind>(1 + posted.op % 7);
  expected.dtype = static_cast<DType>(posted.dtype % kNumDTypes);
  expected.redop = static_cast<ReduceOp>(posted.redop % kNumReduceOps);
  expected.seq = posted.seq;
  expected.tag = posted.tag;
  expected.count = posted.count;
  const uint64_t bytes = posted.bytes;
  // A receive of a data frame, or of an elsewhere frame (its message goes
  // on another connection).
  const FrameKind kind = posted.kind == static_cast<uint8_t>(FrameKind::elsewhere)
                             ? FrameKind::elsewhere
                             : FrameKind::data;

  // What the sender of that operation writes reads back as the operation.
  const FrameHeader own = make_header(kind, expected, bytes);
  const OpDesc back = desc_of(own);
  FUZZ_CHECK(back.op == expected.op && back.dtype == expected.dtype &&
                 back.redop == expected.redop && back.seq == expected.seq &&
                 back.tag == expected.tag && back.count == expected.count,
             "desc_of(make_header(d)) is not d: " + back.describe());

  const uint8_t* stream = data + std::min(size, sizeof(FrameHeader));
  const size_t stream_size = size - std::min(size, sizeof(FrameHeader));
  const FrameHeader h = header_at(stream, stream_size);
  const bool same = std::memcmp(&h, &own, sizeof h) == 0;

  FrameCheck verdict{};
  bool ok = fuzz::accepted(
      [&] {
        try {
          verdict = check_frame(h, expected, bytes, kMe, kPeer, kind);
        } catch (const Error& e) {
          std::string m = e.what();
          FUZZ_CHECK(m.find(kMe) != std::string::npos && m.find(kPeer) != std::string::npos,
                     "the error does not name both ranks: " + m);
          if (m.find(", which called ") != std::string::npos) {
            std::string theirs = between(m, ", which called ", ": every rank");
            FUZZ_CHECK(theirs != expected.describe(),
                       "a mismatch that names the same operation twice: " + m);
          }
          for (const char* what : {" sent a step of ", " sent a message of "})
            if (m.find(what) != std::string::npos)
              FUZZ_CHECK(between(m, what, " bytes") != std::to_string(bytes),
                         "a size mismatch that names the same size twice: " + m);
          throw;
        }
      },
      {ErrorCode::mismatch, ErrorCode::peer_lost});
  FUZZ_CHECK(!ok || same == (verdict == FrameCheck::expected),
             same ? "the sender's own header was not taken as the expected frame"
                  : "a header other than the sender's was taken as the expected frame");
  FUZZ_CHECK(ok || !same, "the sender's own header was refused");
  if (!ok || verdict != FrameCheck::abort) return 0;

  FUZZ_CHECK(h.magic == kFrameMagic && h.kind == static_cast<uint8_t>(FrameKind::abort),
             "a header that is not an abort frame was taken as one");
  // The text as the mesh reads it: the claimed length, at most kMaxAbortText.
  const uint8_t* text_at = stream + std::min(stream_size, sizeof(FrameHeader));
  const size_t have = stream_size - std::min(stream_size, sizeof(FrameHeader));
  const size_t want = static_cast<size_t>(std::min<uint64_t>(h.bytes, kMaxAbortText));
  std::string text = have >= want ? std::string(reinterpret_cast<const char*>(text_at), want)
                                  : "(its message was cut off)";
  Error e = abort_error(h, kPeer, text);
  const int code = static_cast<int>(e.code());
  FUZZ_CHECK(code >= 1 && code <= kNumErrorCodes, "an abort with an unknown error code");
  FUZZ_CHECK(std::string(e.what()).find(kPeer) == 0, "the abort does not name the peer first");
  // (Up to a NUL byte: what() is a C string. Ranks send e.what(), which has none.)
  FUZZ_CHECK(std::string(e.what()).find(text.substr(0, text.find('\0'))) != std::string::npos,
             "the abort lost the peer's text");
  return 0;
}
