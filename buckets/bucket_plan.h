// buckets/bucket_plan.h: which gradient goes in which bucket, and where.
//
// DDP reduces gradients in buckets so that one all-reduce carries many small
// tensors, and so that the first buckets can go out while backward is still
// producing the rest. BucketPlan assigns parameters to buckets in the order
// their gradients are expected to become ready (reverse registration order
// at first: backward produces the last layer's gradient first; later the
// order observed in the first iteration), one bucket stream per (dtype,
// device), the first bucket of each stream capped at `first_bucket_bytes`
// (small, so communication starts early) and the rest at `bucket_bytes`.
// FlatBuffer is a bucket's one contiguous allocation; gradient i lives at
// its offset inside it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "collie/types.h"

namespace collie {

struct ParamSpec {
  size_t numel = 0;
  DType dtype = DType::f32;
  Device device{};
};

struct Bucket {
  DType dtype = DType::f32;
  Device device{};
  std::vector<size_t> params;   // parameter indices, in the bucket's layout order
  std::vector<size_t> offsets;  // element offset of each, parallel to `params`
  size_t numel = 0;
  size_t nbytes() const { return numel * dtype_size(dtype); }
};

class BucketPlan {
 public:
  // `ready_order` lists every parameter once, earliest-ready first; empty
  // means reverse registration order. Throws invalid_argument on a bad
  // order (missing, repeated or out-of-range indices).
  static BucketPlan build(const std::vector<ParamSpec>& params, std::vector<size_t> ready_order,
                          size_t first_bucket_bytes, size_t bucket_bytes);

  const std::vector<Bucket>& buckets() const { return buckets_; }
  size_t num_params() const { return where_.size(); }
  // The bucket holding parameter i, and its position inside that bucket.
  size_t bucket_of(size_t param) const { return where_.at(param).first; }
  size_t slot_of(size_t param) const { return where_.at(param).second; }
  // A compact text form of the whole assignment, identical on every rank
  // whose plan is identical: what ranks compare to agree on a plan.
  std::string fingerprint() const;

 private:
  std::vector<Bucket> buckets_;
  std::vector<std::pair<size_t, size_t>> where_;
};

// One bucket's memory: owned, lent by the engine (which keeps it alive), or
// part of a larger allocation that `owner` keeps alive (BucketMemory's
// arenas).
class FlatBuffer {
 public:
  FlatBuffer() = default;
  static FlatBuffer allocate(DType dtype, size_t numel);
  static FlatBuffer borrow(TensorView memory);
  static FlatBuffer part_of(std::shared_ptr<void> owner, TensorView memory);

  TensorView view() const { return view_; }
  TensorView slice(size_t offset, size_t numel) const { return view_.slice(offset, numel); }
  void zero();

 private:
  std::shared_ptr<void> owner_;
  TensorView view_{};
};

}  // namespace collie
