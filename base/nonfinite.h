// base/nonfinite.h: finding NaN and Inf in a buffer of floats, on its own
// or while copying it (the reducer's check of gradients before they are
// averaged, COLLIE_CHECK_NONFINITE). Memory-bound like a copy: the copying
// form reads each element once, so with it the check costs what the copy
// already did.
#pragma once

#include <cstddef>
#include <cstdint>

#include "collie/types.h"

namespace collie::kernels {

struct NonFinite {
  size_t count = 0;  // how many elements are NaN or +-Inf
  size_t first = 0;  // the index of the first of them (when count > 0)
  double value = 0;  // its value: NaN, +Inf or -Inf
};

// The non-finite elements of data[0..n) (integer dtypes have none).
NonFinite find_nonfinite(DType t, const void* data, size_t n);
// The same while copying src to dst (host memory; they must not overlap).
NonFinite copy_find_nonfinite(DType t, void* dst, const void* src, size_t n);

}  // namespace collie::kernels
