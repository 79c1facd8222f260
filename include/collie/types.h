// collie/types.h: the vocabulary every layer shares: element types, devices,
// reduction operators and the non-owning tensor description.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace collie {

enum class DType : uint8_t { f32 = 0, f64, f16, bf16, i32, i64, u8, i8 };
inline constexpr int kNumDTypes = 8;

size_t dtype_size(DType t);
std::string_view to_string(DType t);
std::optional<DType> parse_dtype(std::string_view name);
bool is_floating(DType t);

enum class ReduceOp : uint8_t { sum = 0, avg, min, max, prod };
inline constexpr int kNumReduceOps = 5;

std::string_view to_string(ReduceOp op);
std::optional<ReduceOp> parse_reduce_op(std::string_view name);

// Whether `op` is defined on `t`. avg on integers is refused: it would
// truncate, and a user who wants that can sum and divide.
bool supports(ReduceOp op, DType t);

struct Device {
  enum class Kind : uint8_t { cpu = 0, cuda = 1 };
  Kind kind = Kind::cpu;
  int index = 0;

  static Device cpu() { return {}; }
  static Device cuda(int i) { return {Kind::cuda, i}; }
  bool is_cpu() const { return kind == Kind::cpu; }
  bool operator==(const Device&) const = default;
};

std::string to_string(Device d);

// A contiguous run of `numel` elements of `dtype` at `data` on `device`.
// Does not own its memory; the caller keeps it alive until the operation
// that uses it is complete.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  size_t numel = 0;
  Device device{};

  size_t nbytes() const { return numel * dtype_size(dtype); }
  TensorView slice(size_t offset, size_t n) const;
};

template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::f32;
};
template <>
struct DTypeOf<double> {
  static constexpr DType value = DType::f64;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr DType value = DType::i32;
};
template <>
struct DTypeOf<int64_t> {
  static constexpr DType value = DType::i64;
};
template <>
struct DTypeOf<uint8_t> {
  static constexpr DType value = DType::u8;
};
template <>
struct DTypeOf<int8_t> {
  static constexpr DType value = DType::i8;
};

template <typename T>
TensorView view_of(T* data, size_t numel) {
  return TensorView{static_cast<void*>(data), DTypeOf<T>::value, numel, Device::cpu()};
}

}  // namespace collie
