#include "buckets/bucket_plan.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <tuple>

#include "collie/error.h"

namespace collie {

BucketPlan BucketPlan::build(const std::vector<ParamSpec>& params, std::vector<size_t> order,
                             size_t first_bucket_bytes, size_t bucket_bytes) {
  const size_t n = params.size();
  if (order.empty()) {
    order.resize(n);
    for (size_t i = 0; i < n; ++i) order[i] = n - 1 - i;
  }
  if (order.size() != n)
    throw Error(ErrorCode::invalid_argument, "bucket order lists " + std::to_string(order.size()) +
                                                 " parameters, not " + std::to_string(n));
  std::vector<bool> seen(n, false);
  for (size_t p : order) {
    if (p >= n || seen[p])
      throw Error(ErrorCode::invalid_argument,
                  "bucket order has " + std::string(p >= n ? "out-of-range" : "repeated") +
                      " parameter index " + std::to_string(p));
    seen[p] = true;
  }

  BucketPlan plan;
  plan.where_.assign(n, {0, 0});
  // One open bucket per (dtype, device) stream; a stream's first bucket uses
  // the small cap, later ones the large cap.
  struct Stream {
    long open = -1;  // index into buckets_
    bool first = true;
  };
  std::map<std::tuple<int, int, int>, Stream> streams;
  for (size_t p : order) {
    const ParamSpec& spec = params[p];
    auto key = std::make_tuple(static_cast<int>(spec.dtype), static_cast<int>(spec.device.kind),
                               spec.device.index);
    Stream& s = streams[key];
    if (s.open < 0) {
      plan.buckets_.push_back(Bucket{spec.dtype, spec.device, {}, {}, 0});
      s.open = static_cast<long>(plan.buckets_.size() - 1);
    }
    Bucket& b = plan.buckets_[static_cast<size_t>(s.open)];
    b.params.push_back(p);
    b.offsets.push_back(b.numel);
    b.numel += spec.numel;
    size_t cap = s.first ? first_bucket_bytes : bucket_bytes;
    if (b.nbytes() >= cap) {
      s.open = -1;
      s.first = false;
    }
  }
  for (size_t bi = 0; bi < plan.buckets_.size(); ++bi)
    for (size_t k = 0; k < plan.buckets_[bi].params.size(); ++k)
      plan.where_[plan.buckets_[bi].params[k]] = {bi, k};
  return plan;
}

std::string BucketPlan::fingerprint() const {
  std::string s;
  for (const auto& b : buckets_) {
    s += std::string(to_string(b.dtype)) + "@" + to_string(b.device) + ":";
    for (size_t k = 0; k < b.params.size(); ++k)
      s += std::to_string(b.params[k]) + "+" + std::to_string(b.offsets[k]) + ",";
    s += "=" + std::to_string(b.numel) + ";";
  }
  return s;
}

FlatBuffer FlatBuffer::allocate(DType dtype, size_t numel) {
  FlatBuffer f;
  size_t bytes = std::max<size_t>(1, numel * dtype_size(dtype));
  std::shared_ptr<uint8_t[]> mem(new uint8_t[bytes]());
  f.view_ = TensorView{mem.get(), dtype, numel, Device::cpu()};
  f.owner_ = std::move(mem);
  return f;
}

FlatBuffer FlatBuffer::part_of(std::shared_ptr<void> owner, TensorView memory) {
  FlatBuffer f;
  f.owner_ = std::move(owner);
  f.view_ = memory;
  return f;
}

FlatBuffer FlatBuffer::borrow(TensorView memory) {
  FlatBuffer f;
  f.view_ = memory;
  return f;
}

void FlatBuffer::zero() {
  if (view_.nbytes()) std::memset(view_.data, 0, view_.nbytes());
}

}  // namespace collie
