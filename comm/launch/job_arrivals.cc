// comm/launch/job_arrivals.cc: at the end of a job that ended well, node
// 0's collie-run says which rank arrived last at the world communicator's
// collectives, when one stands out: every rank left its account in the
// job's store as its communicator closed (base/arrivals.h), and collie-run
// compares them.
#include <cstdio>
#include <cstring>
#include <vector>

#include "base/arrivals.h"
#include "base/config.h"
#include "base/log.h"
#include "comm/launch/job.h"

namespace collie::launch {

void Job::report_arrivals() {
  if (a_.node_rank != 0 || world_ < 2 || !server_) return;
  std::vector<std::string> keys;
  for (int r = 0; r < world_; ++r) keys.push_back(ranks_key(collie::arrivals::store_key(r)));
  std::vector<std::vector<uint64_t>> logs;
  try {
    auto store = ask_own_store();
    // Ranks on other nodes may still be closing: a moment for them. A rank
    // with no world communicator (or one that closed it on a failure)
    // leaves nothing, and then nothing is said.
    if (!store->check(keys)) {
      if (a_.nnodes == 1) return;
      for (const auto& k : keys) store->get(k, std::chrono::seconds(2));
    }
    for (const auto& k : keys) {
      const collie::Bytes b = store->get(k);
      std::vector<uint64_t> v(b.size() / sizeof(uint64_t));
      std::memcpy(v.data(), b.data(), v.size() * sizeof(uint64_t));
      logs.push_back(std::move(v));
    }
  } catch (const collie::Error&) {
    return;  // not there in time: the job's result stands, unannotated
  }
  const collie::Arrivals a = collie::arrivals::compare(logs, 0);
  if (a.collectives == 0) return;
  // Said when one rank stands out (last more often than halfway between
  // its fair share and always, a millisecond or more after the first, at
  // the median), or under COLLIE_DEBUG=INFO: not a line of noise after
  // every job.
  size_t top = 0;
  for (size_t r = 1; r < a.last.size(); ++r)
    if (a.last[r] > a.last[top]) top = r;
  const double fair = 1.0 / world_;
  const bool stands_out =
      static_cast<double>(a.last[top]) >= (fair + (1 - fair) / 2) * a.collectives &&
      a.median_late_ms[top] >= 1.0;
  if (!stands_out && !collie::log::enabled(collie::log::Level::info)) return;
  std::fprintf(stderr,
               "collie-run: arrivals at the world communicator's last host collectives: %s\n",
               a.summary().c_str());
}

}  // namespace collie::launch
