// buckets/bucket_memory.h: where a reducer's buckets live, and who provides
// the memory.
//
// An engine that wants its gradients to be views into bucket memory (PyTorch
// with gradient_as_bucket_view, a CUDA engine) hands the reducer a
// BucketAllocator, so that bucket memory comes from the engine's allocator,
// on the bucket's device. BucketMemory asks it once per (dtype, device)
// stream for an arena big enough for every layout of that stream's
// parameters, and lays buckets out inside it. A rebuilt plan is laid out in
// the same arenas: memory an engine views is never freed or moved while the
// reducer lives, only the assignment of gradients to places changes (and the
// reducer counts those changes: Reducer::layout_generation()).
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "buckets/bucket_plan.h"

namespace collie {

class BucketAllocator {
 public:
  virtual ~BucketAllocator() = default;
  // At least `bytes` bytes for elements of `dtype` on `device`, aligned to
  // 64 bytes. Throws collie::Error when it cannot.
  virtual void* allocate(size_t bytes, DType dtype, Device device) = 0;
  // Gives back what allocate() returned, once nothing uses it any more.
  virtual void release(void* ptr, size_t bytes, Device device) noexcept = 0;
};

// The default: zeroed, 64-byte aligned host memory, or zeroed CUDA memory
// through collie's CUDA API (base/cuda_api.h) for a CUDA device.
std::shared_ptr<BucketAllocator> host_bucket_allocator();

class BucketMemory {
 public:
  // Allocates one arena per (dtype, device) stream of `params`.
  BucketMemory(const std::vector<ParamSpec>& params, std::shared_ptr<BucketAllocator> allocator);

  // The buckets of `plan` (a plan over the same parameters), each a slice of
  // its stream's arena starting on a 64-byte boundary. The slices keep the
  // arena alive, so memory a late completion still writes is never freed
  // under it.
  std::vector<FlatBuffer> lay_out(const BucketPlan& plan) const;

  // Each arena, as bytes (a communicator registers them).
  std::vector<TensorView> arena_views() const;

  // Bytes the arenas take, and how many there are.
  size_t bytes() const;
  size_t arenas() const { return arenas_.size(); }

 private:
  struct Arena;
  using Key = std::tuple<int, int, int>;  // dtype, device kind, device index
  static Key key_of(DType t, Device d);
  std::map<Key, std::shared_ptr<Arena>> arenas_;
};

}  // namespace collie
