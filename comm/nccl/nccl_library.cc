// comm/nccl/nccl_library.cc: nccl::Api over the NCCL library, when this
// build has it. Without it, library() says there is none.
//
// NCCL is opened at its first use (dlopen), not linked. A process holds
// one library per name, and PyTorch's wheels bring their own libnccl.so.2:
// linked, collie's copy (the toolkit's) loaded first left a newer torch
// without its symbols (import collie, then torch: "undefined symbol:
// ncclCommResume"), and an older torch's copy loaded first left libcollie
// unloadable ("undefined symbol: ncclCommRegister", torch 2.0's NCCL
// 2.14). Opened here, collie takes the copy the process already has when
// it has every entry point collie calls, else the toolkit's beside it
// (RTLD_LOCAL: its symbols stay collie's), and says why when neither will
// do. COLLIE_NCCL_LIBRARY names another file to try first.
#include "base/installed.h"
#include "collie_build_config.h"
#include "comm/nccl/nccl_api.h"

#if COLLIE_HAVE_NCCL
#include <dlfcn.h>
#include <nccl.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "collie/error.h"
#endif

namespace collie::nccl {

#if COLLIE_HAVE_NCCL
namespace {

static_assert(sizeof(ncclUniqueId) == sizeof(UniqueId), "ncclUniqueId is 128 bytes");

// Every NCCL entry point collie calls.
// clang-format off
#define COLLIE_NCCL_FUNCTIONS(X) \
  X(GetVersion)                  \
  X(GetUniqueId)                 \
  X(CommInitRankConfig)          \
  X(CommSplit)                   \
  X(CommGetAsyncError)           \
  X(CommAbort)                   \
  X(CommFinalize)                \
  X(CommDestroy)                 \
  X(AllReduce)                   \
  X(Broadcast)                   \
  X(AllGather)                   \
  X(ReduceScatter)               \
  X(Send)                        \
  X(Recv)                        \
  X(GroupStart)                  \
  X(GroupEnd)                    \
  X(CommRegister)                \
  X(CommDeregister)              \
  X(GetErrorString)              \
  X(GetLastError)
// clang-format on

struct NcclSymbols {
#define COLLIE_NCCL_DECLARE(name) decltype(&::nccl##name) name = nullptr;
  COLLIE_NCCL_FUNCTIONS(COLLIE_NCCL_DECLARE)
#undef COLLIE_NCCL_DECLARE
  std::string error;  // why no NCCL could be used; empty once loaded
  std::string path;   // which one was

