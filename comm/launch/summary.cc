// comm/launch/summary.cc: collie-run's accounts of a job that ended badly.
#include "comm/launch/summary.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>

#include "comm/launch/process.h"

namespace collie::launch {

void print_summary(const JobEnd& end) {
  std::string out = "collie-run: ---- the job failed ----\n";
  char when[64];
  const char* start = end.restarts > 0 ? "after the last restart" : "after the start";
  // The job's root cause is another node's when that node's launcher wrote
  // the round's failure first.
  const Rank* root = end.remote_failure ? nullptr : &end.ranks[*end.root_cause];
  if (root) {
    std::snprintf(when, sizeof when, "%.2f s %s", root->ended_s, start);
    out += "collie-run: root cause: " + root->name() + " (pid " + std::to_string(root->pid) +
           "), the first to fail, " + describe(root->status) + ", " + when;
    out += root->tail.empty() ? std::string(end.captured ? "; it printed nothing\n" : "\n")
                              : "; its last lines:\n";
    for (const std::string& l : root->tail) out += "collie-run:   " + l + "\n";
  } else {
    out += "collie-run: root cause, on another node: " + *end.remote_failure + "\n";
  }
  for (const Rank& r : end.ranks) {
    if (&r == root) continue;
    const std::string who = "collie-run: " + r.name();
    if (r.stopped) {
      out += who + ", stopped by collie-run: " + describe(r.status) + "\n";
    } else if (WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0) {
      out += who + " finished: " + describe(r.status) + "\n";
    } else {
      std::snprintf(when, sizeof when, "%.2f s %s", r.ended_s, start);
      out += who + " failed on its own " + when + ": " + describe(r.status) +
             (r.tail.empty() ? "\n" : "; its last line:\ncollie-run:   " + r.tail.back() + "\n");
    }
  }
  if (end.elastic) {
    // M counts both: ranks started again alone, and rounds started again
    // (for a rank lost before the world formed, or as the others ended).
    const int spent = end.replacements + end.restarts;
    const std::string used = std::to_string(spent) + " of " + std::to_string(end.max_restarts) +
                             " (" + std::to_string(end.replacements) + " ranks alone, " +
                             std::to_string(end.restarts) + " rounds)";
    if (spent >= end.max_restarts)
      out += "collie-run: --elastic: no restarts left: " + used + "\n";
    else if (end.stop_signal)
      out += "collie-run: --elastic: collie-run was told to stop (" + signal_name(end.stop_signal) +
             "); restarts " + used + "\n";
    else
      out += "collie-run: --elastic: restarts " + used + "\n";
  } else if (end.max_restarts > 0) {
    const std::string used =
        std::to_string(end.restarts) + " of " + std::to_string(end.max_restarts) + " used";
    if (end.restarts >= end.max_restarts)
      out += "collie-run: no restarts left: " + used + "\n";
    else if (end.stop_signal)
      out += "collie-run: not restarted: collie-run was told to stop (" +
             signal_name(end.stop_signal) + "); restarts " + used + "\n";
    else
      out += "collie-run: not restarted: the next round could not start (above); restarts " + used +
             "\n";
  }
  if (!end.log_dir.empty())
    out += "collie-run: each rank's whole output: " + end.log_dir + "/rank.<rank>.log\n";
  write_all(STDERR_FILENO, out);
}

int kept_going(const std::vector<Rank>& ranks, size_t first_lost) {
  std::string out = "collie-run: ---- --keep-going: ranks failed, the others went on ----\n";
  std::optional<int> failed_exit;
  bool finished = false;
  for (const Rank& r : ranks) {
    char when[64];
    std::snprintf(when, sizeof when, "%.2f s after the start", r.ended_s);
    const bool ok = WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0;
    finished = finished || ok;
    if (!ok && WIFEXITED(r.status) && !failed_exit) failed_exit = r.status;
    out += "collie-run: rank " + std::to_string(r.rank) +
           (ok                    ? " finished"
            : WIFEXITED(r.status) ? " failed"
                                  : " was lost") +
           ": " + describe(r.status) + (ok ? "" : ", " + std::string(when)) + "\n";
  }
  write_all(STDERR_FILENO, out);
  if (failed_exit) return exit_code(*failed_exit);
  if (!finished) return exit_code(ranks[first_lost].status);
  return 0;
}

}  // namespace collie::launch
