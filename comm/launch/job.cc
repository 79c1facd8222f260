// comm/launch/job.cc: a round of collie-run's job on this node: the checks
// before any rank starts, the store node 0 serves, spawning each rank with
// the launch variables, supervising them, and whether to start again.
#include "comm/launch/job.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/config.h"
#include "base/log.h"
#include "base/topology.h"
#include "collie/store.h"

namespace collie::launch {

int Job::run() {
  if (!prepare() || !serve_store()) return 2;
  if (!join_agents()) return stop_signal_ ? 128 + stop_signal_ : 2;
  if (!a_.log_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(a_.log_dir, ec);
    if (ec) {
      std::fprintf(stderr, "collie-run: --log-dir %s: %s\n", a_.log_dir.c_str(),
                   ec.message().c_str());
      return 2;
    }
  }
  share_cpus();
  do {
    started_ = Clock::now();
    // Room for --elastic's replacements too: reap() holds references.
    ranks_.reserve(static_cast<size_t>(a_.nproc + (a_.elastic ? a_.spares + a_.max_restarts : 0)));
    for (int local = 0; local < a_.nproc; ++local)
      if (!spawn(local)) return 1;  // children die with us (PR_SET_PDEATHSIG)
    // The spares start with the ranks: by the time one is needed, it has
    // long been through the program's start-up.
    for (int k = 0; k < a_.spares; ++k)
      if (!spawn_spare()) return 1;
    supervise();
    for (Rank& r : ranks_)
      if (r.log_fd >= 0) close(r.log_fd);
  } while (restart());
  if (root_cause_ || remote_failure_) print_summary();
  if (remote_failure_) return remote_exit_;
  if (first_failure_) return exit_code(*first_failure_);
  if (stop_signal_) return 128 + stop_signal_;
  if (!lost_.empty()) return kept_going(ranks_, lost_.front());
  report_arrivals();
  return 0;
}

// Several ranks on one host each start a thread pool (OpenMP, OpenBLAS for
// PowerSGD) as wide as the machine, and then oversubscribe it: with two
// ranks on two cores, PowerSGD's arithmetic ran 25% slower. Like torchrun,
// give each rank its share unless the user chose: OMP_NUM_THREADS (which
// OpenBLAS also reads) = CPUs / ranks on this host, at least 1.
void Job::share_cpus() {
  if (a_.nproc <= 1 || a_.env.thread_count_set) return;
  int share = std::max(1, collie::topology::usable_cpus() / a_.nproc);
  setenv("OMP_NUM_THREADS", std::to_string(share).c_str(), 1);
  collie::log::info("collie-run: OMP_NUM_THREADS=" + std::to_string(share) + " for each of the " +
                    std::to_string(a_.nproc) + " ranks on this host (" +
                    std::to_string(collie::topology::usable_cpus()) +
                    " CPUs); set it (or OPENBLAS_NUM_THREADS) yourself to choose");
}

// Everything that can refuse the job before any rank starts.
bool Job::prepare() {
  // A launcher started with a closed stdin/stdout/stderr would hand those
  // numbers to its own pipes and sockets; the children's dup2 would then
  // clobber them.
  for (int fd = 0; fd <= 2; ++fd)
    if (fcntl(fd, F_GETFD) < 0) open("/dev/null", O_RDWR);

  if (!a_.env.job_secret.empty()) {
    secret_ = a_.env.job_secret;
  } else if (a_.nnodes > 1) {
    // A secret made up here would differ on every node, and the store
    // would refuse every node but this one.
    std::fprintf(stderr,
                 "collie-run: a job on several nodes needs one COLLIE_JOB_SECRET shared by "
                 "every node's launcher; export the same value on each, e.g. "
                 "COLLIE_JOB_SECRET=$(openssl rand -hex 16)\n");
    return false;
  } else {
    secret_ = random_secret();
  }

  if (!open_store()) return false;

  // SIGCHLD and the forwarded signals arrive through a signalfd, so one
  // poll() waits for output, exits and signals alike, with no timer tick.
  sigemptyset(&handled_);
  for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&handled_, sig);
  sigprocmask(SIG_BLOCK, &handled_, &saved_mask_);
  sigfd_ = signalfd(-1, &handled_, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sigfd_ < 0) {
    std::perror("collie-run: signalfd");
    return false;
  }
  signal(SIGPIPE, SIG_IGN);  // a closed stdout must not kill the supervisor
  return true;
}

