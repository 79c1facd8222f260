// kernels/kernels.h: the CUDA kernels collie needs, and their CPU twins.
//
// Each kernel has a twin on the CPU that defines what it must compute; the
// GPU suite (tests/gpu/) runs both on the same random data, the kernel's
// output poisoned first, and compares. The kernels are memory-bound: they
// move 16 bytes per load and store where the pointers allow it, and the
// GPU suite reports their bandwidth against a device-to-device copy's.
//
//  * convert: the compression hooks' casts (f32 <-> f16/bf16) and the
//    scaling for avg: dst = src / divisor, computed in f32 (f64 when either
//    side is f64) and rounded once. Twin: collie::kernels::convert.
//  * copy_all: many copies in one launch: packing gradients into a bucket
//    and unpacking them. Twin: copy_all_cpu.
//
// The launchers queue work on `stream` (a cudaStream_t) and return. In a
// build without CUDA (COLLIE_HAVE_CUDA 0) they throw Error{unavailable}.
#pragma once

#include <cstddef>

#include "collie/types.h"

namespace collie::gpu {

// Whether this build has the CUDA kernels.
bool built();

void convert(DType src_type, const void* src, DType dst_type, void* dst, size_t n, int divisor,
             void* stream);

struct Copy {
  const void* src;
  void* dst;
  size_t bytes;
};

// Every copy of `copies`, an array of `n` in device memory, as one launch.
void copy_all(const Copy* copies, size_t n, void* stream);
// The twin: the same copies on the host.
void copy_all_cpu(const Copy* copies, size_t n);

}  // namespace collie::gpu
