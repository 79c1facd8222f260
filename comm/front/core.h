// comm/front/core.h: what every handle of one communicator shares (the
// owner and each share()): the backend, the numbering of operations in
// issue order under one lock, the cached failure's refusals, the trace row
// and the once-only destruction. The Front (front.cc) is the Communicator
// over it; issue() is the hot path of every call, so it stays inline here.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/trace.h"
#include "collie/comm.h"
#include "comm/backend.h"
#include "comm/deterministic.h"

namespace collie::front {

inline std::string rank_str(int r) {
  return "rank " + std::to_string(r);
}

// What every handle of one communicator shares: the backend and the state
// the front keeps for it.
class Core {
 public:
  Core(BackendContext ctx, std::unique_ptr<Backend> backend)
      : ctx(std::move(ctx)),
        backend(std::move(backend)),
        send_seq(static_cast<size_t>(this->ctx.launch.world_size), 0),
        recv_seq(static_cast<size_t>(this->ctx.launch.world_size), 0),
        trace(make_track()) {}

  int rank() const { return ctx.launch.rank; }
  bool runs_alltoall() const { return backend->runs_alltoall(); }
  int size() const { return ctx.launch.world_size; }

  Work submit(Op op) {
    std::lock_guard lk(mu);
    return *issue(op, nullptr);
  }

  // A blocking call: issued as submit() does, then run on this thread if
  // the backend can take it now (Backend::claim), else waited for. Throws
  // the op's error.
  void run(Op op) {
    Backend* claimed = nullptr;
    std::optional<Work> queued;
    {
      std::lock_guard lk(mu);
      queued = issue(op, &claimed);
    }
    if (claimed)
      claimed->run_claimed(op);
    else
      queued->wait();
  }

  // With mu held: refuses, numbers and traces `op`, then starts it; with
  // `claimed`, a host op the backend can run on the calling thread now is
  // held for that instead (*claimed: by whom; nothing returned).
  std::optional<Work> issue(Op& op, Backend** claimed) {
    // Formatted only for an error: it cost every small op a malloc.
    auto what = [&] { return op.desc.describe() + " on " + rank_str(rank()); };
    if (destroyed)
      return refuse(op, Error(ErrorCode::unavailable,
                              what() + ": its communicator was destroyed (this call came through "
                                       "a reference the communicator's owner outlived)"));
    if (auto first = ctx.failure->get()) return refuse(op, FailureLatch::earlier(*first, what()));
    // Numbered here, in issue order; the backend receives them in it too.
    if (op.p2p())
      op.desc.seq = ++(op.is_send ? send_seq : recv_seq)[op.peer];
    else
      op.desc.seq = ++coll_seq;
    if (op.deterministic)  // its steps take the numbers after its own
      coll_seq += static_cast<uint32_t>(plan_deterministic(op.desc.op, op.desc.count,
                                                           dtype_size(op.desc.dtype), size(),
                                                           runs_alltoall())
                                            .steps -
                                        1);
    if (ctx.inspector && !op.p2p()) ctx.inspector->issued(op.desc.seq);
    if (trace) op.trace = trace::issue(trace, op);
    if (op.in.device.is_cpu() && op.out.device.is_cpu()) {
      if (claimed && host_path->claim(op)) {
        *claimed = host_path;
        return std::nullopt;
      }
      return host_path->start(op);
    }
    Work w = backend->start(op);
    host_path = backend->host_path();
    return w;
  }

  // Once: the backend stops; later calls through any handle fail at once.
  void destroy();

  // Under collie-run, the world communicator's arrivals log goes to the
  // job's store as it closes cleanly (core.cc).
  void leave_arrivals() noexcept;

  Work refuse(const Op& op, const Error& e);

  // This communicator's row in COLLIE_TRACE's file, or null.
  std::shared_ptr<trace::Track> make_track() const;

  const BackendContext ctx;
  const std::unique_ptr<Backend> backend;
  // Asked once: every host tensor of every call is checked against it.
  const bool takes_host_memory = backend->accepts(Device::cpu());
  std::mutex mu;
  // Where host-memory operations go (Backend::host_path), under mu.
  Backend* host_path = backend->host_path();
  uint32_t coll_seq = 0;
  std::vector<uint32_t> send_seq, recv_seq;
  int splits = 0;
  int shrinks = 0;
  int grows = 0;
  bool destroyed = false;
  const std::shared_ptr<trace::Track> trace;
};

}  // namespace collie::front
