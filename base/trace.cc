#include "base/trace.h"

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>

#include "base/log.h"

namespace collie::trace {

namespace {

constexpr size_t kWriteBytes = 64 << 10;
constexpr Nanos kWriteEvery = 100'000'000;  // 100 ms
constexpr std::string_view kClose = "\n]\n";

// Bumped in a forked child: the parent's sinks are not the child's to write.
std::atomic<unsigned> fork_generation{0};

// Printable ASCII other than '"' and '\\': appended as it is, in runs
// (a character at a time was a seventh of the cost of tracing an op).
bool plain(unsigned char c) {
  return c >= 0x20 && c < 0x80 && c != '"' && c != '\\';
}

void quote(std::string& out, std::string_view s) {
  out += '"';
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (plain(c)) {
      size_t j = i + 1;
      while (j < s.size() && plain(static_cast<unsigned char>(s[j]))) ++j;
      out.append(s.substr(i, j - i));
      i = j - 1;
    } else if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char u[8];
      std::snprintf(u, sizeof u, "\\u%04x", c);
      out += u;
    } else {
      // UTF-8 passes as it is; a byte that does not start a whole sequence
      // (a peer's garbled message) becomes U+FFFD, so the file stays JSON.
      const size_t len = c >= 0xF0 && c < 0xF5 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 && c < 0xE0 ? 2 : 0;
      bool whole = len > 0 && i + len <= s.size();
      for (size_t k = 1; whole && k < len; ++k)
        whole = (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80;
      if (whole) {
        out.append(s.substr(i, len));
        i += len - 1;
      } else {
        out += "\\ufffd";
      }
    }
  }
  out += '"';
}

template <class Int>
void append_int(std::string& out, Int v, int base = 10) {
  char b[24];
  out.append(b, std::to_chars(b, b + sizeof b, v, base).ptr);
}

// Microseconds to the nanosecond, "123.045" (snprintf's %03 took glibc's
// slow path: a third of the cost of tracing an op).
void append_us(std::string& out, Nanos t) {
  if (t < 0) out += '-';
  const uint64_t a = t < 0 ? static_cast<uint64_t>(-t) : static_cast<uint64_t>(t);
  append_int(out, a / 1000);
  const auto f = static_cast<unsigned>(a % 1000);
  const char frac[4] = {'.', static_cast<char>('0' + f / 100), static_cast<char>('0' + f / 10 % 10),
                        static_cast<char>('0' + f % 10)};
  out.append(frac, 4);
}

// {"ph":..,"pid":..,"tid":..,"name":..: the start every event shares.
std::string head(char ph, int pid, int tid, std::string_view name) {
  std::string e;
  e.reserve(384);  // an operation's run event, without a reallocation
  e += "{\"ph\":\"";
  e += ph;
  e += "\",\"pid\":";
  append_int(e, pid);
  e += ",\"tid\":";
  append_int(e, tid);
  e += ",\"name\":";
  quote(e, name);
  return e;
}

std::string with_ts(std::string e, Nanos ts) {
  e += ",\"ts\":";
  append_us(e, ts);
  return e;
}

void append_id(std::string& out, uint64_t id) {
  out += ",\"id\":\"0x";
  append_int(out, id, 16);
  out += '"';
}

struct Registry {
  std::mutex mu;
  std::map<std::string, std::shared_ptr<Sink>> sinks;  // null: could not be opened
};

// Never destroyed: threads that outlive main() may still write, and the
// exit handler flushes through it.
Registry& registry() {
  static Registry* r = new Registry();
  return *r;
}

std::string host_name() {
  char h[256] = {0};
  gethostname(h, sizeof h - 1);
  return h;
}

}  // namespace

Nanos now() {
  return at(std::chrono::steady_clock::now());
}

