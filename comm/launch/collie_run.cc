// comm/launch/collie_run.cc: collie-run, the launcher.
//
//   collie-run -n N [--nnodes K --node-rank R --master-addr A --master-port P]
//              [--max-restarts M | --keep-going] [--grace-seconds S] [--log-dir D]
//              [--no-prefix] prog args...
//
// Starts N local ranks of a K-node job with collie's and torchrun's launch
// variables, prefixes every output line with the rank, forwards SIGINT,
// SIGTERM and SIGHUP. When one rank fails, the others get a moment to report
// their own error (collie's ranks fail within milliseconds of a peer, naming
// it), then are stopped (SIGTERM, then SIGKILL after the grace period); the
// job exits with the first failing rank's status, and a summary names that
// rank, how it ended and its last lines of output, and what became of the
// others.
//
// With --max-restarts M, a failure instead stops the whole group in the same
// way and starts every rank again, up to M times, as torchrun does: the ranks
// that had finished too, and with a fresh rendezvous (a new store socket on
// a new port, and a new secret unless the user gave one), so that nothing of
// the old round can join the new one. The ranks see the count in
// COLLIE_RESTART_COUNT (and torchrun's TORCHELASTIC_RESTART_COUNT and
// TORCHELASTIC_MAX_RESTARTS), and resume from their own checkpoint.
//
// On several nodes the launchers agree through the store node 0's launcher
// serves for the whole job (as torchrun's agents do through their
// rendezvous): a launcher whose rank fails writes the round's failure key
// (the first writer is the job's root cause) and every other launcher,
// which looks for it every 200 ms, stops its own ranks; once a node's ranks
// have all ended, its launcher says so, and when every node has, all of
// them restart (or all stop: no restarts left, or one was told to stop).
// The ranks of round r put their keys under "round<r>/"
// (COLLIE_STORE_PREFIX), so nothing of an earlier round meets them.
//
// With --keep-going, a failed rank is reported and the others go on: for
// programs whose survivors shrink the communicator and carry on
// (Communicator::shrink). The job then fails only if a rank exits with a
// non-zero status, or no rank finishes; ranks killed by a signal are named
// as lost.
//
// Node 0's launcher serves the rendezvous store itself (as torchrun's agent
// does), on a socket it binds before any rank starts (on the given port, or
// one the kernel picks): no other process can take the port between choosing
// it and using it, and the store outlives every rank, rank 0 included, so
// that survivors can still agree through it and the stall inspector can
// still report. The ranks see COLLIE_LAUNCHER_STORE=1, and rank 0 connects
// as one more client.
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
#include <deque>
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
#include "comm/launch/args.h"
#include "comm/launch/process.h"
#include "comm/net/socket.h"

namespace {

using namespace collie::launch;
using collie::net::Clock;
using collie::net::Deadline;

constexpr size_t kMaxLine = 64 * 1024;  // longer lines are cut, not buffered forever
constexpr auto kPipeDrain = std::chrono::seconds(2);
// After the first failure, how long the other ranks have to end on their
// own (and say why) before they are stopped.
constexpr auto kReportWindow = std::chrono::seconds(1);
constexpr size_t kTailLines = 10;  // of each rank's output, for the summary
// Several nodes with --max-restarts: how often a launcher looks in the store
// for a failure on another node (torchrun's agents poll at 0.1 to 5 s).
constexpr auto kCheckEvery = std::chrono::milliseconds(200);

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
};

class Job {
 public:
  explicit Job(Args a) : a_(std::move(a)), world_(a_.nnodes * a_.nproc) {}

