// comm/nccl/nccl_backend.h: collie over NCCL, for CUDA tensors.
//
// Each communicator is an NCCL communicator on one device (local_rank
// modulo the devices this process sees) with a CUDA stream of its own.
// Rank 0 makes NCCL's unique id and passes it through collie's store; the
// ranks wait for each other there first, so that one that never comes is a
// timeout naming it, and init is non-blocking (ncclCommInitRankConfig with
// blocking = 0), polled up to the deadline.
//
// An operation waits for the work the calling thread queued on its current
// stream (collie::set_cuda_stream; the legacy default stream unless set),
// runs on the communicator's stream and records an event there. Its Work
// ends when the event has happened: Work::wait polls it on the host,
// Work::wait_on(stream) makes a stream wait for it without the host.
// Point-to-point operations issued back to back are launched as one NCCL
// group (at the next collective, at the first wait on one of them, or after
// a short grace), so a pairwise exchange does not deadlock.
//
// A watchdog thread per communicator finishes the operations whose events
// have happened (their continuations then run on the continuation thread),
// polls ncclCommGetAsyncError, and enforces the deadline: an operation
// still running when its deadline passes aborts the communicator
// (ncclCommAbort) and fails with a timeout naming it. NCCL itself would wait
// forever for a peer that died. The first rank that fails writes why into
// the store, and every other rank's watchdog reads it and fails at once
// rather than at its own deadline.
//
// Every CUDA and NCCL call goes through cuda::Api and nccl::Api, so that
// this logic is tested in CI against a fake device (tests/fake_device.h).
#pragma once

#include <memory>

#include "base/cuda_api.h"
#include "comm/backend.h"
#include "comm/nccl/nccl_api.h"

namespace collie::nccl {

struct Apis {
  std::shared_ptr<cuda::Api> cuda;
  std::shared_ptr<nccl::Api> nccl;
};

// The registry's line for this backend.
BackendEntry backend_entry();

// The backend over `apis`, collective over the ranks of `ctx` (what the
// registry's line does with the real libraries; tests pass a fake).
std::unique_ptr<Backend> make_backend(const BackendContext& ctx, Apis apis);

}  // namespace collie::nccl
