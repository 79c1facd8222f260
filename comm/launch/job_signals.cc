// comm/launch/job_signals.cc: the supervisor's loop: waiting on the ranks'
// output, signals and deadlines; reaping ranks that ended; stopping the
// rest (SIGTERM, then SIGKILL after the grace period), by process group.
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
#include "comm/launch/job.h"

namespace collie::launch {

void Job::wait_and_handle() {
  std::vector<pollfd> pfds{{sigfd_, POLLIN, 0}};
  std::vector<std::pair<Rank*, Stream*>> streams;
  for (Rank& r : ranks_)
    for (Stream* s : {&r.out, &r.err})
      if (s->fd >= 0) {
        pfds.push_back({s->fd, POLLIN, 0});
        streams.emplace_back(&r, s);
      }
  std::optional<Deadline> next = kill_at_;
  for (const auto& d :
       {drain_until_, stop_at_, watch_at(), stopping() ? std::nullopt : joiners_idle_at_})
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

void Job::handle_signals() {
  signalfd_siginfo info;
  while (read(sigfd_, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
    int sig = static_cast<int>(info.ssi_signo);
    if (sig == SIGCHLD) {
      reap();
      start_replacements();
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
void Job::reap() {
  for (Rank& r : ranks_) {
    int status = 0;
    if (!r.running || waitpid(r.pid, &status, WNOHANG) != r.pid) continue;
    r.running = false;
    r.status = status;
    r.ended_s = std::chrono::duration<double>(Clock::now() - started_).count();
    r.stopped = stop_sent_;
    bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    // Once we are stopping the job, exits are our doing, not new failures;
    // so are those of the spares stopped, never taken, at its end.
    if (!failed || stopping() || r.released) continue;
    // A spare no grow took is no rank of the job: its ticket is withdrawn
    // from the queue (no grow takes it after), another starts in its place
    // while ranks still run, and the job goes on. One the store cannot
    // tell about counts as a rank lost.
    if (!r.spare.empty() && !spare_taken(r, true).value_or(true)) {
      const auto number = ranks_running() ? take_replacement() : std::optional<int>{};
      std::fprintf(stderr, "collie-run: spare %s %s before a grow took it; %s\n", r.spare.c_str(),
                   describe(status).c_str(),
                   number ? ("--elastic: starting another (" + std::to_string(*number) + " of " +
                             std::to_string(a_.max_restarts) + ")")
                                .c_str()
                          : "no other starts");
      if (number) to_replace_.emplace_back(-1, *number);
      continue;
    }
    // On this node, still running: anything (to be stopped on a failure),
    // and a rank of the job (not a spare no grow took).
    bool others = false;
    for (const Rank& o : ranks_) others = others || (o.running && !o.released);
    // On one node, a rank lost once every other has ended has no one left
    // to join (a replacement would wait out its deadline for a grow; a
    // spare, for ever).
    const bool alone = a_.nnodes == 1 && !ranks_running();
    if (a_.elastic && (alone || !world_formed())) {
      round_again_ = true;
      std::fprintf(stderr, "collie-run: --elastic: %s was lost %s; starting the round again\n",
                   r.name().c_str(),
                   alone ? "after every other rank had ended: no one is left for a replacement "
                           "to join"
                         : "before every rank was in the job's world");
    } else if (a_.elastic) {
      if (const auto number = take_replacement()) {
        // With spares, a waiting one takes the lost rank's place, and
        // another spare starts for the next.
        const int local = a_.spares > 0 ? -1 : r.rank - a_.node_rank * a_.nproc;
        to_replace_.emplace_back(local, *number);
        lost_last_ = static_cast<size_t>(&r - ranks_.data());
        ++losses_;
        if (a_.spares > 0)
          std::fprintf(stderr,
                       "collie-run: %s %s; --elastic: a waiting spare takes its place, and "
                       "another starts (%d of %d)\n",
                       r.name().c_str(), describe(status).c_str(), *number, a_.max_restarts);
        else
          std::fprintf(stderr,
                       "collie-run: rank %d %s; --elastic: starting it again (%d of %d) to join "
                       "the others\n",
                       r.rank, describe(status).c_str(), *number, a_.max_restarts);
        continue;
      }
    }
    if (a_.keep_going) {
      lost_.push_back(static_cast<size_t>(&r - ranks_.data()));
      std::fprintf(stderr, "collie-run: %s %s%s\n", r.name().c_str(), describe(status).c_str(),
                   others ? "; --keep-going: the other ranks go on" : "");
      continue;
    }
    first_failure_ = status;
    root_cause_ = static_cast<size_t>(&r - ranks_.data());
    if (agents()) publish_failure(r);
    std::fprintf(stderr, "collie-run: %s %s%s\n", r.name().c_str(), describe(status).c_str(),
                 others ? "; stopping the other ranks" : "");
    // A moment for the others to end on their own, and say why, before
    // they are stopped: a peer's error (peer_lost, naming this rank) is
    // worth keeping.
    if (others) stop_at_ = Clock::now() + kReportWindow;
  }
}

void Job::start_replacements() {
  for (const auto& [local, number] : to_replace_) {
    if (stopping()) break;
    replacements_ = number;
    bool ok = false;
    if (local < 0) {
      ok = spawn_spare();
    } else {
      joining_ = true;
      ok = spawn(local);
      joining_ = false;
    }
    if (!ok) {
      const std::string who =
          local < 0 ? "a spare" : "rank " + std::to_string(a_.node_rank * a_.nproc + local);
      std::fprintf(stderr, "collie-run: --elastic: %s could not be started\n", who.c_str());
      first_failure_ = 1 << 8;  // exit status 1
      // The other nodes' launchers stop their ranks too.
      if (agents())
        publish("1\n" + who + " on " + node_name(a_.node_rank) +
                " could not be started (--elastic)");
      stop_ranks(SIGTERM);
      break;
    }
  }
  to_replace_.clear();
}

void Job::check_waiting_joiners() {
  if (a_.spares > 0) return check_spares();
  // Every early return clears the moment: it is also poll()'s deadline.
  if (!a_.elastic || a_.nnodes > 1 || !lost_last_ || stopping()) {
    joiners_idle_at_.reset();
    return;
  }
  bool joiners = false;
  for (const Rank& r : ranks_) {
    if (r.running && !r.joiner) {
      joiners_idle_at_.reset();  // the job goes on: a grow may yet take them
      return;
    }
    joiners = joiners || (r.running && r.joiner);
  }
  if (!joiners) {
    joiners_idle_at_.reset();
    return;
  }
  // A replacement that was taken ends with the others, within the moment;
  // one that waits has queued in the store and no grow took it. (One not
  // yet queued, still starting, is looked at again a moment later.)
  if (!joiners_idle_at_) joiners_idle_at_ = Clock::now() + kReportWindow;
  if (Clock::now() < *joiners_idle_at_) return;
  joiners_idle_at_ = Clock::now() + kReportWindow;
  if (!joiners_waiting()) return;
  const Rank& lost = ranks_[*lost_last_];
  round_again_for_lost("every other rank has ended and rank " + std::to_string(lost.rank) +
                       "'s replacement was never taken (rank " + std::to_string(lost.rank) +
                       " was lost as the others finished); stopping it and starting the round "
                       "again");
}

void Job::round_again_for_lost(const std::string& why) {
  std::fprintf(stderr, "collie-run: --elastic: %s\n", why.c_str());
  if (replacements_ > 0) --replacements_;
  round_again_ = true;
  first_failure_ = ranks_[*lost_last_].status;
  root_cause_ = lost_last_;
  joiners_idle_at_.reset();
  stop_ranks(SIGTERM);
}

// Asks every rank still running to stop, and kills them after the grace
// period.
void Job::stop_ranks(int sig) {
  stop_sent_ = true;
  kill_at_ = Clock::now() + std::chrono::seconds(a_.grace_seconds);
  signal_ranks(sig);
}

// By process group (see exec_rank). A rank that has exited is still
// signalled while its pipes are open: what holds them is its leftover
// children, and they keep the group id from being reused. Every signal but
// SIGKILL is followed by SIGCONT, as systemd does: a stopped process
// (SIGSTOP, SIGTSTP, a debugger gone) holds SIGTERM pending until it is
// continued, and a job with a stopped rank ended only at the grace
// period's SIGKILL, 5 s later.
void Job::signal_ranks(int sig) {
  for (const Rank& r : ranks_)
    if (r.running || r.out.fd >= 0 || r.err.fd >= 0) {
      if (kill(-r.pid, sig) != 0 && r.running) kill(r.pid, sig);
      if (sig != SIGKILL && kill(-r.pid, SIGCONT) != 0 && r.running) kill(r.pid, SIGCONT);
    }
}

}  // namespace collie::launch
