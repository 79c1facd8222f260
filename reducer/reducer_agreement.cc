// reducer/reducer_agreement.cc: what every rank must agree on before a
// reducer's first step (its model, its buckets, the options that decide
// which collectives an iteration issues, what its checks do), compared in
// one all-gather at construction, with an error naming the rank that
// differs; and the checks' own setup, which that comparison covers.
#include <string>
#include <vector>

#include "base/config.h"
#include "base/fingerprint.h"
#include "base/log.h"
#include "reducer/nonfinite_check.h"
#include "reducer/reducer.h"

namespace collie {

void Reducer::agree_across_ranks(uint64_t shape_hash) {
  const std::string who = "rank " + std::to_string(comm_.rank());
  uint64_t plan_hash = kFnvBasis;
  for (char ch : plan_.fingerprint())
    plan_hash = fnv_mix(plan_hash, static_cast<unsigned char>(ch));
  // The options that decide which collectives an iteration issues (the
  // used-mask exchange) must agree too.
  // So must the checks, which add collectives of their own, and what a
  // failed one does (an error on some ranks and a warning on others: the
  // warned ones would go on into collectives the others never issue).
  const config::Env& env = config::process_env();
  check_replicas_ = opt_.check_replicas >= 0 ? static_cast<uint64_t>(opt_.check_replicas)
                                             : config::check_replicas(env);
  const bool nonfinite =
      opt_.check_nonfinite >= 0 ? opt_.check_nonfinite != 0 : config::check_nonfinite(env);
  check_warns_ = opt_.check_warns >= 0 ? opt_.check_warns != 0 : config::checks_warn(env);
  if (nonfinite) {
    for (size_t i = 0; i < params_.size(); ++i)
      if (!params_[i].value.device.is_cpu())
        throw Error(ErrorCode::unavailable,
                    "reducer on " + who +
                        ": the non-finite gradient check (check_nonfinite, "
                        "COLLIE_CHECK_NONFINITE) searches host memory only, and parameter " +
                        name(i) + " is on " + to_string(params_[i].value.device));
    nonfinite_ = std::make_unique<NonfiniteCheck>();
  }
  const int64_t flags = (opt_.find_unused_parameters ? 1 : 0) | (opt_.static_graph ? 2 : 0) |
                        (opt_.gradient_as_bucket_view ? 4 : 0) | (nonfinite ? 8 : 0) |
                        (check_warns_ ? 16 : 0);
  int n = comm_.size();
  // Rank 0's log decides when the ranks compare their arrivals (a
  // collective): every COLLIE_REDUCER_LOG_EVERY iterations where its
  // COLLIE_DEBUG says INFO, whatever the others' say.
  log_every_ = config::reducer_log_every(config::process_env());
  const int64_t arrivals_every = log::enabled(log::Level::info) ? log_every_ : 0;
  constexpr size_t kRow = 6;
  std::vector<int64_t> mine{static_cast<int64_t>(params_.size()),  static_cast<int64_t>(shape_hash),
                            static_cast<int64_t>(plan_hash),       flags,
                            static_cast<int64_t>(check_replicas_), arrivals_every};
  std::vector<int64_t> all(kRow * static_cast<size_t>(n));
  comm_.allgather(view_of(mine.data(), kRow), view_of(all.data(), all.size())).wait();
  auto describe = [&](const int64_t* row) {
    const int64_t f = row[3];
    return std::string("find_unused_parameters=") + (f & 1 ? "true" : "false") +
           ", static_graph=" + (f & 2 ? "true" : "false") +
           ", gradient_as_bucket_view=" + (f & 4 ? "true" : "false") +
           ", check_nonfinite=" + (f & 8 ? "1" : "0") +
           ", check_replicas=" + std::to_string(row[4]) + ", check_warns=" + (f & 16 ? "1" : "0");
  };
  for (int r = 1; r < n; ++r) {
    if (all[kRow * r] != all[0] || all[kRow * r + 1] != all[1])
      throw Error(ErrorCode::mismatch,
                  "reducer on " + who + ": rank " + std::to_string(r) + " has " +
                      std::to_string(all[kRow * r]) + " parameters and rank 0 has " +
                      std::to_string(all[0]) +
                      (all[kRow * r] == all[0] ? ", but their shapes or dtypes differ" : "") +
                      ": every rank must build the reducer over the same model");
    if (all[kRow * r + 2] != all[2])
      throw Error(ErrorCode::mismatch,
                  "reducer on " + who + ": rank " + std::to_string(r) +
                      " plans different buckets from rank 0 over the same parameters: give "
                      "every rank the same bucket sizes");
    if (all[kRow * r + 3] != all[3] || all[kRow * r + 4] != all[4])
      throw Error(ErrorCode::mismatch, "reducer on " + who + ": rank " + std::to_string(r) +
                                           " builds its reducer with " + describe(&all[kRow * r]) +
                                           " and rank 0 with " + describe(&all[0]) +
                                           ": give every rank the same options");
  }

  arrivals_every_ = static_cast<uint64_t>(all[5]);
}

}  // namespace collie
