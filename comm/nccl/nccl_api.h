// comm/nccl/nccl_api.h: every NCCL call collie makes, behind one interface.
//
// As base/cuda_api.h does for the CUDA runtime: the NCCL backend's
// logic is written against this, CI runs it against a fake
// (tests/fake_device.h) and the GPU machine against library() below. The
// types are collie's (DType, ReduceOp) and handles are opaque, so that
// nccl.h stays inside comm/nccl/nccl_library.cc.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "base/cuda_api.h"
#include "collie/types.h"

namespace collie::nccl {

using Comm = void*;  // ncclComm_t

// ncclUniqueId: what rank 0 makes and every rank passes to init.
struct UniqueId {
  char bytes[128];
};

// What an NCCL call returned. in_progress: a non-blocking communicator is
// still busy with an init, split or finalize (ncclInProgress).
struct Result {
  enum class Code { ok, in_progress, failed } code = Code::ok;
  bool remote = false;  // ncclRemoteError: a peer failed or went away
  std::string message;  // NCCL's own words, for a failure
  bool ok() const { return code == Code::ok; }
  bool failed() const { return code == Code::failed; }
};

class Api {
 public:
  virtual ~Api() = default;
  virtual int version() = 0;  // e.g. 22809 for 2.28.9
  virtual Result unique_id(UniqueId* id) = 0;
  // ncclCommInitRankConfig; `blocking` false: returns at once, and
  // async_error() says in_progress until the init has finished.
  virtual Result init_rank(Comm* comm, int nranks, const UniqueId& id, int rank, bool blocking) = 0;
  // ncclCommSplit, collective over `parent`; color < 0: this rank joins none
  // (*out stays nullptr).
  virtual Result split(Comm parent, int color, int key, Comm* out, bool blocking) = 0;
  // ncclCommGetAsyncError: ok, in_progress, or the communicator's failure.
  virtual Result async_error(Comm comm) = 0;
  // ncclCommAbort: ends what is in flight on the communicator and frees it.
  virtual Result abort(Comm comm) = 0;
  virtual Result finalize(Comm comm) = 0;
  virtual Result destroy(Comm comm) = 0;

  virtual Result allreduce(const void* in, void* out, size_t count, DType t, ReduceOp op, Comm comm,
                           cuda::Stream s) = 0;
  virtual Result broadcast(const void* in, void* out, size_t count, DType t, int root, Comm comm,
                           cuda::Stream s) = 0;
  // `count` is each rank's part (in holds count, out nranks x count).
  virtual Result allgather(const void* in, void* out, size_t count, DType t, Comm comm,
                           cuda::Stream s) = 0;
  // `count` is each rank's result (in holds nranks x count).
  virtual Result reduce_scatter(const void* in, void* out, size_t count, DType t, ReduceOp op,
                                Comm comm, cuda::Stream s) = 0;
  virtual Result send(const void* buf, size_t count, DType t, int peer, Comm comm,
                      cuda::Stream s) = 0;
  virtual Result recv(void* buf, size_t count, DType t, int peer, Comm comm, cuda::Stream s) = 0;
  virtual Result group_start() = 0;
  virtual Result group_end() = 0;
  // ncclCommRegister / ncclCommDeregister: memory NCCL may then move
  // without copying it through its own buffers.
  virtual Result register_memory(Comm comm, void* buf, size_t bytes, void** handle) = 0;
  virtual Result deregister_memory(Comm comm, void* handle) = 0;
};

// The NCCL library, when this build has it (COLLIE_HAVE_NCCL); else nullptr.
std::shared_ptr<Api> library();

// What the nccl backend runs on: library(), unless a test has installed
// another (a fake) first.
std::shared_ptr<Api> api();
void set_api(std::shared_ptr<Api> api);

}  // namespace collie::nccl
