// base/trace.h: COLLIE_TRACE, a timeline of each rank in the Chrome
// trace event format (chrome://tracing, ui.perfetto.dev), as Horovod's
// timeline and PyTorch's profiler write them: every operation of every
// communicator (queued from issue to start, run from start to end, with its
// size, algorithm, backend and error) and the reducer's view of a step
// (backward start, each gradient ready, each bucket in flight, finalize's
// wait), so that overlap and stragglers can be seen.
//
// One file per rank (Sink), a JSON array of events: pid is the rank, each
// communicator and each reducer a thread of its own (Track). Timestamps are
// microseconds of rank 0's CLOCK_MONOTONIC: each rank's own clock plus the
// offset connect() measures against rank 0 over the first communicator
// (NTP's estimate from the fastest of a few round trips), so the files of
// ranks on different hosts line up as they are (a host's processes share
// one clock, and there the offset comes out near 0).
// Events collect in memory and are written in batches (every 64 KiB, or when
// an event comes 100 ms after the last write, on a failure, when a
// communicator is destroyed and at exit); each write ends the file with its
// closing bracket, which the next write overwrites, so the file is whole
// JSON after every write, also when the process is killed later.
//
// Off (COLLIE_TRACE unset), an operation carries no span, and every call
// on its path below is one test of a null pointer.
//
// A span is created by the front and freed by the one call that ends it
// (finished() clears the op's pointer as it does): a backend ends each op
// once, and copies of an op that another part ends carry no span.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "base/op.h"
#include "collie/work.h"

namespace collie::trace {

// CLOCK_MONOTONIC (steady_clock on Linux), in nanoseconds.
using Nanos = int64_t;
Nanos now();
Nanos at(std::chrono::steady_clock::time_point t);

// The file COLLIE_TRACE=spec names for `rank`: spec with every %r replaced
// by the rank, else spec (less a trailing ".json") + ".rank<rank>.json".
std::string file_name(const std::string& spec, int rank);

// An event's "args", built as JSON. Keys are literals with nothing to
// escape; values are escaped.
class Args {
 public:
  Args& add(std::string_view key, std::string_view value);
  Args& add(std::string_view key, const char* value) { return add(key, std::string_view(value)); }
  Args& add(std::string_view key, int64_t value);
  Args& add(std::string_view key, uint64_t value);
  Args& add(std::string_view key, int value) { return add(key, static_cast<int64_t>(value)); }
  Args& add(std::string_view key, double value);
  Args& add(std::string_view key, bool value);
  // Microseconds, as event timestamps are written.
  Args& add_us(std::string_view key, Nanos t);
  std::string json() const { return "{" + s_ + "}"; }
  const std::string& body() const { return s_; }  // json() less its braces

 private:
  Args& key(std::string_view k);
  std::string s_;
};

class Track;

// One rank's trace file. Opened once per file and process, kept for the
// process's life (threads that outlive a communicator may still write).
class Sink : public std::enable_shared_from_this<Sink> {
 public:
  // The sink of `rank` for COLLIE_TRACE=spec, or nullptr when spec is empty
  // or the file cannot be written (then a warning names the variable, the
  // file and the rank, and the job goes on without a trace).
  static std::shared_ptr<Sink> open(const std::string& spec, int rank, int world_size);
  // Writes what is buffered (every sink: at exit too).
  static void flush_all();

  Sink(int fd, std::string path, int rank, int world_size);
  ~Sink();

  int rank() const { return rank_; }
  const std::string& path() const { return path_; }

  // Rank 0's clock from now on: this host's plus `offset`, measured with a
  // round trip of `rtt` (its error is at most half of it); writes the
  // "trace start" event, which says so, and `how` it was measured (or why
  // not). Until then events are written on this host's clock.
  void start_clock(Nanos offset, Nanos rtt, const std::string& how);
  bool clock_started() const { return clock_started_.load(std::memory_order_acquire); }
  // A time of this host's clock on rank 0's, as events are written.
  Nanos shift(Nanos t) const { return t + offset_.load(std::memory_order_relaxed); }
  // While a Mute lives, events are dropped: the measurement's own
  // messages, on a clock not yet known.
  struct Mute {
    explicit Mute(Sink& s) : sink(s) { sink.muted_.store(true, std::memory_order_relaxed); }
    ~Mute() { sink.muted_.store(false, std::memory_order_relaxed); }
    Sink& sink;
  };
  // A new row (a Chrome "thread") called `name`.
  std::shared_ptr<Track> track(const std::string& name);
  uint64_t next_id() { return next_id_.fetch_add(1, std::memory_order_relaxed) + 1; }

