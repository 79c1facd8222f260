#include "base/validate.h"

#include <cstdint>

#include "collie/error.h"

namespace collie::validate {

namespace {
Error bad(const Where& what, const std::string& msg) {
  return Error(ErrorCode::invalid_argument, what.str() + ": " + msg);
}
}  // namespace

void tensor(const TensorView& t, const Where& what, const char* name) {
  if (static_cast<unsigned>(t.dtype) >= static_cast<unsigned>(kNumDTypes))
    throw bad(what, std::string(name) + " has an unknown dtype code " +
                        std::to_string(static_cast<int>(t.dtype)));
  if (t.numel > 0 && t.data == nullptr)
    throw bad(what, std::string(name) + " has " + std::to_string(t.numel) +
                        " elements but a null data pointer");
}

[[noreturn]] void refused_device(const TensorView& t, const std::string& backend, const Where& what,
                                 const char* name) {
  if (t.device.is_cpu())
    throw bad(what, std::string(name) + " is in host memory; backend " + backend +
                        " moves device memory only");
  throw bad(what, std::string(name) + " is on " + to_string(t.device) + "; backend " + backend +
                      " moves CPU memory only here (CUDA tensors need a build with CUDA and a "
                      "device this process can use)");
}

void same_dtype(const TensorView& a, const TensorView& b, const Where& what) {
  if (a.dtype != b.dtype)
    throw bad(what, "input is " + std::string(to_string(a.dtype)) + " but output is " +
                        std::string(to_string(b.dtype)) + "; they must match");
}

void op_on(ReduceOp op, DType t, const Where& what) {
  if (static_cast<unsigned>(op) >= static_cast<unsigned>(kNumReduceOps))
    throw bad(what, "unknown reduce op code " + std::to_string(static_cast<int>(op)));
  if (!supports(op, t))
    throw bad(what, std::string(to_string(op)) + " is not defined on " + std::string(to_string(t)) +
                        " (it would truncate); use sum and divide, or a floating dtype");
}

void rank_in(int r, int size, const Where& what, const char* name) {
  if (r < 0 || r >= size)
    throw bad(what, std::string(name) + " " + std::to_string(r) + " is not a rank of this " +
                        "communicator (0.." + std::to_string(size - 1) + ")");
}

namespace {
bool overlap(const TensorView& a, const TensorView& b) {
  auto a0 = reinterpret_cast<uintptr_t>(a.data), a1 = a0 + a.nbytes();
  auto b0 = reinterpret_cast<uintptr_t>(b.data), b1 = b0 + b.nbytes();
  return a0 < b1 && b0 < a1 && a.nbytes() != 0 && b.nbytes() != 0;
}
}  // namespace

void same_or_disjoint(const TensorView& a, const TensorView& b, const Where& what) {
  if (a.data != b.data && overlap(a, b))
    throw bad(what, "input and output overlap without being the same buffer");
}

void disjoint(const TensorView& a, const TensorView& b, const Where& what, const char* why) {
  if (overlap(a, b)) throw bad(what, std::string("input and output overlap; ") + why);
}

}  // namespace collie::validate
