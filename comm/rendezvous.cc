// comm/rendezvous.cc: waiting for every rank's key in the store, for the
// backends' own rendezvous (tcp's addresses, shm's segment).
#include <algorithm>

#include "base/log.h"
#include "comm/backend.h"

namespace collie {

std::string RankNames::list(const std::vector<int>& ranks) const {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i)
    s += (i ? ", " : "") + std::to_string((*this)[ranks[i]]);
  return s;
}

RankNames RankNames::of(const std::vector<int>& members) const {
  RankNames n;
  for (int m : members) n.ranks_.push_back((*this)[m]);
  return n;
}

void wait_for_ranks(Store& store, const std::vector<std::string>& keys,
                    std::chrono::steady_clock::time_point deadline,
                    std::chrono::milliseconds timeout, const std::string& who,
                    const RankNames& names) {
  using std::chrono::milliseconds;
  const int n = static_cast<int>(keys.size());
  std::vector<bool> seen(n);
  for (int q = 0; q < n; ++q) seen[q] = keys[q].empty();
  // "rank 2 of 4 never joined" at the deadline; on a lost store "rank 2 of
  // 4 had not joined yet": all this rank knows is that it had not seen them
  // (in a flaky CI run, "ranks 0, 1 of 2 never joined" named two ranks that
  // had joined and gone on, the store's server among them).
  auto missing_ranks = [&](const char* verb) {
    std::vector<int> missing;
    for (int q = 0; q < n; ++q)
      if (!seen[q]) missing.push_back(q);
    return (missing.size() > 1 ? "ranks " : "rank ") + names.list(missing) + " of " +
           std::to_string(n) + verb;
  };
  // The wait goes in slices, noting who has arrived after each, so that a
  // timeout can name the missing ranks without asking the store again: by
  // then rank 0, timing out too, may have taken the store down with it.
  for (;;) {
    std::vector<std::string> missing_keys;
    for (int q = 0; q < n; ++q)
      if (!seen[q]) missing_keys.push_back(keys[q]);
    if (missing_keys.empty()) return;
    auto left =
        std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      throw Error(ErrorCode::timeout,
                  "rendezvous timed out on " + who + " after " + log::seconds(timeout) + ": " +
                      missing_ranks(" never joined") +
                      " (not started, crashed before connecting, or pointed at another "
                      "MASTER_ADDR/MASTER_PORT)");
    }
    try {
      store.wait(missing_keys, std::min(left, milliseconds(1000)));
      return;
    } catch (const Error& e) {
      if (e.code() == ErrorCode::peer_lost)
        throw Error(ErrorCode::peer_lost,
                    "rendezvous on " + who +
                        " lost the rendezvous store (did rank 0, or the collie-run "
                        "of node 0, that serves it exit, perhaps at its own "
                        "deadline?) while " +
                        missing_ranks(" had not joined yet") + ": " + e.what());
      if (e.code() != ErrorCode::timeout) throw;
      try {
        for (int q = 0; q < n; ++q)
          if (!seen[q]) seen[q] = store.check({keys[q]});
      } catch (const Error&) {
        // The store went away: the next round reports the timeout or the loss.
      }
    }
  }
}

}  // namespace collie