Nanos at(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

std::string file_name(const std::string& spec, int rank) {
  const std::string r = std::to_string(rank);
  if (spec.find("%r") != std::string::npos) {
    std::string out;
    for (size_t i = 0; i < spec.size(); ++i) {
      if (spec.compare(i, 2, "%r") == 0) {
        out += r;
        ++i;
      } else {
        out += spec[i];
      }
    }
    return out;
  }
  std::string base = spec;
  if (base.size() > 5 && base.compare(base.size() - 5, 5, ".json") == 0)
    base.resize(base.size() - 5);
  return base + ".rank" + r + ".json";
}

// ---- Args ----------------------------------------------------------------

// Keys are collie's own literals ("seq", "bytes"): nothing to escape.
Args& Args::key(std::string_view k) {
  if (s_.empty())
    s_.reserve(320);  // an operation's args, without a reallocation
  else
    s_ += ',';
  s_ += '"';
  s_ += k;
  s_ += "\":";
  return *this;
}
Args& Args::add(std::string_view k, std::string_view v) {
  key(k);
  quote(s_, v);
  return *this;
}
Args& Args::add(std::string_view k, int64_t v) {
  key(k);
  append_int(s_, v);
  return *this;
}
Args& Args::add(std::string_view k, uint64_t v) {
  key(k);
  append_int(s_, v);
  return *this;
}
Args& Args::add(std::string_view k, double v) {
  key(k);
  char b[32];
  std::snprintf(b, sizeof b, "%.3f", v);
  s_ += b;
  return *this;
}
Args& Args::add(std::string_view k, bool v) {
  key(k);
  s_ += v ? "true" : "false";
  return *this;
}
Args& Args::add_us(std::string_view k, Nanos t) {
  key(k);
  append_us(s_, t);
  return *this;
}

// ---- Sink ----------------------------------------------------------------

std::shared_ptr<Sink> Sink::open(const std::string& spec, int rank, int world_size) {
  if (spec.empty()) return nullptr;
  static std::once_flag hooks;
  std::call_once(hooks, [] {
    std::atexit(flush_all);
    pthread_atfork(nullptr, nullptr,
                   [] { fork_generation.fetch_add(1, std::memory_order_relaxed); });
  });
  const std::string path = file_name(spec, rank);
  Registry& reg = registry();
  std::lock_guard lk(reg.mu);
  auto it = reg.sinks.find(path);
  if (it != reg.sinks.end() && (!it->second || it->second->fork_generation_ ==
                                                   fork_generation.load(std::memory_order_relaxed)))
    return it->second;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    const std::string who = "rank " + std::to_string(rank);
    log::warn("COLLIE_TRACE=" + spec + ": " + who + " cannot write its trace to '" + path +
              "': " + std::strerror(errno) + "; " + who +
              " runs without a trace (name a file in a directory that exists and is writable)");
    reg.sinks[path] = nullptr;
    return nullptr;
  }
  auto sink = std::make_shared<Sink>(fd, path, rank, world_size);
  reg.sinks[path] = sink;
  return sink;
}

void Sink::flush_all() {
  Registry& reg = registry();
  std::lock_guard lk(reg.mu);
  for (auto& [path, sink] : reg.sinks)
    if (sink) sink->flush();
}

Sink::Sink(int fd, std::string path, int rank, int world_size)
    : fd_(fd),
      path_(std::move(path)),
      rank_(rank),
      fork_generation_(fork_generation.load(std::memory_order_relaxed)),
      world_size_(world_size) {
  write(head('M', rank, 0, "process_name") +
        ",\"args\":" + Args().add("name", "rank " + std::to_string(rank)).json() + "}");
  write(head('M', rank, 0, "process_sort_index") +
        ",\"args\":" + Args().add("sort_index", rank).json() + "}");
  // One rank has no other clock to meet.
  if (world_size == 1) start_clock(0, 0, "one rank");
  flush();
}

void Sink::start_clock(Nanos offset, Nanos rtt, const std::string& how) {
  if (clock_started_.exchange(true, std::memory_order_acq_rel)) return;
  offset_.store(offset, std::memory_order_relaxed);
  // The wall clock at the same moment, for lining up files by hand where
  // the offset could not be measured.
  timespec wall{};
  clock_gettime(CLOCK_REALTIME, &wall);
  write(
      with_ts(head('i', rank_, 0, "trace start"), shift(now())) + ",\"s\":\"p\",\"args\":" +
      Args()
          .add("rank", rank_)
          .add("world_size", world_size_)
          .add("host", host_name())
          .add("os_pid", static_cast<int64_t>(getpid()))
          .add("clock", "CLOCK_MONOTONIC of rank 0")
          .add_us("clock_offset_us", offset)
          .add_us("clock_rtt_us", rtt)
          .add("clock_alignment", how)
          .add("unix_time_us", static_cast<int64_t>(wall.tv_sec) * 1'000'000 + wall.tv_nsec / 1000)
          .json() +
      "}");
  flush();
}