  // Appends events (JSON objects, separated by ",\n"), all in one write
  // of the file; writes the buffer when it is due.
  void write(const std::string& events);
  void flush();

 private:
  void flush_locked();

  const int fd_;
  const std::string path_;
  const int rank_;
  const unsigned fork_generation_;
  const int world_size_;
  std::atomic<uint64_t> next_id_{0};
  std::atomic<Nanos> offset_{0};
  std::atomic<bool> clock_started_{false};
  std::atomic<bool> muted_{false};
  std::mutex mu_;
  std::string buf_;    // events not yet in the file, each after ",\n"
  int64_t at_ = 0;     // where the next write goes: over the closing bracket
  bool first_ = true;  // the file's first write opens the array
  bool broken_ = false;
  int next_tid_ = 0;
  Nanos last_write_ = 0;
};

// A row of the timeline: a communicator's operations, or a reducer's events.
class Track {
 public:
  Track(std::shared_ptr<Sink> sink, int tid) : sink_(std::move(sink)), tid_(tid) {}
  Sink& sink() const { return *sink_; }
  int tid() const { return tid_; }

  // For a communicator's track: its name in the args of its operations.
  std::string comm;
  std::string backend;

  void instant(std::string_view name, const Args& args, Nanos t = now());
  void span(std::string_view name, Nanos begin, Nanos end, const Args& args);
  // Spans that may overlap others on this row (buckets in flight): a
  // Chrome async pair, joined by the id async_begin returns.
  uint64_t async_begin(std::string_view cat, std::string_view name, Nanos t, const Args& args);
  void async_end(std::string_view cat, std::string_view name, uint64_t id, Nanos t,
                 const Args& args = {});

  // The start of a run span that does not overlap the one before it (an
  // operation queued on a stream behind another runs only once that one
  // has ended), and records `end` as this row's latest. Never after `end`.
  Nanos serial_start(Nanos start, Nanos end);

  // The events, formatted for Sink::write.
  std::string span_event(std::string_view name, Nanos begin, Nanos end, const Args& args) const;
  std::string async_event(char ph, std::string_view cat, std::string_view name, uint64_t id,
                          Nanos t, const Args& args) const;

 private:
  std::shared_ptr<Sink> sink_;
  const int tid_;
  std::mutex mu_;
  Nanos last_end_ = 0;
};

// One operation, from issue to end. Whoever knows a time marks it (the first
// mark wins); the events are written at its end.
struct OpSpan {
  std::shared_ptr<Track> track;
  OpDesc desc;
  int peer = -1;
  bool is_send = false;
  Nanos issued = 0;
  std::atomic<Nanos> started{0};
  std::atomic<Nanos> finished{0};
  std::atomic<const char*> algorithm{nullptr};  // a string literal
};

// ---- the path of an operation --------------------------------------------

// The front, numbering `op` on `track`'s communicator: its span, issued now.
OpSpan* issue(const std::shared_ptr<Track>& track, const Op& op);
// The front refused `op` (its communicator failed or was destroyed).
void refused(const std::shared_ptr<Track>& track, const Op& op, const Error& e);

void mark_started(OpSpan& s);
void note_algorithm(OpSpan& s, const char* name);
// Marks the end (unless marked), writes the operation's events and frees
// `s`.
void end(OpSpan* s, const std::optional<Error>& e);
// Ends `s` when `c` ends (for completions whose callbacks run on the thread
// that finishes them: not the executor's, which dispatches them).
void end_with(Completion& c, OpSpan* s);

// Whoever starts running `op`.
inline void started(const Op& op) {
  if (op.trace) mark_started(*op.trace);
}
// The algorithm chosen for `op` (a string literal); the first note wins, so
// that a composite backend's choice stands over those of its parts.
inline void algorithm(const Op& op, const char* name) {
  if (op.trace) note_algorithm(*op.trace, name);
}
// Whoever sees `op` end, before its completion is finished: ends its span,
// once (op.trace is null afterwards).
inline void finished(Op& op, const std::optional<Error>& e) {
  if (op.trace) end(std::exchange(op.trace, nullptr), e);
}

}  // namespace collie::trace

namespace collie {

class Communicator;  // collie/comm.h

// COLLIE_TRACE's file of `comm`'s rank (the reducer writes its events
// there), or null: tracing is off, or `comm` is not collie's front.
// Declared here for the layers above the front's (the reducer); the
// front defines it (comm/front/front.cc), which alone knows its class.
std::shared_ptr<trace::Sink> trace_sink(const Communicator& comm);

}  // namespace collie
