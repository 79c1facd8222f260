// reducer/reducer_report.cc: what the reducer tells its user as it goes:
// a failed check (an error, or a warning under check_warns), the replica
// check's comparison, the timings in the log, and which rank arrived last
// (base/arrivals.h) every COLLIE_REDUCER_LOG_EVERY iterations.
#include <cstdio>
#include <string>
#include <vector>

#include "base/log.h"
#include "base/trace.h"
#include "reducer/reducer.h"
#include "reducer/replica_check.h"

namespace collie {

void Reducer::failed_check(ErrorCode code, const std::string& msg) const {
  if (!check_warns_)
    throw Error(code, "reducer on rank " + std::to_string(comm_.rank()) + ": " + msg);
  log::warn("reducer on rank " + std::to_string(comm_.rank()) + ": " + msg);
}

void Reducer::check_replicas_now() {
  std::vector<TensorView> values;
  for (const Parameter& p : params_) values.push_back(p.value);
  const std::string msg = check_replicas(
      comm_, values, [this](size_t i) { return name(i); }, iteration_, !shadowing_);
  if (trace_)
    trace_->instant("replica check",
                    trace::Args().add("iteration", iteration_).add("agree", msg.empty()));
  if (!msg.empty()) failed_check(ErrorCode::mismatch, msg);
}

void Reducer::log_stats() const {
  double comm_total = 0;
  std::string per_bucket;
  for (size_t b = 0; b < stats_.bucket_comm_us.size(); ++b) {
    comm_total += stats_.bucket_comm_us[b];
    char buf[32];
    std::snprintf(buf, sizeof buf, "%s%.2f", b ? " " : "", stats_.bucket_comm_us[b] / 1e3);
    per_bucket += buf;
  }
  char line[384];
  std::snprintf(
      line, sizeof line,
      "reducer on rank %d, iteration %llu: backward %.2f ms, exposed communication "
      "%.2f ms, hook %s sent %.3f MB for %.3f MB of gradients (%.1fx), %zu buckets, "
      "comm ms per bucket: ",
      comm_.rank(), static_cast<unsigned long long>(stats_.iteration), stats_.backward_us / 1e3,
      stats_.exposed_us / 1e3, hook_->name().c_str(), stats_.hook_bytes / 1e6,
      stats_.gradient_bytes / 1e6,
      stats_.hook_bytes ? static_cast<double>(stats_.gradient_bytes) / stats_.hook_bytes : 0.0,
      stats_.bucket_comm_us.size());
  log::info(line + per_bucket);
}

// Every rank, every iteration its turn comes, all of the iteration's
// collectives ended: which rank arrived last at the collectives since the
// last time (base/arrivals.h), told by rank 0.
void Reducer::log_arrivals() {
  const Arrivals a = comm_.arrivals();
  if (a.collectives == 0) return;
  if (comm_.rank() == 0)
    log::info("reducer, iterations " + std::to_string(iteration_ - arrivals_every_) + " to " +
              std::to_string(iteration_ - 1) + ": " + a.summary());
  if (trace_)
    trace_->instant("arrivals", trace::Args()
                                    .add("iteration", iteration_ - 1)
                                    .add("collectives", a.collectives)
                                    .add("summary", a.summary()));
}

}  // namespace collie
