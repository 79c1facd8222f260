// comm/shm/shm_runner.h: the shm backend's runner, the HostRunner over one
// segment: its collectives (the steps of comm/shm/steps.h over its
// Segment, compiled in shm_collectives.cc) and its point-to-point messages
// (comm/shm/shm_p2p.cc). Only this folder includes it; the registry gets
// the backend from comm/shm/shm_backend.h.
#pragma once

#include <memory>

#include "comm/host_executor.h"
#include "comm/shm/region.h"
#include "comm/shm/segment.h"
#include "comm/shm/steps.h"

namespace collie::shm {

// The steps are compiled once, in shm_collectives.cc.
extern template class ShmSteps<Segment>;

class ShmRunner final : public HostRunner, private ShmSteps<Segment> {
 public:
  ShmRunner(const BackendContext& ctx, const config::ShmTuning& t, SpinBudget spin)
      : ShmSteps<Segment>(ctx.launch.rank, ctx.launch.world_size, ctx.names, ctx, t, spin) {}

 private:
  // ---- collectives (comm/shm/steps.h) ------------------------------------

  bool runs_alltoall() const override { return true; }
  bool sums_in_rank_order() const override { return true; }
  // Every path of its all-reduce searches as it reduces (op.seen).
  bool searches_nonfinite(const Op& op) const override { return op.desc.op == OpKind::allreduce; }

  void run_collective(const Op& op, Deadline dl) override;

  // ---- point to point ----------------------------------------------------

  struct Pending {
    size_t index;      // in the batch
    size_t done = 0;   // bytes moved
    uint32_t ack = 0;  // a send handed over by address: done when the tail reaches this
  };

  void run_p2p(P2pBatch& batch, Deadline dl) override;

  std::shared_ptr<void> allocate(size_t bytes) override { return allocate_region(bytes); }

  void abort_peers(const Error& e) noexcept override { seg_.abort(e); }
  void close() noexcept override { seg_.close(); }
  // A point-to-point batch sleeps until its bell changes: ring it, so that
  // it takes in the ops issued since (a bare futex wake-up left it asleep,
  // and a send waiting for a receive that never joined hung). Then wake
  // every sleeper, so that they see an abort.
  void wake() noexcept override {
    seg_.ring(me_);
    seg_.wake_all();
  }
};

}  // namespace collie::shm
