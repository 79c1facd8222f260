// comm/launch/job_spares.cc: collie-run --elastic --spares K: K processes of
// the program started with the ranks, each waiting in its join
// (COLLIE_JOIN=1, COLLIE_SPARE=<id>) until a grow takes it in a lost rank's
// place, so that the survivors wait for a join and a hand-over, not for a
// process to start (a PyTorch program's import alone took 1.7 s). Each one
// taken or lost is started again (counted in --max-restarts); those never
// taken are stopped at the job's end. Whether a grow took a spare is in the
// job's store: the spare writes its queue ticket under config::spare_key,
// and whoever claims the ticket first (config::join_claim_key, by
// compare_set) owns it: the grow that takes the spare, or collie-run
// withdrawing a spare that ended untaken.
#include <signal.h>

#include <cstdio>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "base/config.h"
#include "base/log.h"
#include "collie/store.h"
#include "comm/launch/job.h"

namespace collie::launch {

bool Job::spawn_spare() {
  // Ids are per node and round: "<node>.<n>".
  spawning_spare_ = std::to_string(a_.node_rank) + "." + std::to_string(spares_started_++);
  joining_ = true;
  const bool ok = spawn(0);
  joining_ = false;
  spawning_spare_.clear();
  return ok;
}

std::optional<bool> Job::spare_taken(Rank& r, bool withdraw) {
  if (r.taken) return true;
  if (r.withdrawn) return false;
  auto ask = [&](collie::TcpStore& store) {
    const std::string at = ranks_key(collie::config::spare_key(r.spare));
    // Not in the queue yet: no grow can take it (a spare that ended
    // between taking its ticket and writing it here leaves a ticket no one
    // withdraws: a grow that takes it waits out its deadline).
    if (!store.check({at})) return false;
    const long long ticket = std::stoll(collie::to_string(store.get(at)));
    const std::string claim = ranks_key(collie::config::join_claim_key(ticket));
    std::string who;
    if (withdraw) {
      // Before any grow claims it (compare_set: exactly one of the two
      // wins), and its host name set where the spare never wrote it, so
      // that a grow waiting for it moves on to the next ticket.
      const std::string mine = "withdrawn: spare " + r.spare + " ended";
      who = collie::to_string(store.compare_set(claim, {}, collie::to_bytes(mine)));
      if (who == mine) {
        const std::string host = ranks_key(collie::config::join_ticket_key(ticket, "host"));
        if (!store.check({host})) store.set(host, collie::to_bytes(std::string("(withdrawn)")));
        r.withdrawn = true;
        return false;
      }
    } else if (store.check({claim})) {
      who = collie::to_string(store.get(claim));
    }
    return who.rfind("grow ", 0) == 0;
  };
  try {
    if (agents()) {
      // A lost store is watch_other_nodes()'s to report.
      if (!agent_ || agent_lost_) return std::nullopt;
      r.taken = ask(*agent_);
    } else {
      r.taken = ask(*ask_own_store());
    }
  } catch (const std::exception& e) {
    collie::log::info(std::string("collie-run: cannot tell whether spare ") + r.spare +
                      " was taken: " + e.what());
    return std::nullopt;
  }
  return r.taken;
}

bool Job::ranks_running() {
  for (Rank& o : ranks_)
    if (o.running && !o.released && (o.spare.empty() || spare_taken(o).value_or(true))) return true;
  return false;
}

void Job::check_spares() {
  // Every early return clears the moment: it is also poll()'s deadline.
  if (stopping()) {
    joiners_idle_at_.reset();
    return;
  }
  bool spares = false;
  for (const Rank& r : ranks_) {
    if (!r.running) continue;
    if (r.spare.empty()) {
      joiners_idle_at_.reset();  // a rank still runs: the job goes on
      return;
    }
    spares = spares || !r.released;
  }
  if (!spares) {
    joiners_idle_at_.reset();
    return;
  }
  // Once every rank started as one has ended: asked now, then once a
  // moment while a taken spare (a rank now) is still finishing, or the
  // store cannot tell, or (several nodes) another node's ranks still run.
  if (joiners_idle_at_ && Clock::now() < *joiners_idle_at_) return;
  joiners_idle_at_ = Clock::now() + kReportWindow;
  if (ranks_running()) return;
  // Several nodes: a grow may yet take this node's spares for another
  // node's lost rank, until every node's ranks have ended. Each says so in
  // the job's store (collie-run/round<r>/ranks_ended/<k>).
  if (agents()) {
    std::vector<std::string> every;
    for (int k = 0; k < a_.nnodes; ++k)
      every.push_back(agent_key("ranks_ended/" + std::to_string(k)));
    const auto all_ended = agent_call([&] {
      agent_->set(every[static_cast<size_t>(a_.node_rank)], collie::to_bytes(std::string("1")));
      return agent_->check(every);
    });
    if (!all_ended.value_or(false)) return;
  }
  int taken = 0;
  for (Rank& r : ranks_) taken += !r.spare.empty() && spare_taken(r).value_or(false);
  joiners_idle_at_.reset();
  // One node: a rank lost as the others finished was replaced by no one.
  if (a_.nnodes == 1 && taken < losses_ && lost_last_)
    return round_again_for_lost("every other rank has ended and no spare took " +
                                ranks_[*lost_last_].name() +
                                "'s place (it was lost as the others finished); starting the "
                                "round again");
  // The spares no grow took: stopped, and their end is no failure.
  int released = 0;
  for (Rank& r : ranks_)
    if (r.running && !r.released) {
      r.released = true;
      ++released;
      if (kill(-r.pid, SIGTERM) != 0) kill(r.pid, SIGTERM);
      if (kill(-r.pid, SIGCONT) != 0) kill(r.pid, SIGCONT);
    }
  kill_at_ = Clock::now() + std::chrono::seconds(a_.grace_seconds);
  collie::log::info("collie-run: every rank has ended; stopping the " + std::to_string(released) +
                    " spares no grow took");
}

}  // namespace collie::launch
