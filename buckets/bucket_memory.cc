#include "buckets/bucket_memory.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "base/cuda_api.h"
#include "collie/error.h"

namespace collie {

namespace {

constexpr size_t kAlign = 64;

class HostAllocator final : public BucketAllocator {
 public:
  void* allocate(size_t bytes, DType, Device device) override {
    if (!device.is_cpu()) {
      // CUDA memory through collie's CUDA API, zeroed before it is used.
      auto api = cuda::device_api();
      if (!api)
        throw Error(ErrorCode::unavailable,
                    "bucket memory on " + to_string(device) +
                        ": this build of collie has no CUDA; give the reducer an allocator for "
                        "that device (ReducerOptions::bucket_allocator)");
      void* p = api->device_alloc(bytes ? bytes : 1);
      api->zero_async(p, bytes, nullptr);
      api->synchronize(nullptr);
      return p;
    }
    void* p = ::operator new(bytes, std::align_val_t(kAlign), std::nothrow);
    if (!p)
      throw Error(ErrorCode::internal,
                  "could not allocate " + std::to_string(bytes) + " bytes of bucket memory");
    std::memset(p, 0, bytes);
    return p;
  }
  void release(void* ptr, size_t, Device device) noexcept override {
    if (!device.is_cpu()) {
      if (auto api = cuda::device_api()) api->device_free(ptr);
      return;
    }
    ::operator delete(ptr, std::align_val_t(kAlign));
  }
};

}  // namespace

std::shared_ptr<BucketAllocator> host_bucket_allocator() {
  static auto a = std::make_shared<HostAllocator>();
  return a;
}

struct BucketMemory::Arena {
  std::shared_ptr<BucketAllocator> allocator;
  void* ptr = nullptr;
  size_t bytes = 0;
  DType dtype = DType::f32;
  Device device{};
  ~Arena() {
    if (ptr) allocator->release(ptr, bytes, device);
  }
};

BucketMemory::Key BucketMemory::key_of(DType t, Device d) {
  return {static_cast<int>(t), static_cast<int>(d.kind), d.index};
}

BucketMemory::BucketMemory(const std::vector<ParamSpec>& params,
                           std::shared_ptr<BucketAllocator> allocator) {
  if (!allocator) allocator = host_bucket_allocator();
  // Every layout of a stream fits: its elements, plus, per bucket (at most
  // one per parameter), what aligning the bucket's start may skip.
  std::map<Key, std::pair<size_t, size_t>> need;  // bytes of elements, parameters
  for (const ParamSpec& p : params) {
    auto& n = need[key_of(p.dtype, p.device)];
    n.first += p.numel * dtype_size(p.dtype);
    n.second += 1;
  }
  for (const ParamSpec& p : params) {
    Key k = key_of(p.dtype, p.device);
    if (arenas_.count(k)) continue;
    auto a = std::make_shared<Arena>();
    a->allocator = allocator;
    a->dtype = p.dtype;
    a->device = p.device;
    a->bytes = std::max<size_t>(kAlign, need[k].first + need[k].second * kAlign);
    a->ptr = allocator->allocate(a->bytes, p.dtype, p.device);
    if (!a->ptr || reinterpret_cast<uintptr_t>(a->ptr) % dtype_size(p.dtype) != 0)
      throw Error(ErrorCode::invalid_argument,
                  "the bucket allocator returned " +
                      std::string(a->ptr ? "memory not aligned for " : "no memory for ") +
                      std::string(to_string(p.dtype)) + " elements");
    arenas_[k] = std::move(a);
  }
}

std::vector<FlatBuffer> BucketMemory::lay_out(const BucketPlan& plan) const {
  std::vector<FlatBuffer> out;
  std::map<Key, size_t> used;  // bytes laid out so far, per arena
  for (const Bucket& b : plan.buckets()) {
    const auto& arena = arenas_.at(key_of(b.dtype, b.device));
    size_t& at = used[key_of(b.dtype, b.device)];
    at = (at + kAlign - 1) / kAlign * kAlign;
    if (at + b.nbytes() > arena->bytes)
      throw Error(ErrorCode::internal, "a bucket layout does not fit its arena");
    TensorView v{static_cast<uint8_t*>(arena->ptr) + at, b.dtype, b.numel, b.device};
    out.push_back(FlatBuffer::part_of(arena, v));
    at += b.nbytes();
  }
  return out;
}

std::vector<TensorView> BucketMemory::arena_views() const {
  std::vector<TensorView> v;
  for (const auto& [k, a] : arenas_) v.push_back({a->ptr, DType::u8, a->bytes, a->device});
  return v;
}

size_t BucketMemory::bytes() const {
  size_t s = 0;
  for (const auto& [k, a] : arenas_) s += a->bytes;
  return s;
}

}  // namespace collie
