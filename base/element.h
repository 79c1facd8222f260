// base/element.h: one element of any dtype, read or written as a
// double. For checks and tools (the benchmark's verification, the tests'
// references), never for hot loops: those are in reduce.h.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/reduce.h"
#include "collie/types.h"

namespace collie {

inline void put_element(DType t, void* buf, size_t i, double v) {
  switch (t) {
    case DType::f32:
      static_cast<float*>(buf)[i] = static_cast<float>(v);
      break;
    case DType::f64:
      static_cast<double*>(buf)[i] = v;
      break;
    case DType::f16:
      static_cast<uint16_t*>(buf)[i] = kernels::float_to_half(static_cast<float>(v));
      break;
    case DType::bf16:
      static_cast<uint16_t*>(buf)[i] = kernels::float_to_bf16(static_cast<float>(v));
      break;
    case DType::i32:
      static_cast<int32_t*>(buf)[i] = static_cast<int32_t>(v);
      break;
    case DType::i64:
      static_cast<int64_t*>(buf)[i] = static_cast<int64_t>(v);
      break;
    case DType::u8:
      static_cast<uint8_t*>(buf)[i] = static_cast<uint8_t>(v);
      break;
    case DType::i8:
      static_cast<int8_t*>(buf)[i] = static_cast<int8_t>(v);
      break;
  }
}

inline double get_element(DType t, const void* buf, size_t i) {
  switch (t) {
    case DType::f32:
      return static_cast<const float*>(buf)[i];
    case DType::f64:
      return static_cast<const double*>(buf)[i];
    case DType::f16:
      return kernels::half_to_float(static_cast<const uint16_t*>(buf)[i]);
    case DType::bf16:
      return kernels::bf16_to_float(static_cast<const uint16_t*>(buf)[i]);
    case DType::i32:
      return static_cast<const int32_t*>(buf)[i];
    case DType::i64:
      return static_cast<double>(static_cast<const int64_t*>(buf)[i]);
    case DType::u8:
      return static_cast<const uint8_t*>(buf)[i];
    case DType::i8:
      return static_cast<const int8_t*>(buf)[i];
  }
  return 0;
}

}  // namespace collie
