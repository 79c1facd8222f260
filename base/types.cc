#include "collie/types.h"

#include <array>

#include "collie/error.h"

namespace collie {

namespace {
struct DTypeInfo {
  std::string_view name;
  size_t size;
  bool floating;
};
constexpr std::array<DTypeInfo, kNumDTypes> kDTypes = {{
    {"f32", 4, true},
    {"f64", 8, true},
    {"f16", 2, true},
    {"bf16", 2, true},
    {"i32", 4, false},
    {"i64", 8, false},
    {"u8", 1, false},
    {"i8", 1, false},
}};
constexpr std::array<std::string_view, kNumReduceOps> kOps = {"sum", "avg", "min", "max", "prod"};
}  // namespace

size_t dtype_size(DType t) {
  return kDTypes.at(static_cast<size_t>(t)).size;
}
std::string_view to_string(DType t) {
  return kDTypes.at(static_cast<size_t>(t)).name;
}
bool is_floating(DType t) {
  return kDTypes.at(static_cast<size_t>(t)).floating;
}

std::optional<DType> parse_dtype(std::string_view name) {
  for (size_t i = 0; i < kDTypes.size(); ++i)
    if (kDTypes[i].name == name) return static_cast<DType>(i);
  if (name == "float" || name == "float32") return DType::f32;
  if (name == "double" || name == "float64") return DType::f64;
  if (name == "half" || name == "float16") return DType::f16;
  if (name == "bfloat16") return DType::bf16;
  if (name == "int" || name == "int32") return DType::i32;
  if (name == "int64") return DType::i64;
  if (name == "uint8") return DType::u8;
  if (name == "int8") return DType::i8;
  return std::nullopt;
}

std::string_view to_string(ReduceOp op) {
  return kOps.at(static_cast<size_t>(op));
}

std::optional<ReduceOp> parse_reduce_op(std::string_view name) {
  for (size_t i = 0; i < kOps.size(); ++i)
    if (kOps[i] == name) return static_cast<ReduceOp>(i);
  return std::nullopt;
}

bool supports(ReduceOp op, DType t) {
  return op != ReduceOp::avg || is_floating(t);
}

std::string to_string(Device d) {
  return d.is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(d.index);
}

TensorView TensorView::slice(size_t offset, size_t n) const {
  if (offset + n > numel)
    throw Error(ErrorCode::invalid_argument,
                "slice [" + std::to_string(offset) + ", " + std::to_string(offset + n) +
                    ") is outside a tensor of " + std::to_string(numel) + " elements");
  return TensorView{static_cast<uint8_t*>(data) + offset * dtype_size(dtype), dtype, n, device};
}

}  // namespace collie
