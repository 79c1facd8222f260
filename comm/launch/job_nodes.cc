// comm/launch/job_nodes.cc: several nodes with --max-restarts: the
// launchers agree through the store that node 0's launcher serves for the
// whole job (as torchrun's agents do through their rendezvous). Keys:
//   collie-run/round<r>/failed     the round's first failure: "<exit code>\n<what>"
//   collie-run/round<r>/ended/<k>  node k's ranks have all ended
//   collie-run/round<r>/read/<k>   node k has read the round's outcome
//   collie-run/stop                a launcher was told to stop: no more rounds
//   collie-run/replacements        --elastic: ranks started again in the job so far
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

// Connects this launcher to the job's store. A node started before node
// 0's launcher waits for it (up to the timeout), in slices, so that
// SIGINT still ends the wait.
bool Job::join_agents() {
  if (!agents()) return true;
  const collie::StoreAuth auth{secret_,
                               collie::config::job_identity(collie::config::process_env(), world_)};
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

// Whether another node's rank failed (or its launcher was told to stop):
// then this node's ranks get the same moment to report as after a local
// failure, and are stopped.
void Job::watch_other_nodes() {
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

void Job::take_remote_failure(const std::string& value) {
  const size_t nl = value.find('\n');
  remote_exit_ = nl == std::string::npos ? 1 : std::atoi(value.substr(0, nl).c_str());
  if (remote_exit_ <= 0 || remote_exit_ > 255) remote_exit_ = 1;
  remote_failure_ = nl == std::string::npos ? value : value.substr(nl + 1);
}

// The round's failure key, unless another node's launcher wrote it first
// (then that is the job's root cause).
void Job::publish(const std::string& value) {
  const auto now = agent_call([&] {
    return collie::to_string(agent_->compare_set(agent_key("failed"), {}, collie::to_bytes(value)));
  });
  if (now && *now != value) take_remote_failure(*now);
}

// --elastic: the single-node count is this launcher's; on several nodes
// every launcher draws from one count in the job's store.
std::optional<int> Job::take_replacement() {
  // One budget: rounds started again (restarts_) and ranks replaced
  // together at most M.
  if (!agents()) {
    const int next = replacements_ + static_cast<int>(to_replace_.size()) + 1;
    return next + restarts_ <= a_.max_restarts ? std::optional<int>(next) : std::nullopt;
  }
  // A count in the store only grows: a launcher that draws past M has
  // taken nothing, and the job fails as without --elastic.
  const auto drawn = agent_call([&] { return agent_->add("collie-run/replacements", 1); });
  if (!drawn) return std::nullopt;
  if (*drawn + restarts_ > a_.max_restarts) {
    replacements_ = a_.max_restarts;  // every one was taken, if not by this node
    return std::nullopt;
  }
  return static_cast<int>(*drawn);
}

// A client of node 0's own store for one question (asked only when a rank
// fails or replacements idle), not kept: the launcher's descriptors stay
// as they were. Throws collie::Error when the store cannot be reached.
std::unique_ptr<collie::TcpStore> Job::ask_own_store() {
  if (!server_) throw collie::Error(collie::ErrorCode::unavailable, "no store served here");
  const collie::StoreAuth auth{secret_,
                               collie::config::job_identity(collie::config::process_env(), world_)};
  // Where the store listens: on one node, --master-addr's address; on
  // several, every interface, 127.0.0.1 among them (node 0 may not reach
  // the address it gives the others: NAT).
  return collie::TcpStore::connect(a_.nnodes == 1 ? a_.master_addr : "127.0.0.1", server_->port(),
                                   auth, std::chrono::seconds(2), "collie-run", "collie-run");
}

std::vector<std::string> Job::world_formed_keys() const {
  std::vector<std::string> keys;
  for (int r = 0; r < world_; ++r) keys.push_back(ranks_key(collie::config::world_formed_key(r)));
  return keys;
}

bool Job::world_formed() {
  const std::vector<std::string> keys = world_formed_keys();
  if (agents()) return agent_call([&] { return agent_->check(keys); }).value_or(false);
  try {
    return ask_own_store()->check(keys);
  } catch (const collie::Error& e) {
    // Cannot tell: start the round again, the safe way, and say why.
    std::fprintf(stderr,
                 "collie-run: --elastic: cannot ask the job's store whether the world "
                 "formed (%s); taking it as not formed\n",
                 e.what());
    return false;
  }
}

bool Job::joiners_waiting() {
  try {
    auto store = ask_own_store();
    return store->add(ranks_key(collie::config::kJoinQueued), 0) >
           store->add(ranks_key(collie::config::kJoinTaken), 0);
  } catch (const collie::Error&) {
    return false;  // cannot tell: leave them to their own deadline
  }
}

void Job::publish_failure(const Rank& r) {
  char when[64];
  std::snprintf(when, sizeof when, "%.2f s after the %s", r.ended_s,
                restarts_ > 0 ? "last restart" : "start");
  publish(std::to_string(exit_code(r.status)) + "\n" + r.name() + " on " + node_name(a_.node_rank) +
          " (pid " + std::to_string(r.pid) + ") " + describe(r.status) + ", " + when);
}

void Job::publish_stop() {
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
bool Job::restart_every_node() {
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
        remote_failure_ = "node(s) " + missing + " never ended round " + std::to_string(restarts_);
        remote_exit_ = 1;
      }
      return false;
    }
  }
  // Every node wrote its failure, if it had one, before it ended.
  // Everything the decision needs is read before this node says it has
  // read: node 0's store may go once every node has.
  struct Outcome {
    std::string failure;
    bool stopped = false, formed = false;
    int64_t replaced = 0;  // --elastic: ranks started again in the job
  };
  auto outcome = agent_call([&] {
    const std::string key = agent_key("failed");
    Outcome o;
    o.failure = agent_->check({key}) ? collie::to_string(agent_->get(key)) : std::string();
    o.stopped = agent_->check({"collie-run/stop"});
    if (a_.elastic) {
      o.formed = agent_->check(world_formed_keys());
      o.replaced = std::min<int64_t>(agent_->add("collie-run/replacements", 0), a_.max_restarts);
    }
    agent_->set(agent_key("read/" + mine), collie::to_bytes("1"));
    return o;
  });
  if (!outcome) return false;
  const std::string& failure = outcome->failure;
  const bool stopped = outcome->stopped;
  if (!failure.empty() && !first_failure_ && !remote_failure_) take_remote_failure(failure);
  // --elastic restarts the round only for a rank lost before its world
  // formed, and M counts its replacements too; every node reads the same
  // keys, so all decide alike.
  const bool again = (!a_.elastic || !outcome->formed) && !failure.empty() && !stopped &&
                     !stop_signal_ && restarts_ + outcome->replaced < a_.max_restarts;
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
  write_all(STDERR_FILENO, "collie-run: the job's first failure: " + root + "; the ranks of all " +
                               std::to_string(a_.nnodes) + " nodes have ended; " + attempt() +
                               " with a fresh rendezvous\n");
  next_round();
  return true;
}

}  // namespace collie::launch
