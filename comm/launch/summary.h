// comm/launch/summary.h: what collie-run says when a job ends badly:
// torchrun's failure summary in collie-run's words (the rank that failed
// first, how it ended and its last lines, then what became of the others),
// and --keep-going's account of every rank with the job's exit status.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "comm/launch/rank_output.h"

namespace collie::launch {

// What the failure summary reports, as the job's supervisor knows it.
struct JobEnd {
  const std::vector<Rank>& ranks;
  std::optional<size_t> root_cause;           // index of this node's first failed rank
  std::optional<std::string> remote_failure;  // the root cause, when on another node
  int restarts = 0;                           // rounds started again
  int max_restarts = 0;                       // --max-restarts
  bool elastic = false;                       // --elastic: restarts are of single ranks
  int replacements = 0;                       // --elastic: ranks started again, in the job
  int stop_signal = 0;                        // the signal collie-run was told to stop with
  bool captured = false;                      // output went through collie-run
  std::string log_dir;                        // --log-dir ("" when not given)
};

// The failure summary, written to stderr.
void print_summary(const JobEnd& end);

// --keep-going, once every rank has ended: what became of each (to stderr),
// and the job's exit status: the first non-zero exit status, else the
// first lost rank's when no rank finished, else 0.
int kept_going(const std::vector<Rank>& ranks, size_t first_lost);

}  // namespace collie::launch