Sink::~Sink() {
  flush();
  ::close(fd_);
}

std::shared_ptr<Track> Sink::track(const std::string& name) {
  int tid;
  {
    std::lock_guard lk(mu_);
    tid = ++next_tid_;
  }
  write(head('M', rank_, tid, "thread_name") + ",\"args\":" + Args().add("name", name).json() +
        "}");
  write(head('M', rank_, tid, "thread_sort_index") +
        ",\"args\":" + Args().add("sort_index", tid).json() + "}");
  return std::make_shared<Track>(shared_from_this(), tid);
}

void Sink::write(const std::string& event) {
  if (muted_.load(std::memory_order_relaxed)) return;
  std::lock_guard lk(mu_);
  if (broken_ || fork_generation_ != fork_generation.load(std::memory_order_relaxed)) return;
  buf_ += ",\n";
  buf_ += event;
  const Nanos t = now();
  if (buf_.size() >= kWriteBytes || t - last_write_ >= kWriteEvery) flush_locked();
}

void Sink::flush() {
  std::lock_guard lk(mu_);
  if (fork_generation_ != fork_generation.load(std::memory_order_relaxed)) return;
  flush_locked();
}

void Sink::flush_locked() {
  last_write_ = now();
  if (broken_ || buf_.empty()) return;
  // The array's opening once; the closing bracket after every batch, where
  // the next batch starts.
  std::string data = first_ ? "[\n" + buf_.substr(2) : std::move(buf_);
  buf_.clear();
  data += kClose;
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::pwrite(fd_, data.data() + done, data.size() - done, at_ + done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      broken_ = true;
      log::warn("COLLIE_TRACE: rank " + std::to_string(rank_) + " could not write its trace to '" +
                path_ + "': " + std::strerror(n < 0 ? errno : EIO) +
                "; the file ends with what was written before");
      return;
    }
    done += static_cast<size_t>(n);
  }
  at_ += static_cast<int64_t>(data.size() - kClose.size());
  first_ = false;
}

// ---- Track ---------------------------------------------------------------

std::string Track::span_event(std::string_view name, Nanos begin, Nanos end,
                              const Args& args) const {
  std::string e = with_ts(head('X', sink_->rank(), tid_, name), sink_->shift(begin));
  e += ",\"dur\":";
  append_us(e, end > begin ? end - begin : 0);
  e += ",\"args\":{";
  e += args.body();
  e += "}}";
  return e;
}

std::string Track::async_event(char ph, std::string_view cat, std::string_view name, uint64_t id,
                               Nanos t, const Args& args) const {
  std::string e = with_ts(head(ph, sink_->rank(), tid_, name), sink_->shift(t));
  e += ",\"cat\":";
  quote(e, cat);
  append_id(e, id);
  e += ",\"args\":{";
  e += args.body();
  e += "}}";
  return e;
}

void Track::instant(std::string_view name, const Args& args, Nanos t) {
  sink_->write(with_ts(head('i', sink_->rank(), tid_, name), sink_->shift(t)) +
               ",\"s\":\"t\",\"args\":" + args.json() + "}");
}

void Track::span(std::string_view name, Nanos begin, Nanos end, const Args& args) {
  sink_->write(span_event(name, begin, end, args));
}

uint64_t Track::async_begin(std::string_view cat, std::string_view name, Nanos t,
                            const Args& args) {
  const uint64_t id = sink_->next_id();
  sink_->write(async_event('b', cat, name, id, t, args));
  return id;
}

void Track::async_end(std::string_view cat, std::string_view name, uint64_t id, Nanos t,
                      const Args& args) {
  sink_->write(async_event('e', cat, name, id, t, args));
}

Nanos Track::serial_start(Nanos start, Nanos end) {
  std::lock_guard lk(mu_);
  // Never past its own end: ops on one stream may be recorded out of order
  // (the one behind seen finished first), and a span pushed past its end
  // ended at the other op's end instead of its own (finished_us) in CI
  // (trace_nccl_fake_device under ASan). Recorded late, it is a point at
  // its end, inside or before the other's span: still no partial overlap.
  const Nanos s = std::min(std::max(start, last_end_), end);
  last_end_ = std::max(last_end_, end);
  return s;
}

