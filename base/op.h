// base/op.h: an operation as the communicator front hands it to a backend:
// what it is (OpDesc, which also travels in wire headers and names the op in
// every message) and the buffers it works on. The front has checked it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "collie/error.h"
#include "collie/types.h"
#include "collie/work.h"

namespace collie {

namespace trace {
struct OpSpan;  // base/trace.h
}
namespace kernels {
struct NonFiniteSeen;  // base/nonfinite.h
}

// The values are part of collie's wire format (TCP frame headers).
enum class OpKind : uint8_t {
  allreduce = 1,
  broadcast,
  allgather,
  reduce_scatter,
  barrier,
  p2p,
  split,
  alltoall,  // equal blocks, where the backend runs it (Backend::runs_alltoall)
};
// The last kind: a header naming a larger one is not collie's (comm/tcp).
inline constexpr OpKind kLastOpKind = OpKind::alltoall;
std::string_view to_string(OpKind k);

// The tags of the steps of COLLIE_DETERMINISTIC's all-reduce and
// reduce-scatter (comm/deterministic.h): which op a step's description
// belongs to, so that a rank with the mode off is told so by name.
inline constexpr int32_t kDeterministicAllreduce = 0x44455401;      // "DET" 1
inline constexpr int32_t kDeterministicReduceScatter = 0x44455402;  // "DET" 2

struct OpDesc {
  OpKind op = OpKind::allreduce;
  DType dtype = DType::u8;
  ReduceOp redop = ReduceOp::sum;
  uint32_t seq = 0;              // collective number, or per-pair message number for p2p
  int32_t tag = 0;               // p2p tag, broadcast root
  uint64_t count = 0;            // elements as the caller passed them
  std::string describe() const;  // "allreduce #3 (f32 x 1000, sum)"
};

// The cross-rank "same collective?" comparison of two descriptions (shm's
// descriptors go through it; tcp compares its frame headers and mpi its
// fingerprints and all-gathered words, each on its own wire): whether `a`
// and `b` are the same collective (kind, number, dtype, reduce op, count,
// tag),
inline bool same_collective(const OpDesc& a, const OpDesc& b) {
  return a.op == b.op && a.seq == b.seq && a.dtype == b.dtype && a.redop == b.redop &&
         a.count == b.count && a.tag == b.tag;
}
// and the error every backend throws when they are not: `mine` names this rank's call ("allreduce
// #3 (f32 x 1000, sum) on rank 0"), `peer` the rank that called `theirs`.
Error collective_mismatch(const std::string& mine, const std::string& peer, const OpDesc& theirs);

// The completion of one operation, which names it in messages ("allreduce
// #3 (f32 x 1000, sum) on rank 2"), formatted only when a message needs it:
// every op paid for the string when it was built up front. What each
// backend's completions derive from. `deadline` is the communicator's
// timeout; a plain Work::wait() waits a little over twice that, so that the
// op's own error (its deadline, a peer's failure) comes first.
class OpCompletion : public Completion {
 public:
  OpCompletion(const OpDesc& desc, int rank, std::chrono::milliseconds deadline)
      : Completion("", wait_timeout(deadline)), desc_(desc), rank_(rank) {}
  // How long a plain wait() waits for an op of a communicator whose
  // timeout is `deadline`.
  static std::chrono::milliseconds wait_timeout(std::chrono::milliseconds deadline) {
    return 2 * deadline + std::chrono::seconds(1);
  }
  const OpDesc& desc() const { return desc_; }

 protected:
  std::string describe() const override {
    return desc_.describe() + " on rank " + std::to_string(rank_);
  }

 private:
  const OpDesc desc_;
  const int rank_;
};

struct Op {
  OpDesc desc;
  // allreduce, reduce_scatter, allgather: in and out as the caller passed
  // them; broadcast, send and recv: the one buffer, in both.
  TensorView in{};
  TensorView out{};
  int peer = -1;  // send and recv
  bool is_send = false;
  // allreduce, reduce_scatter: COLLIE_DETERMINISTIC's form, which the host
  // executor runs as steps (comm/deterministic.h); its desc.seq is the first
  // of the numbers the front reserved for them.
  bool deterministic = false;
  // Its timeline entry under COLLIE_TRACE, or null (off): owned by the
  // trace module until trace::finished ends it (base/trace.h). A raw
  // pointer keeps Op trivially copyable: a shared_ptr here cost every op
  // about 80 instructions in its moves through the front and the executor.
  trace::OpSpan* trace = nullptr;
  // allreduce: where to record NaN and Inf found in the inputs as they are
  // reduced (Communicator::allreduce with a NonFiniteSeen), or null. Set
  // only on host memory.
  kernels::NonFiniteSeen* seen = nullptr;
  bool p2p() const { return desc.op == OpKind::p2p; }
};

}  // namespace collie
