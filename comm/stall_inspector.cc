// comm/stall_inspector.cc: see stall_inspector.h.
#include "comm/stall_inspector.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "base/log.h"
#include "base/trace.h"
#include "comm/backend.h"

namespace collie {

namespace {

using std::chrono::milliseconds;

// What the watcher and explain() share; the watcher holds it, so that a
// watcher left behind (its stop could not reach the store) touches nothing
// freed.
struct Progress {
  std::atomic<uint32_t> issued{0}, completed{0};
  // When `completed` last moved (steady clock, ns): the last time this
  // rank saw every other rank, since each took part in that collective.
  std::atomic<int64_t> completed_ns{0};
};

std::string state_of(uint32_t issued, uint32_t completed) {
  return std::to_string(issued) + " " + std::to_string(completed);
}

}  // namespace

struct StallInspector::Shared : Progress {};

std::string describe_positions(uint32_t n, const std::vector<RankPosition>& at,
                               const std::string& silent_says) {
  // Group the ranks that are where they should be; say the rest one by one.
  std::vector<int> waiting, finished, silent;
  std::vector<std::string> late;
  for (int q = 0; q < static_cast<int>(at.size()); ++q) {
    const RankPosition& s = at[static_cast<size_t>(q)];
    const std::string rq = "rank " + std::to_string(q);
    const std::string process = " (its process is " + s.process + ")";
    if (!s.known)
      silent.push_back(q);
    else if (s.completed >= n)
      finished.push_back(q);
    else if (s.issued >= n)
      waiting.push_back(q);
    else if (s.issued > s.completed)
      late.push_back(rq + " is still in #" + std::to_string(s.completed + 1) +
                     " and has not called #" + std::to_string(n) + process);
    else
      late.push_back(rq + " last completed #" + std::to_string(s.completed) +
                     " and has not called #" + std::to_string(n) + process);
  }
  RankNames names;
  auto ranks = [&](const std::vector<int>& v) {
    return std::string(v.size() > 1 ? "ranks " : "rank ") + names.list(v);
  };
  std::vector<std::string> parts;
  if (!waiting.empty())
    parts.push_back(ranks(waiting) + (waiting.size() > 1 ? " wait" : " waits") + " in #" +
                    std::to_string(n));
  for (auto& l : late) parts.push_back(l);
  if (!finished.empty())
    parts.push_back(ranks(finished) + (finished.size() > 1 ? " have" : " has") + " finished #" +
                    std::to_string(n));
  if (!silent.empty()) parts.push_back(ranks(silent) + " " + silent_says);
  std::string report;
  for (size_t i = 0; i < parts.size(); ++i) report += (i ? "; " : "") + parts[i];
  return report;
}

StallInspector::StallInspector(std::shared_ptr<Store> store, std::string key, int rank, int size,
                               milliseconds timeout)
    : store_(std::move(store)),
      key_(std::move(key)),
      rank_(rank),
      size_(size),
      timeout_(timeout),
      progress_(std::make_shared<Shared>()) {
  std::shared_ptr<Store> watch;
  try {
    watch = store_->connect_again();
  } catch (const Error& e) {
    log::info("rank " + std::to_string(rank) + ": no stall watcher (" + e.what() + ")");
  }
  if (!watch) return;
  watcher_ = std::thread([watch, progress = progress_, ask = ask_key(rank),
                          state = state_key(rank)] {
    // One answer: after a timeout the communicator has failed.
    for (;;) {
      try {
        watch->wait({ask}, std::chrono::hours(24));
      } catch (const Error& e) {
        if (e.code() == ErrorCode::timeout) continue;
        return;  // the store is gone (the job is ending, or rank 0 died)
      }
      try {
        if (to_string(watch->get(ask)) == "stop") return;
        watch->set(state, to_bytes(state_of(progress->issued.load(std::memory_order_relaxed),
                                            progress->completed.load(std::memory_order_relaxed))));
      } catch (const Error&) {
      }
      return;
    }
  });
}

std::shared_ptr<StallInspector> StallInspector::start(std::shared_ptr<Store> store, std::string key,
                                                      int rank, int size, milliseconds timeout) {
  if (!store || size < 2) return nullptr;
  return std::shared_ptr<StallInspector>(
      new StallInspector(std::move(store), std::move(key), rank, size, timeout));
}

StallInspector::~StallInspector() {
  stop();
}

void StallInspector::stop() {
  if (stopped_) return;
  stopped_ = true;
  if (!watcher_.joinable()) return;
  // Within the inspection's budget, and not at all when an inspection found
  // the store out of reach: with the link to rank 0's host down, the
  // store's own deadline (COLLIE_TIMEOUT) held every rank there that long
  // at exit, after it had reported its error.
  if (!unreachable_.load()) {
    try {
      store_->set(ask_key(rank_), to_bytes("stop"), budget());
      watcher_.join();
      return;
    } catch (const Error&) {
    }
  }
  // The store cannot be reached: the watcher's own wait ends with it, or
  // with the process. It owns everything it touches.
  watcher_.detach();
}

milliseconds StallInspector::budget() const {
  return std::clamp(timeout_ / 4, milliseconds(500), milliseconds(750));
}

void StallInspector::issued(uint32_t seq) {
  progress_->issued.store(seq, std::memory_order_relaxed);
}

void StallInspector::completed(uint32_t seq) {
  // Collectives complete in issue order, one at a time (the executor runs
  // one op at a time), so this thread is the only writer: a load and a
  // store, not a compare-exchange loop (a locked instruction per op); the
  // check keeps a late store harmless.
  auto& c = progress_->completed;
  if (c.load(std::memory_order_relaxed) < seq) {
    c.store(seq, std::memory_order_relaxed);
    progress_->completed_ns.store(trace::now(), std::memory_order_relaxed);
  }
}

uint32_t StallInspector::last_completed() const {
  return progress_->completed.load(std::memory_order_relaxed);
}

std::string StallInspector::ask_key(int q) const {
  return key_ + "/stall/ask/" + std::to_string(q);
}
std::string StallInspector::state_key(int q) const {
  return key_ + "/stall/state/" + std::to_string(q);
}
std::string StallInspector::report_key() const {
  return key_ + "/stall/report";
}

Error StallInspector::explain(const OpDesc& desc, const Error& e) {
  const auto budget = this->budget();
  const auto until = std::chrono::steady_clock::now() + budget;
  auto left = [&] {
    auto l = std::chrono::duration_cast<milliseconds>(until - std::chrono::steady_clock::now());
    return std::max(l, milliseconds(1));
  };
  const uint32_t n = desc.seq;
  std::vector<RankPosition> st(static_cast<size_t>(size_));
  st[static_cast<size_t>(rank_)] = {true, progress_->issued.load(std::memory_order_relaxed),
                                    progress_->completed.load(std::memory_order_relaxed)};
  auto with = [&](const std::string& report) {
    return Error(e.code(), std::string(e.what()) +
                               ". Where the ranks are (asked through the store): " + report);
  };
  try {
    // The ranks whose deadlines pass together ask once: the first report
    // stands for all of them, and every rank's error says the same.
    try {
      return with(to_string(store_->get(report_key(), milliseconds(1))));
    } catch (const Error& r) {
      if (r.code() != ErrorCode::timeout) throw;
    }
    // Within the budget: a rank cut off from rank 0's host (a link down)
    // used to wait the store's whole deadline here, and so report its
    // timeout only at twice COLLIE_TIMEOUT.
    for (int q = 0; q < size_; ++q)
      if (q != rank_) store_->set(ask_key(q), to_bytes("#" + std::to_string(n)), left());
  } catch (const Error& s) {
    unreachable_.store(true);
    return Error(e.code(), std::string(e.what()) +
                               "; the store could not be reached to ask the other ranks where "
                               "they are (this rank is cut off from the store's host, or the "
                               "process that serves it, rank 0 or collie-run, is dead or "
                               "stopped): " +
                               s.what());
  }
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    try {
      std::string v = to_string(store_->get(state_key(q), left()));
      unsigned long long i = 0, c = 0;
      if (std::sscanf(v.c_str(), "%llu %llu", &i, &c) == 2)
        st[static_cast<size_t>(q)] = {true, static_cast<uint32_t>(i), static_cast<uint32_t>(c)};
    } catch (const Error&) {
    }
  }

  std::string silent_says = "did not answer within " + log::seconds(budget) +
                            " (dead, stopped, or cut off from the store)";
  // When they were last seen: the end of the collective before #n here,
  // which every rank took part in (when this rank completed it).
  const uint32_t last = progress_->completed.load(std::memory_order_relaxed);
  const int64_t at = progress_->completed_ns.load(std::memory_order_relaxed);
  if (last + 1 == n && at > 0)
    silent_says += "; last seen in #" + std::to_string(last) + ", which ended on rank " +
                   std::to_string(rank_) + " " +
                   log::seconds(milliseconds((trace::now() - at) / 100000000 * 100)) +
                   " before this report";
  std::string report = describe_positions(n, st, silent_says);
  try {
    report = to_string(store_->compare_set(report_key(), {}, to_bytes(report)));
  } catch (const Error&) {
  }
  return with(report);
}

}  // namespace collie
