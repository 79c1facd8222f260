// base/validate.h: the argument checks the communicator front runs
// before any backend sees a call, so that misuse is an invalid_argument
// error naming the rank and the argument, at the call, on the calling thread.
#pragma once

#include <string>

#include "collie/types.h"

namespace collie::validate {

// What a call is, for messages: "allreduce on rank 2". Formatted only when
// a check fails: building the string for every call cost a small
// all-reduce two mallocs, a tenth of its time on shm.
struct Where {
  const char* op;
  int rank;
  std::string str() const { return std::string(op) + " on rank " + std::to_string(rank); }
};

// A known dtype, and data for every element.
void tensor(const TensorView& t, const Where& what, const char* name);
// The error for a tensor on a device `backend` does not move. The caller
// asks the backend first: the backend's name is built only for this.
[[noreturn]] void refused_device(const TensorView& t, const std::string& backend, const Where& what,
                                 const char* name);
void same_dtype(const TensorView& a, const TensorView& b, const Where& what);
void op_on(ReduceOp op, DType t, const Where& what);
void rank_in(int r, int size, const Where& what, const char* name);
// Exactly the same memory or none shared: partial overlap is refused.
void same_or_disjoint(const TensorView& a, const TensorView& b, const Where& what);
// No memory shared at all: "input and output overlap; <why>".
void disjoint(const TensorView& a, const TensorView& b, const Where& what, const char* why);

}  // namespace collie::validate
