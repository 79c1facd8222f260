// comm/launch/rank_output.cc: passing a rank's output on, line by line.
#include "comm/launch/rank_output.h"

#include <unistd.h>

#include <cerrno>
#include <string_view>

#include "comm/launch/process.h"

namespace collie::launch {

namespace {

constexpr size_t kMaxLine = 64 * 1024;  // longer lines are cut, not buffered forever

// Writes the whole lines of `s.pending` (and, at `eof` or past kMaxLine,
// the rest): to the stream's destination with the rank's prefix, to the
// summary's tail, to the rank's log file.
void emit(Rank& r, Stream& s, bool eof) {
  std::string text, raw;
  auto line = [&](std::string_view l) {
    text.append(r.prefix).append(l).push_back('\n');
    raw.append(l).push_back('\n');
    r.tail.emplace_back(std::string(r.prefix).append(l));
    if (r.tail.size() > kTailLines) r.tail.pop_front();
  };
  std::string_view pending(s.pending);
  size_t start = 0;
  for (size_t nl; (nl = pending.find('\n', start)) != std::string_view::npos; start = nl + 1)
    line(pending.substr(start, nl - start));
  if (start < pending.size() && (eof || pending.size() - start > kMaxLine)) {
    line(pending.substr(start));
    start = pending.size();
  }
  s.pending.erase(0, start);
  if (!text.empty()) write_all(s.to, text);
  if (!raw.empty() && r.log_fd >= 0) write_all(r.log_fd, raw);
}

}  // namespace

void relay(Rank& r, Stream& s) {
  char chunk[65536];
  ssize_t n = read(s.fd, chunk, sizeof chunk);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n <= 0) {
    finish(r, s);
    return;
  }
  s.pending.append(chunk, static_cast<size_t>(n));
  emit(r, s, false);
}

void finish(Rank& r, Stream& s) {
  if (s.fd < 0) return;
  emit(r, s, true);
  close(s.fd);
  s.fd = -1;
}

}  // namespace collie::launch
