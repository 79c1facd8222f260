// comm/launch/rank_output.h: a rank as collie-run sees it (its process, its
// output pipes, how it ended) and the relay of its output: whole lines, each
// with the rank's prefix, in one write so that ranks' lines never interleave
// mid-line; the last lines kept for the summary; the whole output to the
// rank's log file (--log-dir).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <deque>
#include <string>

namespace collie::launch {

// One of a rank's output pipes and the bytes of its unfinished line.
struct Stream {
  int fd = -1;  // read end; -1 once closed
  int to = -1;  // where whole lines go: our stdout or stderr
  std::string pending;
};

struct Rank {
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  std::string prefix;  // "[rank] "
  Stream out, err;
  std::deque<std::string> tail;  // its last lines of output, both streams, prefixed
  int log_fd = -1;               // --log-dir: its whole output, unprefixed
  // How it ended, for the summary.
  int status = 0;
  double ended_s = 0;    // seconds after the start
  bool stopped = false;  // it ended after collie-run had told it to stop
  bool joiner = false;   // --elastic: started again alone, to join the running job
  // --spares: this spare's id ("<node>.<n>"; "" for a rank); whether a grow
  // took it (it is a rank from then on); whether collie-run stopped it,
  // never taken, at the job's end (not a failure).
  std::string spare;
  bool taken = false;
  bool withdrawn = false;  // ended untaken, its ticket withdrawn from the queue
  bool released = false;
  // "rank R", or "spare <id>" (a spare's rank, once a grow takes it, is
  // known to its communicator only).
  std::string name() const {
    return spare.empty() ? "rank " + std::to_string(rank) : "spare " + spare;
  }
};

// Of each rank's output, the lines the summary shows.
inline constexpr size_t kTailLines = 10;

// Reads what `s` has (it is readable) and passes on its whole lines; at its
// end, the unfinished last line too, and closes it.
void relay(Rank& r, Stream& s);
// Passes on the unfinished last line and closes the pipe.
void finish(Rank& r, Stream& s);

}  // namespace collie::launch
