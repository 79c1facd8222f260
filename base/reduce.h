// base/reduce.h: the element-wise kernels collectives are made of.
//
// Every kernel works on any dtype. f16 and bf16 are widened to f32, combined
// and rounded once (round to nearest even), so partial sums are accumulated
// in f32 at each step; f32 and f64 are combined in their own type.
#pragma once

#include <cstddef>
#include <cstdint>

#include "collie/types.h"

namespace collie::kernels {

float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
float bf16_to_float(uint16_t b);
uint16_t float_to_bf16(float f);

// dst[i] = a[i] op b[i] for i < n; dst may alias a or b. For avg, `divisor`
// > 0 makes this the last step: dst[i] = (a[i] + b[i]) / divisor, rounded
// once; divisor 0 means a plain sum (an intermediate step).
void reduce(DType t, ReduceOp op, void* dst, const void* a, const void* b, size_t n,
            int divisor = 0);

// reduce() for f16 and bf16 sums and averages that calls watch(ctx, i, m)
// for each block of elements [i, i + m) whose results, in f32, are not all
// finite: a non-finite operand there (f16 sums cannot overflow f32; bf16
// ones can, which calls it too), its operands still whole (where dst
// aliases an operand, the block is stored after the call; elsewhere it may
// be stored before). For the search for NaN and Inf inside a reduction
// (base/nonfinite.h), whose watcher reads the operands and records.
using NonFiniteBlock = void (*)(void* ctx, size_t first, size_t count);
void reduce16_watching(DType t, ReduceOp op, void* dst, const void* a, const void* b, size_t n,
                       int divisor, NonFiniteBlock watch, void* ctx);

// Converts between float types (f32, f16, bf16; f64 too, slower):
// dst[i] = src[i] / divisor, computed in f32 and rounded once. Uses the F16C
// instructions for f16 where the CPU has them. For compression hooks.
void convert(DType src_type, const void* src, DType dst_type, void* dst, size_t n, int divisor = 1);

// dst[i] = src[i] / divisor (float types): avg on a single rank, and the
// finishing step of algorithms that sum first.
void divide(DType t, void* dst, const void* src, size_t n, int divisor);

}  // namespace collie::kernels