  NcclSymbols() {
    std::vector<std::string> candidates;
    if (const char* f = std::getenv("COLLIE_NCCL_LIBRARY"); f && *f) candidates.push_back(f);
    candidates.push_back("libnccl.so.2");  // the process's own, or the loader's search
    candidates.push_back(COLLIE_NCCL_DIR "/libnccl.so.2");
    for (const std::string& c : candidates) {
      void* lib = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (!lib) {
        const char* why = dlerror();
        error += (error.empty() ? "" : "; ") + c + ": " + (why ? why : "cannot be opened");
        continue;
      }
      std::string missing;
#define COLLIE_NCCL_RESOLVE(name)                                    \
  name = reinterpret_cast<decltype(name)>(dlsym(lib, "nccl" #name)); \
  if (!name) missing += std::string(missing.empty() ? "" : ", ") + "nccl" #name;
      COLLIE_NCCL_FUNCTIONS(COLLIE_NCCL_RESOLVE)
#undef COLLIE_NCCL_RESOLVE
      if (missing.empty()) {
        path = c;
        error.clear();
        return;
      }
      int v = 0;
      if (GetVersion) GetVersion(&v);
      error +=
          (error.empty() ? "" : "; ") + c + " (NCCL " + std::to_string(v) + ") has no " + missing;
      dlclose(lib);
    }
    error = "no NCCL with the entry points collie calls could be opened (" + error +
            "); collie was built against NCCL " + std::to_string(NCCL_VERSION_CODE) +
            ": set COLLIE_NCCL_LIBRARY to its libnccl.so.2";
  }
};

const NcclSymbols& nccl() {
  static const NcclSymbols symbols;
  return symbols;
}

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
    case DType::i8:
      return ncclInt8;
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
  r.message = nccl().GetErrorString(rc);
  if (const char* last = nccl().GetLastError(comm); last && *last)
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

// A failed result saying why no NCCL could be opened.
Result unloaded() {
  Result r;
  r.code = Result::Code::failed;
  r.message = nccl().error;
  return r;
}

class Library final : public Api {
 public:
  int version() override {
    if (!nccl().error.empty()) return 0;
    int v = 0;
    nccl().GetVersion(&v);
    return v;
  }
  // Every NCCL communicator starts at one of these three: the others are
  // called on a communicator they made, so with NCCL loaded.
  Result unique_id(UniqueId* id) override {
    if (!nccl().error.empty()) return unloaded();
    ncclUniqueId u;
    Result r = result(nccl().GetUniqueId(&u));
    std::memcpy(id->bytes, u.internal, sizeof id->bytes);
    return r;
  }
  Result init_rank(Comm* comm, int nranks, const UniqueId& id, int rank, bool blocking) override {
    if (!nccl().error.empty()) return unloaded();
    ncclUniqueId u;
    std::memcpy(u.internal, id.bytes, sizeof id.bytes);
    ncclConfig_t config = config_of(blocking);
    ncclComm_t out = nullptr;
    ncclResult_t rc = nccl().CommInitRankConfig(&out, nranks, u, rank, &config);
    *comm = out;
    return result(rc, out);
  }
  Result split(Comm parent, int color, int key, Comm* out, bool blocking) override {
    if (!nccl().error.empty()) return unloaded();
    ncclConfig_t config = config_of(blocking);
    ncclComm_t made = nullptr;
    ncclResult_t rc =
        nccl().CommSplit(c(parent), color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &made, &config);
    *out = made;
    return result(rc, c(parent));
  }
  Result async_error(Comm comm) override {
    ncclResult_t state = ncclSuccess;
    ncclResult_t rc = nccl().CommGetAsyncError(c(comm), &state);
    if (rc != ncclSuccess) return result(rc, c(comm));
    return result(state, c(comm));
  }
  Result abort(Comm comm) override { return result(nccl().CommAbort(c(comm))); }
  Result finalize(Comm comm) override { return result(nccl().CommFinalize(c(comm)), c(comm)); }
  Result destroy(Comm comm) override { return result(nccl().CommDestroy(c(comm))); }

  Result allreduce(const void* in, void* out, size_t count, DType t, ReduceOp op, Comm comm,
                   cuda::Stream s) override {
    return result(nccl().AllReduce(in, out, count, type_of(t), op_of(op), c(comm), st(s)), c(comm));
  }
  Result broadcast(const void* in, void* out, size_t count, DType t, int root, Comm comm,
                   cuda::Stream s) override {
    return result(nccl().Broadcast(in, out, count, type_of(t), root, c(comm), st(s)), c(comm));
  }
  Result allgather(const void* in, void* out, size_t count, DType t, Comm comm,
                   cuda::Stream s) override {
    return result(nccl().AllGather(in, out, count, type_of(t), c(comm), st(s)), c(comm));
  }
  Result reduce_scatter(const void* in, void* out, size_t count, DType t, ReduceOp op, Comm comm,
                        cuda::Stream s) override {
    return result(nccl().ReduceScatter(in, out, count, type_of(t), op_of(op), c(comm), st(s)),
                  c(comm));
  }
  Result send(const void* buf, size_t count, DType t, int peer, Comm comm,
              cuda::Stream s) override {
    return result(nccl().Send(buf, count, type_of(t), peer, c(comm), st(s)), c(comm));
  }
  Result recv(void* buf, size_t count, DType t, int peer, Comm comm, cuda::Stream s) override {
    return result(nccl().Recv(buf, count, type_of(t), peer, c(comm), st(s)), c(comm));
  }
  Result group_start() override { return result(nccl().GroupStart()); }
  Result group_end() override { return result(nccl().GroupEnd()); }
  Result register_memory(Comm comm, void* buf, size_t bytes, void** handle) override {
    return result(nccl().CommRegister(c(comm), buf, bytes, handle), c(comm));
  }
  Result deregister_memory(Comm comm, void* handle) override {
    return result(nccl().CommDeregister(c(comm), handle), c(comm));
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
