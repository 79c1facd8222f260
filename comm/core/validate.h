// comm/core/validate.h: the argument checks the communicator front runs
// before any backend sees a call, so that misuse is an invalid_argument
// error naming the rank and the argument, at the call, on the calling thread.
#pragma once

#include <string>

#include "collie/types.h"

namespace collie::validate {

// `what` prefixes messages: "allreduce on rank 2".
// A known dtype, and data for every element.
void tensor(const TensorView& t, const std::string& what, const char* name);
// A device the backend moves (`accepted`), else an error naming it.
void device(const TensorView& t, bool accepted, const std::string& backend, const std::string& what,
            const char* name);
void same_dtype(const TensorView& a, const TensorView& b, const std::string& what);
void op_on(ReduceOp op, DType t, const std::string& what);
void rank_in(int r, int size, const std::string& what, const char* name);
// Exactly the same memory or none shared: partial overlap is refused.
void same_or_disjoint(const TensorView& a, const TensorView& b, const std::string& what);

}  // namespace collie::validate
