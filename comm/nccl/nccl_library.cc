// comm/nccl/nccl_library.cc: nccl::Api over the NCCL library, when this
// build has it. Without it, library() says there is none.
#include "collie_build_config.h"
#include "comm/core/installed.h"
#include "comm/nccl/nccl_api.h"

#if COLLIE_HAVE_NCCL
#include <nccl.h>

#include <cstring>

#include "collie/error.h"
#endif

namespace collie::nccl {

#if COLLIE_HAVE_NCCL
namespace {

static_assert(sizeof(ncclUniqueId) == sizeof(UniqueId), "ncclUniqueId is 128 bytes");

ncclDataType_t type_of(DType t) {
  switch (t) {
    case DType::f32:
      return ncclFloat32;
    case DType::f64:
      return ncclFloat64;
    case DType::f16:
      return ncclFloat16;
    case DType::bf16:
      return ncclBfloat16;
    case DType::i32:
      return ncclInt32;
    case DType::i64:
      return ncclInt64;
    case DType::u8:
      return ncclUint8;
  }
  throw Error(ErrorCode::invalid_argument, "a dtype NCCL has no counterpart for");
}

ncclRedOp_t op_of(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::avg:
      return ncclAvg;
    case ReduceOp::min:
      return ncclMin;
    case ReduceOp::max:
      return ncclMax;
    case ReduceOp::prod:
      return ncclProd;
  }
  throw Error(ErrorCode::invalid_argument, "a reduction NCCL has no counterpart for");
}

Result result(ncclResult_t rc, ncclComm_t comm = nullptr) {
  Result r;
  if (rc == ncclSuccess) return r;
  if (rc == ncclInProgress) {
    r.code = Result::Code::in_progress;
    return r;
  }
  r.code = Result::Code::failed;
  r.remote = rc == ncclRemoteError;
  r.message = ncclGetErrorString(rc);
  if (const char* last = ncclGetLastError(comm); last && *last)
    r.message += std::string(": ") + last;
  return r;
}

ncclConfig_t config_of(bool blocking) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = blocking ? 1 : 0;
  return config;
}

ncclComm_t c(Comm comm) {
  return static_cast<ncclComm_t>(comm);
}
cudaStream_t st(cuda::Stream s) {
  return static_cast<cudaStream_t>(s);
}

class Library final : public Api {
 public:
  int version() override {
    int v = 0;
    ncclGetVersion(&v);
    return v;
  }
  Result unique_id(UniqueId* id) override {
    ncclUniqueId u;
    Result r = result(ncclGetUniqueId(&u));
    std::memcpy(id->bytes, u.internal, sizeof id->bytes);
    return r;
  }
  Result init_rank(Comm* comm, int nranks, const UniqueId& id, int rank, bool blocking) override {
    ncclUniqueId u;
    std::memcpy(u.internal, id.bytes, sizeof id.bytes);
    ncclConfig_t config = config_of(blocking);
    ncclComm_t out = nullptr;
    ncclResult_t rc = ncclCommInitRankConfig(&out, nranks, u, rank, &config);
    *comm = out;
    return result(rc, out);
  }
  Result split(Comm parent, int color, int key, Comm* out, bool blocking) override {
    ncclConfig_t config = config_of(blocking);
    ncclComm_t made = nullptr;
    ncclResult_t rc =
        ncclCommSplit(c(parent), color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &made, &config);
    *out = made;
    return result(rc, c(parent));
  }
  Result async_error(Comm comm) override {
    ncclResult_t state = ncclSuccess;
    ncclResult_t rc = ncclCommGetAsyncError(c(comm), &state);
    if (rc != ncclSuccess) return result(rc, c(comm));
    return result(state, c(comm));
  }
  Result abort(Comm comm) override { return result(ncclCommAbort(c(comm))); }
  Result finalize(Comm comm) override { return result(ncclCommFinalize(c(comm)), c(comm)); }
  Result destroy(Comm comm) override { return result(ncclCommDestroy(c(comm))); }

  Result allreduce(const void* in, void* out, size_t count, DType t, ReduceOp op, Comm comm,
                   cuda::Stream s) override {
    return result(ncclAllReduce(in, out, count, type_of(t), op_of(op), c(comm), st(s)), c(comm));
  }
  Result broadcast(const void* in, void* out, size_t count, DType t, int root, Comm comm,
                   cuda::Stream s) override {
    return result(ncclBroadcast(in, out, count, type_of(t), root, c(comm), st(s)), c(comm));
  }
  Result allgather(const void* in, void* out, size_t count, DType t, Comm comm,
                   cuda::Stream s) override {
    return result(ncclAllGather(in, out, count, type_of(t), c(comm), st(s)), c(comm));
  }
  Result reduce_scatter(const void* in, void* out, size_t count, DType t, ReduceOp op, Comm comm,
                        cuda::Stream s) override {
    return result(ncclReduceScatter(in, out, count, type_of(t), op_of(op), c(comm), st(s)),
                  c(comm));
  }
  Result send(const void* buf, size_t count, DType t, int peer, Comm comm,
              cuda::Stream s) override {
    return result(ncclSend(buf, count, type_of(t), peer, c(comm), st(s)), c(comm));
  }
  Result recv(void* buf, size_t count, DType t, int peer, Comm comm, cuda::Stream s) override {
    return result(ncclRecv(buf, count, type_of(t), peer, c(comm), st(s)), c(comm));
  }
  Result group_start() override { return result(ncclGroupStart()); }
  Result group_end() override { return result(ncclGroupEnd()); }
  Result register_memory(Comm comm, void* buf, size_t bytes, void** handle) override {
    return result(ncclCommRegister(c(comm), buf, bytes, handle), c(comm));
  }
  Result deregister_memory(Comm comm, void* handle) override {
    return result(ncclCommDeregister(c(comm), handle), c(comm));
  }
};

}  // namespace

std::shared_ptr<Api> library() {
  static const std::shared_ptr<Api> api = std::make_shared<Library>();
  return api;
}
#else
std::shared_ptr<Api> library() {
  return nullptr;
}
#endif

namespace {
Installed<Api>& installed() {
  static Installed<Api> api(&library);
  return api;
}
}  // namespace

std::shared_ptr<Api> api() {
  return installed().get();
}

void set_api(std::shared_ptr<Api> a) {
  installed().set(std::move(a));
}

}  // namespace collie::nccl