// Node 0: the store's listening socket for this round, on the given port
// or a new one the kernel picks, and MASTER_PORT for torch.distributed.
bool Job::open_store() {
  port_ = a_.master_port;
  if (a_.node_rank != 0) return true;
  // One node: only local ranks connect, so listen on the master address
  // (loopback by default) rather than on every interface.
  const std::string host = a_.nnodes == 1 ? a_.master_addr : "";
  const int previous = store_port_;
  try {
    store_ = collie::net::listen_tcp(host, port_ < 0 ? 0 : port_, "collie-run");
    port_ = collie::net::local_port(store_.get());
    // A restart's port is not the last round's, even where the kernel
    // would give the same one again: bound while the first is held, the
    // second cannot be it.
    if (a_.master_port < 0 && port_ == previous) {
      collie::net::Fd other = collie::net::listen_tcp(host, 0, "collie-run");
      store_ = std::move(other);
      port_ = collie::net::local_port(store_.get());
    }
  } catch (const collie::Error& e) {
    if (a_.master_port >= 0 && std::strstr(e.what(), "already in use"))
      std::fprintf(stderr,
                   "collie-run: port %d is already in use; pass another --master-port or "
                   "omit it to let collie-run pick a free one\n",
                   a_.master_port);
    else
      std::fprintf(stderr, "%s\n", e.what());
    return false;
  }
  // torch.distributed in the ranks (init_process_group's env://) has its
  // rank 0 serve a TCPStore on MASTER_PORT, so MASTER_PORT must not be
  // collie's store port. Several nodes must agree without talking: P + 1.
  // One node picks a port the kernel says is free.
  if (a_.nnodes == 1 && a_.master_port < 0) {
    try {
      collie::net::Fd probe = collie::net::listen_tcp(a_.master_addr, 0, "collie-run");
      torch_port_ = collie::net::local_port(probe.get());
    } catch (const collie::Error&) {
      torch_port_ = -1;
    }
  }
  if (a_.nnodes > 1 && a_.master_port < 0)
    std::fprintf(stderr,
                 "collie-run: rank 0's store listens on port %d; start the other nodes "
                 "with --master-addr <this host> --master-port %d\n",
                 port_, port_);
  store_port_ = port_;
  return true;
}

// Node 0: serves the round's store from collie-run itself, on the socket
// open_store() bound, so that it outlives every rank (rank 0 included).
// Started once prepare() has blocked the handled signals, so that the
// server's thread inherits the mask and never takes a SIGCHLD meant for
// the signalfd. The last round's server goes first.
bool Job::serve_store() {
  if (a_.node_rank != 0) return true;
  server_.reset();
  try {
    const collie::StoreAuth auth{
        secret_, collie::config::job_identity(collie::config::process_env(), world_)};
    server_ = collie::TcpStoreServer::start(0, auth, store_.release());
  } catch (const collie::Error& e) {
    std::fprintf(stderr, "collie-run: serving the store: %s\n", e.what());
    return false;
  }
  return true;
}

