// comm/front/context.cc: see context.h.
#include "comm/front/context.h"

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "base/arrivals.h"
#include "base/log.h"
#include "comm/stall_inspector.h"

namespace collie {

BackendContext renumbered(const BackendContext& ctx, const std::string& key, int rank, int size,
                          bool local) {
  BackendContext c = ctx;
  c.key = key;
  c.launch.rank = rank;
  c.launch.world_size = size;
  if (local) {
    c.launch.local_rank = rank;
    c.launch.local_world_size = size;
  }
  c.failure = std::make_shared<FailureLatch>();
  c.names = RankNames();  // a new communicator: its own numbers
  c.inspector = StallInspector::start(c.store, c.key, rank, size, c.launch.timeout);
  c.arrivals = arrivals::log_for(size, c.launch.arrivals);
  return c;
}

void done_with_store(const BackendContext& ctx, const Error* failed) {
  const int n = ctx.launch.world_size, me = ctx.launch.rank;
  if (!ctx.store || n < 2) return;
  auto key = [&](int q) { return ctx.key + "/set-up/" + std::to_string(q); };
  const std::string word =
      failed ? "!" + std::to_string(static_cast<int>(failed->code())) + " " + failed->what() : "1";
  try {
    ctx.store->set(key(me), to_bytes(word));
  } catch (const Error&) {
    if (!failed) throw;  // else its own failure is the one to report
  }
  if (failed || !ctx.serves_store) return;
  std::vector<std::string> keys;
  for (int q = 0; q < n; ++q) keys.push_back(q == me ? "" : key(q));
  const std::string who = ctx.names(me) + " (serving the store)";
  wait_for_ranks(*ctx.store, keys, std::chrono::steady_clock::now() + ctx.launch.timeout,
                 ctx.launch.timeout, who, ctx.names);
  for (int q = 0; q < n; ++q) {
    if (q == me) continue;
    const std::string said = to_string(ctx.store->get(key(q)));
    if (said.empty() || said[0] != '!') continue;
    const size_t space = said.find(' ');
    int code = std::atoi(said.c_str() + 1);
    if (code < 1 || code > kNumErrorCodes) code = static_cast<int>(ErrorCode::internal);
    throw Error(static_cast<ErrorCode>(code),
                who + ": " + ctx.names(q) + " failed to set up its part: " +
                    (space == std::string::npos ? said : said.substr(space + 1)));
  }
}

void outlast_setups(const BackendContext& ctx, const std::vector<std::string>& keys) {
  if (!ctx.store || keys.empty()) return;
  try {
    wait_for_ranks(*ctx.store, keys, std::chrono::steady_clock::now() + ctx.launch.timeout,
                   ctx.launch.timeout, ctx.names(ctx.launch.rank) + " (serving the store)");
  } catch (const Error& e) {
    log::warn(std::string("the split's other communicators did not all finish their setup: ") +
              e.what());
  }
}

}  // namespace collie