// ---- operations ------------------------------------------------------------

OpSpan* issue(const std::shared_ptr<Track>& track, const Op& op) {
  auto* s = new OpSpan();
  s->track = track;
  s->desc = op.desc;
  s->peer = op.peer;
  s->is_send = op.is_send;
  s->issued = now();
  return s;
}

void refused(const std::shared_ptr<Track>& track, const Op& op, const Error& e) {
  end(issue(track, op), e);
}

void mark_started(OpSpan& s) {
  Nanos zero = 0;
  s.started.compare_exchange_strong(zero, now(), std::memory_order_relaxed);
}

void note_algorithm(OpSpan& s, const char* name) {
  const char* none = nullptr;
  s.algorithm.compare_exchange_strong(none, name, std::memory_order_relaxed);
}

void end(OpSpan* span, const std::optional<Error>& e) {
  const std::unique_ptr<OpSpan> owned(span);
  OpSpan& s = *span;
  Nanos zero = 0;
  s.finished.compare_exchange_strong(zero, now(), std::memory_order_relaxed);
  Track& t = *s.track;
  const OpDesc& d = s.desc;
  const Nanos fin = s.finished.load(std::memory_order_relaxed);
  Nanos st = s.started.load(std::memory_order_relaxed);
  if (st == 0 || st > fin) st = fin;  // never ran: it failed in the queue
  const bool p2p = d.op == OpKind::p2p;
  const std::string name = p2p ? (s.is_send ? "send" : "recv") : std::string(to_string(d.op));
  const bool barrier = d.op == OpKind::barrier;
  const uint64_t count = barrier ? 0 : d.count;

  Args a;
  a.add("op", name).add("seq", static_cast<uint64_t>(d.seq)).add("comm", t.comm);
  a.add("backend", t.backend);
  if (!barrier) a.add("dtype", to_string(d.dtype));
  a.add("count", count).add("bytes", count * (barrier ? 0 : dtype_size(d.dtype)));
  if (d.op == OpKind::allreduce || d.op == OpKind::reduce_scatter)
    a.add("redop", to_string(d.redop));
  if (d.op == OpKind::broadcast) a.add("root", static_cast<int64_t>(d.tag));
  if (p2p) a.add("peer", s.peer).add("tag", static_cast<int64_t>(d.tag));
  if (const char* algo = s.algorithm.load(std::memory_order_relaxed)) a.add("algorithm", algo);
  const Sink& sink = t.sink();
  a.add_us("issued_us", sink.shift(s.issued))
      .add_us("started_us", sink.shift(st))
      .add_us("finished_us", sink.shift(fin));
  a.add_us("queue_us", st - s.issued).add_us("run_us", fin - st);
  if (e) a.add("error", e->what());

  // Queue time: spans of one communicator overlap (a burst of issues), so
  // an async pair; run time: the communicator's row, in order. One write:
  // a file cut short by a crash has all of an operation's events or none.
  const std::string queued = name + " queued";
  const uint64_t id = t.sink().next_id();
  std::string events = t.async_event('b', "queue", queued, id, s.issued,
                                     Args().add("seq", static_cast<uint64_t>(d.seq))) +
                       ",\n" + t.async_event('e', "queue", queued, id, st, Args()) + ",\n";
  if (p2p) {
    // A batch of sends and receives runs together, ending in any order.
    const uint64_t run = t.sink().next_id();
    events += t.async_event('b', "p2p", name, run, st, a) + ",\n" +
              t.async_event('e', "p2p", name, run, fin, Args());
  } else {
    events += t.span_event(name, t.serial_start(st, fin), fin, a);
  }
  t.sink().write(events);
  // What led to a failure is on disk before whatever the failure leads to.
  if (e) t.sink().flush();
}

void end_with(Completion& c, OpSpan* s) {
  Completion* done = &c;  // alive: its callbacks run inside its finish()
  c.on_complete([done, s] { end(s, done->error()); });
}

}  // namespace collie::trace