bool Job::spawn(int local) {
  Rank& r = ranks_.emplace_back();
  r.rank = a_.node_rank * a_.nproc + local;
  r.joiner = joining_;
  r.spare = spawning_spare_;
  if (a_.prefix) r.prefix = "[" + (r.spare.empty() ? std::to_string(r.rank) : r.name()) + "] ";
  if (!a_.log_dir.empty()) {
    std::string path = a_.log_dir + "/" +
                       (r.spare.empty() ? "rank." + std::to_string(r.rank) : "spare." + r.spare) +
                       ".log";
    // A restarted rank's output follows its earlier rounds'.
    r.log_fd =
        open(path.c_str(),
             O_WRONLY | O_CREAT | O_CLOEXEC | (restarts_ || joining_ ? O_APPEND : O_TRUNC), 0644);
    if (r.log_fd < 0) {
      std::fprintf(stderr, "collie-run: --log-dir: cannot write %s: %s\n", path.c_str(),
                   std::strerror(errno));
      return false;
    }
    if (restarts_ > 0) write_all(r.log_fd, "---- collie-run: " + attempt() + " ----\n");
    if (joining_ && r.spare.empty())
      write_all(r.log_fd, "---- collie-run: --elastic: started again (" +
                              std::to_string(replacements_) + " of " +
                              std::to_string(a_.max_restarts) + ") ----\n");
  }
  // Output goes through pipes (prefixed, kept for the summary and the log
  // files) unless --no-prefix without --log-dir asks for the plain streams.
  const bool piped = captures();
  int out[2] = {-1, -1}, err[2] = {-1, -1};
  if (piped && (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0)) {
    std::perror("collie-run: pipe");
    return false;
  }
  const pid_t launcher = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    std::perror("collie-run: fork");
    return false;
  }
  if (pid == 0) exec_rank(r, local, launcher, out[1], err[1]);
  r.pid = pid;
  r.running = true;
  // Also here, so that no signal sent right after fork misses the group.
  setpgid(pid, pid);
  if (piped) {
    close(out[1]);
    close(err[1]);
    r.out = {out[0], STDOUT_FILENO, {}};
    r.err = {err[0], STDERR_FILENO, {}};
  }
  return true;
}

void Job::exec_rank(const Rank& r, int local, pid_t launcher, int out, int err) {
  // Each rank leads its own process group, so that ending a rank also ends
  // what it started (a shell's children), which would otherwise keep the
  // output pipe open. Being outside our group, a rank would also outlive a
  // launcher killed with its group: PDEATHSIG covers that.
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != launcher) _exit(1);  // the launcher died before prctl
  sigprocmask(SIG_SETMASK, &saved_mask_, nullptr);
  signal(SIGPIPE, SIG_DFL);
  // A background process group that reads the terminal is stopped
  // (SIGTTIN), which would hang the job without a word.
  if (isatty(STDIN_FILENO)) {
    int null = open("/dev/null", O_RDONLY);
    dup2(null, STDIN_FILENO);
  }
  if (captures()) {
    dup2(out, STDOUT_FILENO);
    dup2(err, STDERR_FILENO);
  }
  // Nothing past stderr: the store is served here, not by rank 0.
  const int first_closed = 3;
  unsetenv("COLLIE_STORE_FD");
  // Whatever our own parent leaked to us is not the ranks' business.
  if (close_range(first_closed, ~0u, 0) != 0)
    for (int fd = first_closed; fd < 65536; ++fd) close(fd);

  auto set = [](const char* k, const std::string& v) { setenv(k, v.c_str(), 1); };
  set("COLLIE_RANK", std::to_string(r.rank));
  set("COLLIE_WORLD_SIZE", std::to_string(world_));
  set("COLLIE_LOCAL_RANK", std::to_string(local));
  set("COLLIE_LOCAL_WORLD_SIZE", std::to_string(a_.nproc));
  set("COLLIE_NODE_RANK", std::to_string(a_.node_rank));
  set("COLLIE_NNODES", std::to_string(a_.nnodes));
  set("COLLIE_MASTER_ADDR", a_.master_addr);
  set("COLLIE_MASTER_PORT", std::to_string(port_));
  set("COLLIE_JOB_SECRET", secret_);
  set("COLLIE_LAUNCHER_STORE", "1");
  if (store_for_the_job()) set("COLLIE_STORE_PREFIX", round_key(""));
  // --elastic: how many ranks were started again so far, this one too.
  set("COLLIE_RESTART_COUNT", std::to_string(restarts_ + replacements_));
  set("TORCHELASTIC_RESTART_COUNT", std::to_string(restarts_ + replacements_));
  if (joining_) set("COLLIE_JOIN", "1");
  // --spares: a spare waits in its join until a grow takes it.
  if (!r.spare.empty()) set("COLLIE_SPARE", r.spare);
  // Every rank of an --elastic job: a lost peer is replaced, so a program
  // may wait for it (shrink, then grow) instead of ending.
  if (a_.elastic) set("COLLIE_ELASTIC", "1");
  set("TORCHELASTIC_MAX_RESTARTS", std::to_string(a_.max_restarts));
  set("RANK", std::to_string(r.rank));
  set("WORLD_SIZE", std::to_string(world_));
  set("LOCAL_RANK", std::to_string(local));
  set("LOCAL_WORLD_SIZE", std::to_string(a_.nproc));
  set("GROUP_RANK", std::to_string(a_.node_rank));
  set("MASTER_ADDR", a_.master_addr);
  set("MASTER_PORT", std::to_string(torch_port_ > 0  ? torch_port_
                                    : port_ == 65535 ? port_ - 1
                                                     : port_ + 1));

  std::vector<char*> argv;
  for (const auto& s : a_.prog) argv.push_back(const_cast<char*>(s.c_str()));
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  std::fprintf(stderr, "collie-run: rank %d: cannot run '%s': %s\n", r.rank, argv[0],
               std::strerror(errno));
  _exit(127);
}

