// comm/launch/job.h: collie-run's job on this node: its rounds (store,
// spawn, supervise, restart: job.cc), the agreement of several nodes'
// launchers through the job's store (job_nodes.cc), and signals, reaping
// and stopping ranks (job_signals.cc), --elastic's warm spares
// (job_spares.cc). comm/launch/collie_run.cc says what collie-run does and
// why.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "collie/store.h"
#include "comm/launch/args.h"
#include "comm/launch/process.h"
#include "comm/launch/rank_output.h"
#include "comm/launch/summary.h"
#include "comm/net/socket.h"

namespace collie::launch {

using net::Clock;
using net::Deadline;

inline constexpr auto kPipeDrain = std::chrono::seconds(2);
// After the first failure, how long the other ranks have to end on their
// own (and say why) before they are stopped.
inline constexpr auto kReportWindow = std::chrono::seconds(1);
// Several nodes with --max-restarts: how often a launcher looks in the store
// for a failure on another node (torchrun's agents poll at 0.1 to 5 s).
inline constexpr auto kCheckEvery = std::chrono::milliseconds(200);

class Job {
 public:
  explicit Job(Args a) : a_(std::move(a)), world_(a_.nnodes * a_.nproc) {}

  int run();

 private:
  // Several ranks on one host each start a thread pool (OpenMP, OpenBLAS for
  // PowerSGD) as wide as the machine, and then oversubscribe it: with two
  // ranks on two cores, PowerSGD's arithmetic ran 25% slower. Like torchrun,
  // give each rank its share unless the user chose: OMP_NUM_THREADS (which
  // OpenBLAS also reads) = CPUs / ranks on this host, at least 1.
  void share_cpus();

  // Everything that can refuse the job before any rank starts.
  bool prepare();

  // Node 0: the store's listening socket for this round, on the given port
  // or a new one the kernel picks, and MASTER_PORT for torch.distributed.
  bool open_store();

  // Node 0: serves the round's store from collie-run itself, on the socket
  // open_store() bound, so that it outlives every rank (rank 0 included).
  // Started once prepare() has blocked the handled signals, so that the
  // server's thread inherits the mask and never takes a SIGCHLD meant for
  // the signalfd. The last round's server goes first.
  bool serve_store();

  bool spawn(int local);

  [[noreturn]] void exec_rank(const Rank& r, int local, pid_t launcher, int out, int err);

  // Supervises one round until every rank has ended and its output is read.
  void supervise();

  // After a round: whether a failure is to be answered by another round,
  // and if so, a fresh rendezvous for it and the round's state cleared. A
  // stop asked of collie-run (SIGINT, SIGTERM, SIGHUP) is never restarted,
  // nor is a round whose ranks all finished.
  bool restart();

  // The round's state cleared for the next one.
  void next_round();

  // ---- Several nodes with --max-restarts: the launchers agree through
  // the store that node 0's launcher serves for the whole job. Keys:
  //   collie-run/round<r>/failed     the round's first failure: "<exit code>\n<what>"
  //   collie-run/round<r>/ended/<k>  node k's ranks have all ended
  //   collie-run/round<r>/read/<k>   node k has read the round's outcome
  //   collie-run/stop                a launcher was told to stop: no more rounds
  //   collie-run/replacements        --elastic: ranks started again in the job so far

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
  // A key the ranks write in the launcher's store, as they see it: under
  // this round's prefix (COLLIE_STORE_PREFIX) where the job keeps one store.
  std::string ranks_key(const std::string& key) const {
    return store_for_the_job() ? round_key(key) : key;
  }
  std::string node_name(int k) const { return "node " + std::to_string(k); }

  // Connects this launcher to the job's store. A node started before node
  // 0's launcher waits for it (up to the timeout), in slices, so that
  // SIGINT still ends the wait.
  bool join_agents();

  // One request to the job's store. A store that is gone (node 0's
  // launcher died, or the network to it) ends the job on this node: its
  // ranks are stopped and there is no next round.
  template <class F>
  auto agent_call(F&& f) -> std::optional<decltype(f())>;

  std::optional<Deadline> watch_at() const {
    return agents() && !stopping() ? std::optional<Deadline>(next_check_) : std::nullopt;
  }

  // Whether another node's rank failed (or its launcher was told to stop):
  // then this node's ranks get the same moment to report as after a local
  // failure, and are stopped.
  void watch_other_nodes();

  void take_remote_failure(const std::string& value);

  // The round's failure key, unless another node's launcher wrote it first
  // (then that is the job's root cause).
  void publish(const std::string& value);

  void publish_failure(const Rank& r);

  void publish_stop();

  // After this node's ranks have all ended: waits until every node's have
  // (a node whose ranks are still running is stopped within a second of a
  // failure being published, plus the grace period), then restarts with
  // every other node, or with none.
  bool restart_every_node();

  std::string attempt() const {
    return "restarting (attempt " + std::to_string(restarts_) + " of " +
           std::to_string(a_.max_restarts) + ")";
  }

