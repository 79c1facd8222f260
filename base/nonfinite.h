// base/nonfinite.h: finding NaN and Inf in a buffer of floats, on its own,
// while copying it, or inside a reduction (the reducer's check of gradients
// before they are averaged, COLLIE_CHECK_NONFINITE). Memory-bound like a
// copy: the copying and reducing forms test each element as they load it,
// so the search costs what the copy or the reduction already did.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

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

// What an all-reduce found in the inputs it reduced, searched inside the
// reduction pass (Communicator::allreduce with a NonFiniteSeen): for each
// rank whose input held NaN or Inf, and each tensor of the buffer they fell
// in, how many, the first and its value. Each rank sees part of the inputs
// (on shm, its slice of every rank's; on a ring, its own input and its left
// neighbour's first segment); the parts of all ranks cover every element of
// every rank's input exactly once, so the ranks' findings add up.
struct NonFiniteSeen {
  // Element offsets at which the buffer's tensors begin, ascending (the
  // caller's; empty: the buffer is one tensor).
  std::vector<size_t> starts;
  struct Hit {
    int rank;       // whose input
    size_t tensor;  // which tensor of the buffer (an index into starts)
    size_t count;   // how many non-finite elements
    size_t first;   // the first, as an element offset in the buffer
    double value;   // its value: NaN, +Inf or -Inf
  };
  std::vector<Hit> hits;  // by (rank, tensor), at most one each
  // Whether the search ran (set by whoever searched: the backend, in the
  // pass, or the executor, over this rank's input before a backend that
  // cannot); false after the op means nothing was searched.
  bool searched = false;

  // Records the non-finite elements of data[0, n), rank `rank`'s input at
  // elements [at, at + n) of the buffer. The slow path: for a block known
  // to hold one.
  void record(int rank, DType t, const void* data, size_t at, size_t n);
  // Searches data[0, n) (rank `rank`'s input at elements [at, at + n)) and
  // records what it finds: a pass of its own, for what no reduction reads.
  void search(int rank, DType t, const void* data, size_t at, size_t n);
};

// dst[i] = a[i] op b[i], as kernels::reduce (dst may alias a or b), with a
// searched as rank `a_rank`'s input and b as `b_rank`'s (-1: that operand
// is not searched: a partial sum, or another rank searches it), each found
// element recorded in `seen` at buffer offset at + i. Each block is tested
// as it is loaded, before the block's result is stored, and only a block
// that holds a non-finite element is looked at again.
void reduce_searching(DType t, ReduceOp op, void* dst, const void* a, const void* b, size_t n,
                      int divisor, NonFiniteSeen& seen, size_t at, int a_rank, int b_rank);

}  // namespace collie::kernels
