// comm/front/shrink.cc: how the survivors of a failure agree, through the
// store, on who goes on (Communicator::shrink): each says it is alive (with
// the last collective it completed), waits for the others it has not seen
// die, proposes those it saw; the first proposal stands for everyone. Then
// a warning where the survivors did not complete the same collectives.
#include "comm/front/shrink.h"

#include <algorithm>
#include <map>
#include <sstream>
#include <string>

#include "base/log.h"
#include "comm/front/context.h"

namespace collie {

BackendContext survivors_context(const BackendContext& ctx, std::vector<bool> out, int no,
                                 std::chrono::milliseconds wait, std::chrono::milliseconds timeout,
                                 const validate::Where& what) {
  const int me = ctx.launch.rank, n = ctx.launch.world_size;
  const std::string prefix = ctx.key + "/shrink" + std::to_string(no);
  auto alive = [&](int q) { return prefix + "/alive/" + std::to_string(q); };
  const std::string members_key = prefix + "/members";
  Store& store = *ctx.store;
  // Its value: the last collective this rank completed, compared below.
  const uint32_t done = ctx.inspector ? ctx.inspector->last_completed() : 0;
  store.set(alive(me), to_bytes(std::to_string(done)));
  if (wait.count() <= 0) wait = std::min(timeout, std::chrono::milliseconds(10000));
  std::vector<std::string> others;
  for (int q = 0; q < n; ++q)
    if (q != me && !out[static_cast<size_t>(q)]) others.push_back(alive(q));
  // Until every other rank has called, or the survivors have decided
  // already (a rank that saw more of the deaths proposed first: this one
  // may have heard of them only through its abort), or `wait` has passed.
  const auto until = std::chrono::steady_clock::now() + wait;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
    if (others.empty() || left.count() <= 0) break;
    try {
      store.wait(others, std::min(left, std::chrono::milliseconds(20)));
      break;
    } catch (const Error& e) {
      if (e.code() != ErrorCode::timeout) throw;
    }
    if (store.check({members_key})) break;
  }
  // Propose the ranks seen alive; the first proposal stands for everyone.
  std::string proposal;
  for (int q = 0; q < n; ++q)
    if (q == me || (!out[static_cast<size_t>(q)] && store.check({alive(q)})))
      proposal += std::to_string(q) + " ";
  const std::string decided = to_string(store.compare_set(members_key, {}, to_bytes(proposal)));
  std::vector<int> members, left_out;
  std::istringstream in(decided);
  for (int q; in >> q;) members.push_back(q);
  auto pos = std::find(members.begin(), members.end(), me);
  for (int q = 0; q < n; ++q)
    if (std::find(members.begin(), members.end(), q) == members.end()) left_out.push_back(q);
  if (pos == members.end())
    throw Error(ErrorCode::peer_lost, what.str() + ": the survivors had agreed on rank" +
                                          (members.size() > 1 ? "s " : " ") +
                                          RankNames().list(members) +
                                          " before this rank called shrink");
  const int new_rank = static_cast<int>(pos - members.begin());
  // One host (every survivor local): the local numbering is the new one.
  BackendContext c = renumbered(ctx, prefix, new_rank, static_cast<int>(members.size()),
                                ctx.launch.local_world_size == n);
  if (!left_out.empty())
    log::warn(what.str() + ": going on as rank " + std::to_string(new_rank) + " of " +
              std::to_string(members.size()) + ", without rank" +
              (left_out.size() > 1 ? "s " : " ") + RankNames().list(left_out));
  // A rank that died in the middle of a collective may have given its
  // part to some survivors and not to others: those completed it, these
  // failed it, and whatever it updated (a training step) now differs
  // between them. Nothing can undo it here; say so on every survivor.
  if (ctx.inspector) {
    std::vector<std::pair<int, uint32_t>> completed;
    for (int q : members) {
      uint32_t v = 0;
      try {
        v = static_cast<uint32_t>(std::stoul(to_string(store.get(alive(q), timeout))));
      } catch (const std::logic_error&) {  // not a number
        continue;
      } catch (const Error&) {  // the store: this check only advises, the shrink stands
        completed.clear();
        break;
      }
      completed.emplace_back(q, v);
    }
    const std::string differ = survivors_disagree(completed);
    if (!differ.empty())
      log::warn(what.str() + ": the survivors did not complete the same collectives (" + differ +
                "): what the later ones changed differs between the ranks; make them agree "
                "(broadcast the model and optimizer state from one rank) before going on");
  }
  return c;
}

std::string survivors_disagree(const std::vector<std::pair<int, uint32_t>>& completed) {
  std::map<uint32_t, std::vector<int>> by_seq;
  for (auto [rank, seq] : completed) by_seq[seq].push_back(rank);
  if (by_seq.size() < 2) return "";
  std::string s;
  for (auto it = by_seq.rbegin(); it != by_seq.rend(); ++it) {
    const auto& ranks = it->second;
    s += (s.empty() ? "" : "; ") + std::string(ranks.size() > 1 ? "ranks " : "rank ") +
         RankNames().list(ranks) + (s.empty() ? " completed up to #" : " up to #") +
         std::to_string(it->first);
  }
  return s;
}

}  // namespace collie
