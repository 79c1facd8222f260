// comm/front/grow.cc: how a communicator grows by processes that join the
// running job, through the job's store.
//
// A joiner (collie::join, or connect() with COLLIE_JOIN=1) queues: it takes
// the next ticket t of the job-wide counter collie/join/queued and writes
// its host name under collie/join/<t>/host, then waits for
// collie/join/<t>/assigned. Each grow is collective over the members of one
// communicator; rank 0 of it takes the next `joiners` tickets (the counter
// collie/join/taken, so two grows never take the same one), waits for
// their host names, and writes each one's place ("<key> <rank> <size>
// <backend> <local>") and, for the members, the outcome under
// <key>/grow<no>/outcome. The new communicator's key is that
// <key>/grow<no>: a generation of its own, so that no key of the old
// communicator is read as the new one's. Joiners beyond those a grow takes
// wait for the next grow, up to their deadline; a spare (COLLIE_SPARE=<id>,
// collie-run --elastic --spares) waits for as long as it takes, and writes
// its ticket under collie/spare/<id> for its launcher.
#include "comm/front/grow.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <sstream>
#include <string>
#include <vector>

#include "base/config.h"
#include "base/log.h"
#include "comm/front/context.h"

namespace collie {

namespace {

std::string ticket_key(int64_t t, const char* what) {
  return config::join_ticket_key(t, what);
}

std::string this_host() {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  return host;
}

}  // namespace

BackendContext grown_context(const BackendContext& ctx, int joiners, int no,
                             std::chrono::milliseconds wait, const validate::Where& what) {
  const int me = ctx.launch.rank, n = ctx.launch.world_size, size = n + joiners;
  Store& store = *ctx.store;
  const std::string key = ctx.key + "/grow" + std::to_string(no);
  const std::string outcome_key = key + "/outcome";
  if (wait.count() <= 0) wait = ctx.launch.timeout;
  if (me == 0) {
    // The next tickets of the queue, one at a time: each once its joiner
    // has come (its host name is there) and this grow has claimed it. A
    // ticket its launcher withdrew (a spare that ended before any grow
    // took it: config::join_claim_key) is passed over for the next.
    const auto until = std::chrono::steady_clock::now() + wait;
    std::vector<int64_t> tickets;
    std::string failed;
    int64_t waiting_on = -1;  // a ticket taken whose joiner has not come
    const Bytes claim = to_bytes("grow " + key);
    while (static_cast<int>(tickets.size()) < joiners) {
      const int64_t t = store.add(config::kJoinTaken, 1);
      waiting_on = t;
      try {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            until - std::chrono::steady_clock::now());
        store.wait({ticket_key(t, "host")}, std::max(left, std::chrono::milliseconds(1)));
      } catch (const Error& e) {
        if (e.code() != ErrorCode::timeout) throw;
        failed = what.str() + ": " + std::to_string(tickets.size()) + " of the " +
                 std::to_string(joiners) + " joining processes came within " + log::seconds(wait) +
                 " (start them with collie::join, or connect() under COLLIE_JOIN=1, as "
                 "collie-run --elastic does for a rank it restarts)";
        break;
      }
      waiting_on = -1;
      if (store.compare_set(config::join_claim_key(t), {}, claim) != claim) {
        log::info(what.str() + ": passing over ticket " + std::to_string(t) +
                  " of the queue of joiners: its launcher withdrew it (the process ended)");
        continue;
      }
      tickets.push_back(t);
    }
    if (waiting_on >= 0) tickets.push_back(waiting_on);  // told it is refused, below
    // Every member on this host, and every joiner too: the new
    // communicator is one host's (shm's segment, local ranks).
    bool local = ctx.launch.local_world_size == n;
    if (failed.empty())
      for (int64_t t : tickets)
        local = local && to_string(store.get(ticket_key(t, "host"))) == this_host();
    const std::string backend = ctx.backend_name.empty() ? "auto" : ctx.backend_name;
    for (size_t i = 0; i < tickets.size(); ++i)
      store.set(
          ticket_key(tickets[i], "assigned"),
          to_bytes(failed.empty() ? key + " " + std::to_string(n + i) + " " + std::to_string(size) +
                                        " " + backend + " " + (local ? "1" : "0")
                                  : "refused " + failed));
    store.set(outcome_key,
              to_bytes(failed.empty() ? "ok " + std::string(local ? "1" : "0") : "fail " + failed));
    if (!failed.empty()) throw Error(ErrorCode::timeout, failed);
    log::info(what.str() + ": " + std::to_string(joiners) + " joined, " + std::to_string(size) +
              " ranks");
    return renumbered(ctx, key, me, size, local);
  }
  const std::string outcome = to_string(store.get(outcome_key, wait + ctx.launch.timeout));
  if (outcome.rfind("fail ", 0) == 0) throw Error(ErrorCode::timeout, outcome.substr(5));
  return renumbered(ctx, key, me, size, outcome == "ok 1");
}

BackendContext joiner_context(const BackendContext& ctx, std::chrono::milliseconds wait,
                              std::string& backend) {
  Store& store = *ctx.store;
  const int64_t t = store.add(config::kJoinQueued, 1);
  const std::string& spare = ctx.launch.spare;
  // A spare's ticket, where its launcher looks for it, before the host
  // name that lets a grow take it.
  if (!spare.empty()) store.set(config::spare_key(spare), to_bytes(std::to_string(t)));
  store.set(ticket_key(t, "host"), to_bytes(this_host()));
  log::info("join: waiting (place " + std::to_string(t) +
            " in the queue) for a communicator of the job to grow by this process" +
            (spare.empty() ? "" : " (spare " + spare + ": for as long as it takes)"));
  std::string place;
  try {
    // A spare waits until a rank is lost, however long the job runs (its
    // launcher stops it at the end); each slice is one request.
    for (;;) {
      try {
        place = to_string(store.get(ticket_key(t, "assigned"), wait));
        break;
      } catch (const Error& e) {
        if (e.code() != ErrorCode::timeout || spare.empty()) throw;
      }
    }
  } catch (const Error& e) {
    if (e.code() != ErrorCode::timeout) throw;
    throw Error(ErrorCode::timeout,
                "join: no communicator of the job grew by this process within " +
                    log::seconds(wait) + " (it was number " + std::to_string(t) +
                    " in the queue of joiners; the ranks call Communicator::grow, which takes "
                    "the joiners in the order they came)");
  }
  if (place.rfind("refused ", 0) == 0)
    throw Error(ErrorCode::timeout, "join: refused by the ranks' grow: " + place.substr(8));
  std::istringstream in(place);
  std::string key;
  int rank = -1, size = 0, local = 0;
  if (!(in >> key >> rank >> size >> backend >> local) || rank < 0 || rank >= size)
    throw Error(ErrorCode::internal,
                "join: the store's word on this joiner's place is not "
                "'<key> <rank> <size> <backend> <local>': '" +
                    place + "'");
  log::info("join: rank " + std::to_string(rank) + " of " + std::to_string(size) + " (" + key +
            ")");
  return renumbered(ctx, key, rank, size, local == 1);
}

}  // namespace collie
