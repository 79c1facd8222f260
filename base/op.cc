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
  if (op == OpKind::p2p) {
    s += ", tag " + std::to_string(tag);
    if (tag == kAlltoallTag) s += ": an alltoall's";  // the front's exchange
  }
  return s + ")";
}

Error collective_mismatch(const std::string& mine, const std::string& peer, const OpDesc& theirs) {
  return Error(ErrorCode::mismatch, mine + " does not match " + peer + ", which called " +
                                        theirs.describe() +
                                        ": every rank must issue the same collectives in the same "
                                        "order with the same counts, dtypes and ops");
}

}  // namespace collie
