#include "base/op.h"

#include "collie/comm.h"

namespace collie {

std::string_view to_string(OpKind k) {
  switch (k) {
    case OpKind::allreduce:
      return "allreduce";
    case OpKind::broadcast:
      return "broadcast";
    case OpKind::allgather:
      return "allgather";
    case OpKind::reduce_scatter:
      return "reduce_scatter";
    case OpKind::barrier:
      return "barrier";
    case OpKind::p2p:
      return "send/recv";
    case OpKind::split:
      return "split";
    case OpKind::alltoall:
      return "alltoall";
  }
  return "unknown op";
}

std::string OpDesc::describe() const {
  std::string s(to_string(op));
  s += " #" + std::to_string(seq) + " (" + std::string(to_string(dtype)) + " x " +
       std::to_string(count);
  if (op == OpKind::allreduce || op == OpKind::reduce_scatter)
    s += ", " + std::string(to_string(redop));
  if (op == OpKind::broadcast) s += ", root " + std::to_string(tag);
  // A step of COLLIE_DETERMINISTIC's all-reduce or reduce-scatter
  // (comm/deterministic.h; these tags are its).
  if ((op == OpKind::alltoall || op == OpKind::allgather || op == OpKind::reduce_scatter) &&
      (tag == kDeterministicAllreduce || tag == kDeterministicReduceScatter)) {
    if (op != OpKind::reduce_scatter) s += ", " + std::string(to_string(redop));
    s += std::string(": a step of COLLIE_DETERMINISTIC's ") +
         (tag == kDeterministicAllreduce ? "allreduce" : "reduce_scatter");
  }
  if (op == OpKind::p2p) {
    s += ", tag " + std::to_string(tag);
    if (tag == kAlltoallTag) s += ": an alltoall's";  // the front's exchange
  }
  return s + ")";
}

Error collective_mismatch(const std::string& mine, const std::string& peer, const OpDesc& theirs) {
  const std::string t = theirs.describe();
  const bool mine_det = mine.find("COLLIE_DETERMINISTIC") != std::string::npos;
  const bool theirs_det = t.find("COLLIE_DETERMINISTIC") != std::string::npos;
  return Error(ErrorCode::mismatch,
               mine + " does not match " + peer + ", which called " + t +
                   (mine_det != theirs_det
                        ? ": COLLIE_DETERMINISTIC (Options::deterministic) is on for one and off "
                          "for the other; set it alike on every rank"
                        : ": every rank must issue the same collectives in the same order with "
                          "the same counts, dtypes and ops"));
}

}  // namespace collie
