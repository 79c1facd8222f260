// comm/launch/args.cc: collie-run's command line (args.h).
#include "comm/launch/args.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace collie::launch {

namespace {

constexpr const char* kUsage =
    "usage: collie-run -n N [--nnodes K --node-rank R --master-addr A --master-port P]\n"
    "                  [--max-restarts M [--elastic [--spares K]] | --keep-going]\n"
    "                  [--grace-seconds S]\n"
    "                  [--log-dir D] [--no-prefix] program [args...]\n"
    "  -n N               ranks to start on this node\n"
    "  --nnodes K         nodes in the job (default 1)\n"
    "  --node-rank R      this node's index, 0..K-1 (default 0)\n"
    "  --master-addr A    rank 0's host (default 127.0.0.1; required on nodes > 0)\n"
    "  --master-port P    the store's port (default on node 0: a free port;\n"
    "                     required on nodes > 0)\n"
    "  --max-restarts M   when a rank fails, stop every rank and start them all again\n"
    "                     with a fresh rendezvous, up to M times (default 0); ranks\n"
    "                     read the count in COLLIE_RESTART_COUNT and should resume\n"
    "                     from a checkpoint; on several nodes, every node's\n"
    "                     launcher takes part (give each the same value)\n"
    "  --elastic          with --max-restarts M: a rank that fails is started again\n"
    "                     alone, on its node, up to M times in the whole job, and\n"
    "                     joins the running job (COLLIE_JOIN=1: its connect() waits\n"
    "                     for the others' Communicator::grow) while the others go on\n"
    "  --spares K         with --elastic: K more processes start with the ranks and\n"
    "                     wait in their join (COLLIE_JOIN=1, COLLIE_SPARE=<id>): a\n"
    "                     grow takes one at once, already past its start-up (import\n"
    "                     torch, build the model); each one taken or lost is started\n"
    "                     again, counted in M; those never taken are stopped at the\n"
    "                     end (default 0: a lost rank's replacement starts cold)\n"
    "  --keep-going       a rank that fails does not stop the others (for programs\n"
    "                     whose survivors shrink the communicator and go on); the job\n"
    "                     fails if a rank exits non-zero or none finishes\n"
    "  --grace-seconds S  after a rank fails, SIGKILL the rest S s after SIGTERM\n"
    "                     (default 5, or $COLLIE_RUN_GRACE)\n"
    "  --log-dir D        also write each rank's output to D/rank.<rank>.log\n"
    "  --no-prefix        pass output through without the '[rank] ' prefix\n"
    "A job on several nodes needs the same COLLIE_JOB_SECRET exported on every node.\n"
    "Node 0's collie-run serves the rendezvous store itself, so that it outlives every\n"
    "rank; ranks inherit only stdin, stdout and stderr.\n";

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "collie-run: %s\n%s", msg.c_str(), kUsage);
  std::exit(2);
}

int parse_int(const std::string& what, const std::string& v, long min, long max) {
  char* end = nullptr;
  errno = 0;
  long x = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno == ERANGE || x < min || x > max)
    usage_error(what + " takes a whole number in " + std::to_string(min) + ".." +
                std::to_string(max) + ", not '" + v + "'");
  return static_cast<int>(x);
}

}  // namespace

Args parse_args(int argc, char** argv) {
  Args a;
  try {
    a.env = collie::config::launcher_settings(collie::config::process_env());
  } catch (const collie::Error& e) {
    usage_error(e.what());
  }
  a.grace_seconds = a.env.grace_seconds;
  int i = 1;
  for (; i < argc; ++i) {
    std::string flag = argv[i];
    if (flag == "--") {
      ++i;
      break;
    }
    if (flag.size() < 2 || flag[0] != '-') break;  // the program starts here
    if (flag == "-h" || flag == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    std::string value;
    bool has_value = false;
    if (auto eq = flag.find('='); eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag.resize(eq);
      has_value = true;
    }
    // torchrun spells its flags with underscores; accept those too.
    for (size_t k = 2; k < flag.size(); ++k)
      if (flag[k] == '_') flag[k] = '-';
    if (flag == "--no-prefix") {
      a.prefix = false;
      continue;
    }
    if (flag == "--keep-going") {
      a.keep_going = true;
      continue;
    }
    if (flag == "--elastic") {
      a.elastic = true;
      continue;
    }
    auto take = [&]() -> std::string {
      if (has_value) return value;
      if (i + 1 >= argc) usage_error(flag + " needs a value");
      return argv[++i];
    };
    // The limits keep nnodes * nproc, the world size, well inside an int.
    if (flag == "-n" || flag == "--nproc-per-node")
      a.nproc = parse_int(flag, take(), 1, 4096);
    else if (flag == "--nnodes")
      a.nnodes = parse_int(flag, take(), 1, 100000);
    else if (flag == "--node-rank")
      a.node_rank = parse_int(flag, take(), 0, 100000);
    else if (flag == "--master-addr")
      a.master_addr = take();
    else if (flag == "--master-port")
      a.master_port = parse_int(flag, take(), 1, 65535);
    else if (flag == "--grace-seconds")
      a.grace_seconds = parse_int(flag, take(), 0, 86400);
    else if (flag == "--max-restarts")
      a.max_restarts = parse_int(flag, take(), 0, 1000000);
    else if (flag == "--spares")
      a.spares = parse_int(flag, take(), 0, 4096);
    else if (flag == "--log-dir")
      a.log_dir = take();
    else
      usage_error("unknown option '" + std::string(argv[i]) +
                  "' (put the program after '--' if it starts with '-')");
  }
  a.prog.assign(argv + i, argv + argc);
  if (a.nproc < 0) usage_error("-n N is required: how many ranks to start on this node");
  if (a.prog.empty()) usage_error("no program given to run; put it after the options");
  if (a.node_rank >= a.nnodes)
    usage_error("--node-rank " + std::to_string(a.node_rank) + " must be below --nnodes " +
                std::to_string(a.nnodes) + " (nodes are numbered from 0)");
  if (a.node_rank > 0 && (a.master_addr.empty() || a.master_port < 0))
    usage_error("node " + std::to_string(a.node_rank) +
                " needs --master-addr and --master-port: node 0's host and the port its "
                "launcher uses (give node 0 --master-port too, or copy the port it prints)");
  if (a.max_restarts > 0 && a.keep_going)
    usage_error(
        "--keep-going and --max-restarts ask for opposite things after a failure (the "
        "survivors go on, or every rank starts again); give one");
  if (a.elastic && a.max_restarts < 1)
    usage_error("--elastic needs --max-restarts M: how many ranks may be started again in all");
  if (a.spares > 0 && !a.elastic)
    usage_error(
        "--spares K needs --elastic (and --max-restarts M): a spare is a process "
        "waiting to join the running job in a lost rank's place");
  if (a.master_addr.empty()) a.master_addr = "127.0.0.1";
  return a;
}

}  // namespace collie::launch