  void wait_and_handle();

  void handle_signals();

  // SIGCHLDs coalesce, so every running rank is asked, not just one.
  void reap();

  // --elastic: whether one more rank may be started again, up to M in all:
  // counted by this launcher alone, or on several nodes in the job's store
  // (every node's launcher draws from the one count). Returns its number
  // in the job (1 for the first), or nothing when none are left.
  std::optional<int> take_replacement();

  // --elastic: whether every rank of this round is in the job's world
  // communicator (each set config::world_formed_key in the store). A rank
  // lost before that cannot be grown back: the others still wait for it in
  // the rendezvous, so the round starts again instead.
  bool world_formed();
  std::vector<std::string> world_formed_keys() const;
  std::unique_ptr<collie::TcpStore> ask_own_store();

  // --elastic: starts a rank again alone for each that reap() took as
  // lost, to join the running job (COLLIE_JOIN=1); with --spares, a spare
  // for each lost rank (or spare) instead, a waiting one taking its place.
  void start_replacements();

  // --elastic, one node: once every rank but the replacements has ended,
  // a replacement still running a moment later was never taken (the rank
  // it replaces was lost as the others finished) and never will be: it is
  // stopped, and the lost rank's failure starts the round again.
  void check_waiting_joiners();
  // Whether a process has queued to join (collie/join/queued in the round's
  // store) that no grow has taken (collie/join/taken): comm/front/grow.cc.
  bool joiners_waiting();

  // --spares K: starts one more spare (COLLIE_JOIN=1, COLLIE_SPARE=<id>):
  // a process of the program that waits in its join until a grow takes it.
  bool spawn_spare();
  // Whether a grow took spare `r` (its ticket, under config::spare_key in
  // the round's store, was claimed by a grow: config::join_claim_key);
  // asked of the store until it says yes, then remembered; nullopt when the
  // store cannot tell. With `withdraw` (the spare has ended), a ticket no
  // grow has claimed is withdrawn in the same step, so that no grow takes
  // it afterwards.
  std::optional<bool> spare_taken(Rank& r, bool withdraw = false);
  // Whether a rank of the job runs on this node: one started as a rank, or
  // a spare a grow took (or one the store cannot tell about).
  bool ranks_running();
  // --spares, once every rank but the spares has ended: the spares no grow
  // took are stopped (not a failure); on one node, when a rank lost after
  // the world formed was never replaced (lost as the others finished), the
  // round starts again instead, as without spares.
  void check_spares();
  // The end of both: the rank lost last (lost_last_) was never replaced,
  // because it was lost as the others finished. Says so (`why`, after
  // "collie-run: --elastic: "), gives the unanswered replacement back to M
  // (the round again is the one restart the loss costs), and stops the
  // ranks so that the lost rank's failure starts the round again.
  void round_again_for_lost(const std::string& why);

  // Asks every rank still running to stop, and kills them after the grace
  // period.
  void stop_ranks(int sig);

  bool stopping() const {
    return first_failure_.has_value() || stop_signal_ != 0 || remote_failure_.has_value();
  }

  // By process group (see exec_rank). A rank that has exited is still
  // signalled while its pipes are open: what holds them is its leftover
  // children, and they keep the group id from being reused.
  void signal_ranks(int sig);

  // Output passes through pipes when lines get a prefix or go to log files.
  bool captures() const { return a_.prefix || !a_.log_dir.empty(); }

  // Node 0, after a job whose ranks all ended well: which rank arrived
  // last at the world communicator's collectives (job_arrivals.cc).
  void report_arrivals();

  void print_summary() const {
    collie::launch::print_summary({ranks_, root_cause_, remote_failure_, restarts_, a_.max_restarts,
                                   a_.elastic, replacements_, stop_signal_, captures(),
                                   a_.log_dir});
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
  // --elastic: ranks started again alone so far in the job (the number of
  // the last one this node started), the local indices waiting to be with
  // their numbers, and whether the rank being spawned is one (it joins).
  int replacements_ = 0;
  std::vector<std::pair<int, int>> to_replace_;
  // --elastic: the round's first failure came before its world formed (or
  // after every other rank ended), so the round starts again as without
  // --elastic.
  bool round_again_ = false;
  // --elastic: the rank last replaced (an index into ranks_), and when
  // replacements still running are taken to be waiting for nobody.
  std::optional<size_t> lost_last_;
  std::optional<Deadline> joiners_idle_at_;
  bool joining_ = false;
  // --spares: the id of the spare being spawned ("" for a rank), how many
  // this node has started in the round, and the ranks lost after the world
  // formed whose places spares were to take (one node: the round starts
  // again when fewer spares were taken).
  std::string spawning_spare_;
  int spares_started_ = 0;
  int losses_ = 0;
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

// In the header: job_nodes.cc and job_spares.cc both ask the job's store.
template <class F>
auto Job::agent_call(F&& f) -> std::optional<decltype(f())> {
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

}  // namespace collie::launch