// Supervises one round until every rank has ended and its output is read.
void Job::supervise() {
  for (;;) {
    bool all_exited = true, pipes_open = false;
    for (const Rank& r : ranks_) {
      all_exited = all_exited && !r.running;
      pipes_open = pipes_open || r.out.fd >= 0 || r.err.fd >= 0;
    }
    if (all_exited && !pipes_open) break;
    // Every rank is gone but something it started still holds its output:
    // give that a moment to finish, then end it rather than wait on it.
    if (all_exited && !drain_until_) drain_until_ = Clock::now() + kPipeDrain;
    if (drain_until_ && Clock::now() >= *drain_until_) {
      signal_ranks(SIGKILL);
      for (Rank& r : ranks_) {
        finish(r, r.out);
        finish(r, r.err);
      }
      break;
    }
    // The others had their moment to report after the first failure.
    if (stop_at_ && Clock::now() >= *stop_at_) {
      stop_at_.reset();
      stop_ranks(SIGTERM);
    }
    if (kill_at_ && Clock::now() >= *kill_at_) {
      signal_ranks(SIGKILL);
      kill_at_.reset();
    }
    watch_other_nodes();
    check_waiting_joiners();
    wait_and_handle();
  }
}

// After a round: whether a failure is to be answered by another round,
// and if so, a fresh rendezvous for it and the round's state cleared. A
// stop asked of collie-run (SIGINT, SIGTERM, SIGHUP) is never restarted,
// nor is a round whose ranks all finished.
bool Job::restart() {
  // --elastic restarts single ranks within the round; on several nodes the
  // launchers still end the round together (restart_every_node never
  // starts another for it).
  if (agents()) return restart_every_node();
  if (a_.elastic && !round_again_) return false;
  // Under --elastic, M counts the ranks replaced alone too.
  if (!first_failure_ || restarts_ + (a_.elastic ? replacements_ : 0) >= a_.max_restarts)
    return false;
  handle_signals();  // one that came while the round ended wins over a restart
  if (stop_signal_) return false;
  const Rank& root = ranks_[*root_cause_];
  // A new socket on a new port and a new secret (unless the user gave
  // one): whatever is left of the old round cannot reach the new one.
  // Opened before the old round's state goes, so that failing to open it
  // still ends with the old round's summary. With the port fixed, the
  // first round's store serves every round, each under its own prefix.
  ++restarts_;
  const std::string old_secret = secret_;
  if (!store_for_the_job() && a_.env.job_secret.empty()) secret_ = random_secret();
  if (!store_for_the_job() && (!open_store() || !serve_store())) {
    --restarts_;
    secret_ = old_secret;
    return false;
  }
  char when[64];
  std::snprintf(when, sizeof when, "%.2f s after the %s", root.ended_s,
                restarts_ > 1 ? "last restart" : "start");
  write_all(STDERR_FILENO, "collie-run: " + root.name() + " failed first (" +
                               describe(root.status) + ", " + when + "); all " +
                               std::to_string(ranks_.size()) + " ranks have ended; " + attempt() +
                               " with a fresh rendezvous\n");
  next_round();
  return true;
}

// The round's state cleared for the next one.
void Job::next_round() {
  ranks_.clear();
  first_failure_.reset();
  root_cause_.reset();
  stop_at_.reset();
  kill_at_.reset();
  drain_until_.reset();
  stop_sent_ = false;
  remote_failure_.reset();
  round_again_ = false;
  spares_started_ = 0;
  losses_ = 0;
  lost_last_.reset();
  joiners_idle_at_.reset();
}

}  // namespace collie::launch
