// comm/launch/args.h: collie-run's command line: its flags (torchrun's
// spellings too), their checks, and the usage text.
#pragma once

#include <string>
#include <vector>

#include "base/config.h"

namespace collie::launch {

struct Args {
  int nproc = -1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr;
  int master_port = -1;  // -1: not given
  int grace_seconds = 5;
  int max_restarts = 0;
  bool keep_going = false;
  // --elastic: with --max-restarts M, a rank that fails is started again
  // alone (COLLIE_JOIN=1), up to M times in all, while the others go on.
  bool elastic = false;
  // --spares K (with --elastic): K processes started ahead of any failure,
  // waiting in their join, so that a grow takes one at once.
  int spares = 0;
  bool prefix = true;
  std::string log_dir;
  std::vector<std::string> prog;
  collie::config::LauncherSettings env;  // what the environment says (base/config.h)
};

// The arguments, checked; a bad one prints why and the usage and exits 2;
// -h prints the usage and exits 0.
Args parse_args(int argc, char** argv);

}  // namespace collie::launch