  int run() {
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
      ranks_.reserve(a_.nproc);
      for (int local = 0; local < a_.nproc; ++local)
        if (!spawn(local)) return 1;  // children die with us (PR_SET_PDEATHSIG)
      supervise();
      for (Rank& r : ranks_)
        if (r.log_fd >= 0) close(r.log_fd);
    } while (restart());
    if (root_cause_ || remote_failure_) print_summary();
    if (remote_failure_) return remote_exit_;
    if (first_failure_) return exit_code(*first_failure_);
    if (stop_signal_) return 128 + stop_signal_;
    if (!lost_.empty()) return kept_going();
    return 0;
  }

 private:
  // Several ranks on one host each start a thread pool (OpenMP, OpenBLAS for
  // PowerSGD) as wide as the machine, and then oversubscribe it: with two
  // ranks on two cores, PowerSGD's arithmetic ran 25% slower. Like torchrun,
  // give each rank its share unless the user chose: OMP_NUM_THREADS (which
  // OpenBLAS also reads) = CPUs / ranks on this host, at least 1.
  void share_cpus() {
    if (a_.nproc <= 1 || a_.env.thread_count_set) return;
    int share = std::max(1, collie::topology::usable_cpus() / a_.nproc);
    setenv("OMP_NUM_THREADS", std::to_string(share).c_str(), 1);
    collie::log::info("collie-run: OMP_NUM_THREADS=" + std::to_string(share) + " for each of the " +
                      std::to_string(a_.nproc) + " ranks on this host (" +
                      std::to_string(collie::topology::usable_cpus()) +
                      " CPUs); set it (or OPENBLAS_NUM_THREADS) yourself to choose");
  }

  // Everything that can refuse the job before any rank starts.
  bool prepare() {
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
  bool open_store() {
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
  bool serve_store() {
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

  bool spawn(int local) {
    Rank& r = ranks_.emplace_back();
    r.rank = a_.node_rank * a_.nproc + local;
    if (a_.prefix) r.prefix = "[" + std::to_string(r.rank) + "] ";
    if (!a_.log_dir.empty()) {
      std::string path = a_.log_dir + "/rank." + std::to_string(r.rank) + ".log";
      // A restarted rank's output follows its earlier rounds'.
      r.log_fd = open(path.c_str(),
                      O_WRONLY | O_CREAT | O_CLOEXEC | (restarts_ ? O_APPEND : O_TRUNC), 0644);
      if (r.log_fd < 0) {
        std::fprintf(stderr, "collie-run: --log-dir: cannot write %s: %s\n", path.c_str(),
                     std::strerror(errno));
        return false;
      }
      if (restarts_ > 0) write_all(r.log_fd, "---- collie-run: " + attempt() + " ----\n");
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

  [[noreturn]] void exec_rank(const Rank& r, int local, pid_t launcher, int out, int err) {
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
    set("COLLIE_RESTART_COUNT", std::to_string(restarts_));
    set("TORCHELASTIC_RESTART_COUNT", std::to_string(restarts_));
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
  void supervise() {
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
      wait_and_handle();
    }
  }

  // After a round: whether a failure is to be answered by another round,
  // and if so, a fresh rendezvous for it and the round's state cleared. A
  // stop asked of collie-run (SIGINT, SIGTERM, SIGHUP) is never restarted,
  // nor is a round whose ranks all finished.
  bool restart() {
    if (agents()) return restart_every_node();
    if (!first_failure_ || restarts_ >= a_.max_restarts) return false;
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
    write_all(STDERR_FILENO, "collie-run: rank " + std::to_string(root.rank) + " failed first (" +
                                 describe(root.status) + ", " + when + "); all " +
                                 std::to_string(ranks_.size()) + " ranks have ended; " + attempt() +
                                 " with a fresh rendezvous\n");
    next_round();
    return true;
  }

  // The round's state cleared for the next one.
  void next_round() {
    ranks_.clear();
    first_failure_.reset();
    root_cause_.reset();
    stop_at_.reset();
    kill_at_.reset();
    drain_until_.reset();
    stop_sent_ = false;
    remote_failure_.reset();
  }

  // ---- Several nodes with --max-restarts: the launchers agree through
  // the store that node 0's launcher serves for the whole job. Keys:
  //   collie-run/round<r>/failed     the round's first failure: "<exit code>\n<what>"
  //   collie-run/round<r>/ended/<k>  node k's ranks have all ended
  //   collie-run/round<r>/read/<k>   node k has read the round's outcome
  //   collie-run/stop                a launcher was told to stop: no more rounds

  bool agents() const { return a_.nnodes > 1 && a_.max_restarts > 0; }
  // Whether every round uses the store of the first (under its own key
  // prefix) rather than a new one on a new port with a new secret: on
  // several nodes, where the other nodes know only the one port, and where
  // the user fixed the port (the first round's store holds it).
  bool store_for_the_job() const {
    return a_.max_restarts > 0 && (a_.nnodes > 1 || a_.master_port >= 0);
  }

  std::string round_key(const std::string& key) const {
    return "round" + std::to_string(restarts_) + "/" + key;
  }
  std::string agent_key(const std::string& key) const { return "collie-run/" + round_key(key); }
  std::string node_name(int k) const { return "node " + std::to_string(k); }

  // Connects this launcher to the job's store. A node started before node
  // 0's launcher waits for it (up to the timeout), in slices, so that
  // SIGINT still ends the wait.
  bool join_agents() {
    if (!agents()) return true;
    const collie::StoreAuth auth{
        secret_, collie::config::job_identity(collie::config::process_env(), world_)};
    const Deadline limit = collie::net::deadline_after(a_.env.timeout);
    for (;;) {
      try {
        agent_ = collie::TcpStore::connect(
            a_.master_addr, port_, auth,
            std::min(a_.env.timeout, std::chrono::duration_cast<collie::Millis>(kCheckEvery * 5)),
            "collie-run on " + node_name(a_.node_rank), "collie-run on node 0");
        agent_->set_timeout(a_.env.timeout);
        return true;
      } catch (const collie::Error& e) {
        handle_signals();
        if (stop_signal_) return false;
        if (e.code() != collie::ErrorCode::timeout || Clock::now() >= limit) {
          std::fprintf(stderr, "collie-run: cannot reach the job's store: %s\n", e.what());
          return false;
        }
      }
    }
  }

  // One request to the job's store. A store that is gone (node 0's
  // launcher died, or the network to it) ends the job on this node: its
  // ranks are stopped and there is no next round.
  template <class F>
  auto agent_call(F&& f) -> std::optional<decltype(f())> {
    if (agent_lost_ || !agent_) return std::nullopt;
    try {
      return f();
    } catch (const collie::Error& e) {
      agent_lost_ = true;
      if (!remote_failure_ && !first_failure_) {
        remote_failure_ = "the job's store, served by collie-run on node 0, is lost (" +
                          std::string(e.what()) + ")";
        remote_exit_ = 1;
      }
      std::fprintf(stderr,
                   "collie-run: lost the job's store (%s); stopping this node's ranks, "
                   "and no restart\n",
                   e.what());
      if (!stop_at_ && !stop_sent_) stop_at_ = Clock::now();
      return std::nullopt;
    }
  }

  std::optional<Deadline> watch_at() const {
    return agents() && !stopping() ? std::optional<Deadline>(next_check_) : std::nullopt;
  }

  // Whether another node's rank failed (or its launcher was told to stop):
  // then this node's ranks get the same moment to report as after a local
  // failure, and are stopped.
  void watch_other_nodes() {
    if (!agents() || stopping() || Clock::now() < next_check_) return;
    next_check_ = Clock::now() + kCheckEvery;
    auto failure = agent_call([&] {
      const std::string key = agent_key("failed");
      return agent_->check({key}) ? collie::to_string(agent_->get(key)) : std::string();
    });
    if (!failure || failure->empty()) return;
    take_remote_failure(*failure);
    std::fprintf(stderr,
                 "collie-run: the job failed on another node: %s; stopping this node's "
                 "ranks\n",
                 remote_failure_->c_str());
    if (!stop_sent_) stop_at_ = Clock::now() + kReportWindow;
  }

  void take_remote_failure(const std::string& value) {
    const size_t nl = value.find('\n');
    remote_exit_ = nl == std::string::npos ? 1 : std::atoi(value.substr(0, nl).c_str());
    if (remote_exit_ <= 0 || remote_exit_ > 255) remote_exit_ = 1;
    remote_failure_ = nl == std::string::npos ? value : value.substr(nl + 1);
  }

  // The round's failure key, unless another node's launcher wrote it first
  // (then that is the job's root cause).
  void publish(const std::string& value) {
    const auto now = agent_call([&] {
      return collie::to_string(
          agent_->compare_set(agent_key("failed"), {}, collie::to_bytes(value)));
    });
    if (now && *now != value) take_remote_failure(*now);
  }

  void publish_failure(const Rank& r) {
    char when[64];
    std::snprintf(when, sizeof when, "%.2f s after the %s", r.ended_s,
                  restarts_ > 0 ? "last restart" : "start");
    publish(std::to_string(exit_code(r.status)) + "\nrank " + std::to_string(r.rank) + " on " +
            node_name(a_.node_rank) + " (pid " + std::to_string(r.pid) + ") " + describe(r.status) +
            ", " + when);
  }

  void publish_stop() {
    const std::string what = "collie-run on " + node_name(a_.node_rank) + " was told to stop (" +
                             signal_name(stop_signal_) + ")";
    agent_call([&] {
      agent_->set("collie-run/stop", collie::to_bytes(what));
      return true;
    });
    publish(std::to_string(128 + stop_signal_) + "\n" + what);
  }

  // After this node's ranks have all ended: waits until every node's have
  // (a node whose ranks are still running is stopped within a second of a
  // failure being published, plus the grace period), then restarts with
  // every other node, or with none.
  bool restart_every_node() {
    handle_signals();
    if (agent_lost_) return false;
    const std::string mine = std::to_string(a_.node_rank);
    if (!agent_call([&] {
          agent_->set(agent_key("ended/" + mine), collie::to_bytes("1"));
          return true;
        }))
      return false;
    std::vector<std::string> ended;
    for (int k = 0; k < a_.nnodes; ++k) ended.push_back(agent_key("ended/" + std::to_string(k)));
    auto wait_for = a_.env.timeout + std::chrono::seconds(a_.grace_seconds + 10);
    Deadline limit = Clock::now() + wait_for;
    for (;;) {
      // Looked at every kCheckEvery (a parked wait that times out costs the
      // store client a new connection), with signals still answered.
      auto done = agent_call([&] { return agent_->check(ended); });
      if (!done) return false;
      if (*done) break;
      pollfd sig{sigfd_, POLLIN, 0};
      poll(&sig, 1, static_cast<int>(kCheckEvery.count()));
      handle_signals();
      if (stop_signal_) {
        // Told to stop: no waiting for anyone, but node 0's store stays
        // while the others end (for the grace period and a few seconds),
        // so that they hear why rather than lose it.
        if (a_.node_rank != 0) {
          agent_call([&] {
            agent_->set(agent_key("read/" + mine), collie::to_bytes("1"));
            return true;
          });
          return false;
        }
        const auto shorter = std::chrono::seconds(a_.grace_seconds + 5);
        if (Clock::now() + shorter < limit) {
          wait_for = shorter;
          limit = Clock::now() + shorter;
        }
      }
      if (Clock::now() >= limit) {
        std::string missing;
        for (int k = 0; k < a_.nnodes; ++k)
          if (!agent_call([&] { return agent_->check({ended[k]}); }).value_or(true))
            missing += (missing.empty() ? "" : ", ") + std::to_string(k);
        if (!stop_signal_)
          std::fprintf(stderr,
                       "collie-run: node(s) %s did not end round %d within %.0f s of this node "
                       "(their collie-run died or is cut off from node 0); no restart\n",
                       missing.c_str(), restarts_, std::chrono::duration<double>(wait_for).count());
        if (!first_failure_ && !remote_failure_ && !stop_signal_) {
          remote_failure_ =
              "node(s) " + missing + " never ended round " + std::to_string(restarts_);
          remote_exit_ = 1;
        }
        return false;
      }
    }
    // Every node wrote its failure, if it had one, before it ended.
    auto outcome = agent_call([&] {
      const std::string key = agent_key("failed");
      std::pair<std::string, bool> o{
          agent_->check({key}) ? collie::to_string(agent_->get(key)) : std::string(),
          agent_->check({"collie-run/stop"})};
      agent_->set(agent_key("read/" + mine), collie::to_bytes("1"));
      return o;
    });
    if (!outcome) return false;
    const auto& [failure, stopped] = *outcome;
    if (!failure.empty() && !first_failure_ && !remote_failure_) take_remote_failure(failure);
    const bool again = !failure.empty() && !stopped && !stop_signal_ && restarts_ < a_.max_restarts;
    if (!again) {
      // Node 0's store goes with it: let the others read the outcome first.
      if (a_.node_rank == 0) {
        std::vector<std::string> read;
        for (int k = 1; k < a_.nnodes; ++k) read.push_back(agent_key("read/" + std::to_string(k)));
        agent_call([&] {
          try {
            agent_->wait(read, std::chrono::seconds(5));
          } catch (const collie::Error&) {
          }
          return true;
        });
      }
      return false;
    }
    ++restarts_;
    const std::string root =
        remote_failure_ ? *remote_failure_ : failure.substr(failure.find('\n') + 1);
    write_all(STDERR_FILENO, "collie-run: the job's first failure: " + root +
                                 "; the ranks of all " + std::to_string(a_.nnodes) +
                                 " nodes have ended; " + attempt() + " with a fresh rendezvous\n");
    next_round();
    return true;
  }

  std::string attempt() const {
    return "restarting (attempt " + std::to_string(restarts_) + " of " +
           std::to_string(a_.max_restarts) + ")";
  }

  void wait_and_handle() {
    std::vector<pollfd> pfds{{sigfd_, POLLIN, 0}};
    std::vector<std::pair<Rank*, Stream*>> streams;
    for (Rank& r : ranks_)
      for (Stream* s : {&r.out, &r.err})
        if (s->fd >= 0) {
          pfds.push_back({s->fd, POLLIN, 0});
          streams.emplace_back(&r, s);
        }
    std::optional<Deadline> next = kill_at_;
    for (const auto& d : {drain_until_, stop_at_, watch_at()})
      if (d && (!next || *d < *next)) next = d;
    int timeout = next ? collie::net::poll_timeout_ms(*next) : -1;
    if (poll(pfds.data(), pfds.size(), timeout) < 0 && errno != EINTR) {
      std::perror("collie-run: poll");
      std::exit(1);
    }
    // Output first, so that lines written just before a rank exited are
    // printed before the launcher's word on that exit.
    for (size_t i = 1; i < pfds.size(); ++i)
      if (pfds[i].revents & (POLLIN | POLLHUP | POLLERR))
        relay(*streams[i - 1].first, *streams[i - 1].second);
    if (pfds[0].revents & POLLIN) handle_signals();
  }

  void handle_signals() {
    signalfd_siginfo info;
    while (read(sigfd_, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
      int sig = static_cast<int>(info.ssi_signo);
      if (sig == SIGCHLD) {
        reap();
        continue;
      }
      if (!stop_signal_) {
        stop_signal_ = sig;
        if (agents() && agent_) publish_stop();
      }
      stop_at_.reset();
      stop_sent_ = true;
      if (!kill_at_) kill_at_ = Clock::now() + std::chrono::seconds(a_.grace_seconds);
      signal_ranks(sig);
    }
  }

  // SIGCHLDs coalesce, so every running rank is asked, not just one.
  void reap() {
    for (Rank& r : ranks_) {
      int status = 0;
      if (!r.running || waitpid(r.pid, &status, WNOHANG) != r.pid) continue;
      r.running = false;
      r.status = status;
      r.ended_s = std::chrono::duration<double>(Clock::now() - started_).count();
      r.stopped = stop_sent_;
      bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
      // Once we are stopping the job, exits are our doing, not new failures.
      if (!failed || stopping()) continue;
      if (a_.keep_going) {
        lost_.push_back(static_cast<size_t>(&r - ranks_.data()));
        bool others = false;
        for (const Rank& o : ranks_) others = others || o.running;
        std::fprintf(stderr, "collie-run: rank %d %s%s\n", r.rank, describe(status).c_str(),
                     others ? "; --keep-going: the other ranks go on" : "");
        continue;
      }
      first_failure_ = status;
      root_cause_ = static_cast<size_t>(&r - ranks_.data());
      if (agents()) publish_failure(r);
      bool others = false;
      for (const Rank& o : ranks_) others = others || o.running;
      std::fprintf(stderr, "collie-run: rank %d %s%s\n", r.rank, describe(status).c_str(),
                   others ? "; stopping the other ranks" : "");
      // A moment for the others to end on their own, and say why, before
      // they are stopped: a peer's error (peer_lost, naming this rank) is
      // worth keeping.
      if (others) stop_at_ = Clock::now() + kReportWindow;
    }
  }

  // Asks every rank still running to stop, and kills them after the grace
  // period.
  void stop_ranks(int sig) {
    stop_sent_ = true;
    kill_at_ = Clock::now() + std::chrono::seconds(a_.grace_seconds);
    signal_ranks(sig);
  }

  bool stopping() const {
    return first_failure_.has_value() || stop_signal_ != 0 || remote_failure_.has_value();
  }

  // By process group (see exec_rank). A rank that has exited is still
  // signalled while its pipes are open: what holds them is its leftover
  // children, and they keep the group id from being reused.
  void signal_ranks(int sig) {
    for (const Rank& r : ranks_)
      if (r.running || r.out.fd >= 0 || r.err.fd >= 0)
        if (kill(-r.pid, sig) != 0 && r.running) kill(r.pid, sig);
  }

  // Output passes through pipes when lines get a prefix or go to log files.
  bool captures() const { return a_.prefix || !a_.log_dir.empty(); }

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

  // Flushes the unfinished last line and closes the pipe.
  void finish(Rank& r, Stream& s) {
    if (s.fd < 0) return;
    emit(r, s, true);
    close(s.fd);
    s.fd = -1;
  }

  // Writes the whole lines of `s.pending`, each with the rank's prefix, in
  // one write so that ranks' lines never interleave mid-line; keeps the last
  // ones for the summary and writes them to the rank's log file.
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

  // torchrun's failure summary, in collie-run's words: the rank that failed
  // first (the root cause), how it ended and its last lines; then what
  // became of every other rank of this node.
  void print_summary() const {
    std::string out = "collie-run: ---- the job failed ----\n";
    char when[64];
    const char* start = restarts_ > 0 ? "after the last restart" : "after the start";
    // The job's root cause is another node's when that node's launcher
    // wrote the round's failure first.
    const Rank* root = remote_failure_ ? nullptr : &ranks_[*root_cause_];
    if (root) {
      std::snprintf(when, sizeof when, "%.2f s %s", root->ended_s, start);
      out += "collie-run: root cause: rank " + std::to_string(root->rank) + " (pid " +
             std::to_string(root->pid) + "), the first to fail, " + describe(root->status) + ", " +
             when;
      out += root->tail.empty() ? std::string(captures() ? "; it printed nothing\n" : "\n")
                                : "; its last lines:\n";
      for (const std::string& l : root->tail) out += "collie-run:   " + l + "\n";
    } else {
      out += "collie-run: root cause, on another node: " + *remote_failure_ + "\n";
    }
    for (const Rank& r : ranks_) {
      if (&r == root) continue;
      const std::string who = "collie-run: rank " + std::to_string(r.rank);
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
    if (a_.max_restarts > 0) {
      const std::string used =
          std::to_string(restarts_) + " of " + std::to_string(a_.max_restarts) + " used";
      if (restarts_ >= a_.max_restarts)
        out += "collie-run: no restarts left: " + used + "\n";
      else if (stop_signal_)
        out += "collie-run: not restarted: collie-run was told to stop (" +
               signal_name(stop_signal_) + "); restarts " + used + "\n";
      else
        out += "collie-run: not restarted: the next round could not start (above); restarts " +
               used + "\n";
    }
    if (!a_.log_dir.empty())
      out += "collie-run: each rank's whole output: " + a_.log_dir + "/rank.<rank>.log\n";
    write_all(STDERR_FILENO, out);
  }

  // --keep-going, once every rank has ended: what became of each, and the
  // job's status: the first non-zero exit status, else failure when no
  // rank finished, else 0 (the survivors finished; the lost are named).
  int kept_going() const {
    std::string out = "collie-run: ---- --keep-going: ranks failed, the others went on ----\n";
    std::optional<int> failed_exit;
    bool finished = false;
    for (const Rank& r : ranks_) {
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
    if (!finished) return exit_code(ranks_[lost_.front()].status);
    return 0;
  }

  Args a_;
  int world_;
  std::string secret_;
  int port_ = -1;
  int store_port_ = -1;    // the port of the last round's store (node 0)
  int restarts_ = 0;       // rounds started again after a failure (--max-restarts)
  int torch_port_ = -1;    // MASTER_PORT: torch.distributed's own store, beside collie's
  collie::net::Fd store_;  // node 0: the store's listening socket until served
  std::unique_ptr<collie::TcpStoreServer> server_;  // node 0: this round's store
  // Several nodes with --max-restarts: this launcher's client of the job's
  // store, when it next looks there for a failure, whether it lost the
  // store, and the job's root cause when it was on another node (what, and
  // the exit status to end with).
  std::unique_ptr<collie::TcpStore> agent_;
  Deadline next_check_{};
  bool agent_lost_ = false;
  std::optional<std::string> remote_failure_;
  int remote_exit_ = 1;
  std::vector<size_t> lost_;  // --keep-going: ranks that failed
  sigset_t handled_{}, saved_mask_{};
  int sigfd_ = -1;
  std::vector<Rank> ranks_;
  std::optional<int> first_failure_;  // wait status of the first rank that failed
  int stop_signal_ = 0;               // first signal we were asked to stop with
  std::optional<Deadline> kill_at_;   // SIGKILL whatever is left at this time
  std::optional<Deadline> drain_until_;
  std::optional<Deadline> stop_at_;   // after the first failure: SIGTERM the rest then
  bool stop_sent_ = false;            // the ranks have been told to stop
  std::optional<size_t> root_cause_;  // index of the first rank that failed
  Clock::time_point started_;
};

}  // namespace

int main(int argc, char** argv) {
  Job job(parse_args(argc, argv));
  return job.run();
}
