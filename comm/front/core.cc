// comm/front/core.cc: see core.h.
#include "comm/front/core.h"

#include <cstring>

#include "base/arrivals.h"
#include "base/config.h"
#include "collie/store.h"

namespace collie::front {

// Once: the backend stops; later calls through any handle fail at once.
void Core::destroy() {
  {
    std::lock_guard lk(mu);
    if (destroyed) return;
    destroyed = true;
  }
  backend->shutdown();
  if (ctx.inspector) ctx.inspector->stop();
  leave_arrivals();
  // The file is whole when its communicator is gone (base/trace.h).
  if (trace) trace->sink().flush();
}

// Under collie-run, the world communicator's arrivals log goes to the
// job's store as it closes cleanly, for collie-run to compare the ranks'
// at the job's end (comm/launch/job_arrivals.cc). A communicator that
// met its peers through another store (PyTorch's, for the torch backend)
// reaches collie-run's for this on a connection of its own.
void Core::leave_arrivals() noexcept {
  if (!ctx.arrivals || ctx.key != "collie/world" || ctx.failure->failed()) return;
  try {
    std::shared_ptr<Store> store = ctx.store_is_launchers ? ctx.store : nullptr;
    if (!store) {
      const auto at = config::launcher_store(config::process_env());
      if (!at) return;  // not under collie-run
      store = TcpStore::connect(at->addr, at->port, {at->secret, at->job}, std::chrono::seconds(2),
                                rank_str(ctx.launch.rank), "collie-run on node 0");
      if (!at->prefix.empty()) store = std::make_shared<PrefixStore>(store, at->prefix);
    }
    const std::vector<uint64_t> v = ctx.arrivals->snapshot();
    std::vector<uint8_t> bytes(v.size() * sizeof(uint64_t));
    std::memcpy(bytes.data(), v.data(), bytes.size());
    store->set(arrivals::store_key(ctx.launch.rank), bytes);
  } catch (const std::exception&) {  // the store is gone: nothing to report to
  }
}

Work Core::refuse(const Op& op, const Error& e) {
  if (trace) trace::refused(trace, op, e);
  return Work::failed(e);
}

// This communicator's row in COLLIE_TRACE's file, or null.
std::shared_ptr<trace::Track> Core::make_track() const {
  if (!ctx.trace) return nullptr;
  auto t = ctx.trace->track("collectives " + ctx.key + " (" + backend->name() + ", rank " +
                            std::to_string(rank()) + " of " + std::to_string(size()) + ")");
  t->comm = ctx.key;
  t->backend = backend->name();
  return t;
}

}  // namespace collie::front
