// python/collie/_comm_memory_ext.cc: where PyTorch's own DDP takes its
// gradient buckets' memory when its group is collie's. PyTorch's reducer
// (2.x of late, with DDP_DISABLE_COMM_MEM=0) asks the group's default
// c10d::Backend whether it offers communication memory
// (supportsTensorAlloc) and then allocates each bucket with
// allocateTensor. This Backend answers for host tensors with
// collie_comm_mem_alloc: memory that collie's shm backend maps into the
// peers and all-reduces in place, instead of reading each peer's bucket
// through process_vm_readv. It has no collective of its own: the
// collectives stay the Python ProcessGroup's (python/collie/distributed.py),
// which registers this as its default backend for the CPU: PyTorch calls a
// Python group's own methods for its collectives, and the reducer asks
// the default backend only for memory. A Python class cannot be this: the
// reducer hands allocateTensor a c10::TensorOptions, which pybind cannot
// pass to Python. Built against the running PyTorch, once per version, by
// python/collie/_comm_memory.py; it calls collie through the two function
// pointers it is given, so it links nothing of collie's.
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <torch/csrc/utils/pybind.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>

namespace {

using AllocFn = int (*)(void* comm, size_t bytes, void** out);
using FreeFn = int (*)(void* ptr);

std::atomic<int64_t> g_allocations{0};  // buckets handed out, by every group

class CommMemory : public c10d::Backend {
 public:
  CommMemory(int rank, int size, intptr_t comm, intptr_t alloc, intptr_t free)
      : c10d::Backend(rank, size),
        comm_(reinterpret_cast<void*>(comm)),
        alloc_(reinterpret_cast<AllocFn>(alloc)),
        free_(reinterpret_cast<FreeFn>(free)) {}

  // Not "collie": PyTorch names the backend in what it refuses, and this
  // one has no collective (torch.ops.c10d calls that reach it).
  const std::string getBackendName() const override { return "collie-memory"; }

  // Host memory only (a CPU device's index is -1); CUDA buckets stay
  // PyTorch's (or NCCL's, where "cuda:nccl" serves them).
  bool supportsTensorAlloc(c10::DeviceIndex index) override { return index < 0; }

  // collie's memory, or PyTorch's where collie has none to give (its
  // communicator closed, the memory refused): DDP runs either way, a
  // bucket in PyTorch's memory all-reduced as any tensor is.
  at::Tensor allocateTensor(long size, at::TensorOptions options) override {
    void* comm = comm_.load();
    if (comm != nullptr && options.device().is_cpu()) {
      size_t bytes = static_cast<size_t>(size) * options.dtype().itemsize();
      void* p = nullptr;
      int st = alloc_(comm, bytes > 0 ? bytes : 1, &p);
      if (st == 0 && p != nullptr) {
        ++g_allocations;
        return at::from_blob(
            p, {size}, [f = free_](void* q) { f(q); }, options);
      }
      TORCH_WARN_ONCE("collie: a DDP bucket of ", bytes,
                      " bytes is in PyTorch's memory: collie's was refused (status ", st, ")");
    }
    return at::empty({size}, options);
  }

  // The group's communicator is closing: no more allocations through it.
  void detach() { comm_.store(nullptr); }

 private:
  std::atomic<void*> comm_;
  AllocFn alloc_;
  FreeFn free_;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def(
      "make",
      [](int rank, int size, intptr_t comm, intptr_t alloc,
         intptr_t free) -> c10::intrusive_ptr<c10d::Backend> {
        return c10::make_intrusive<CommMemory>(rank, size, comm, alloc, free);
      },
      "The backend giving PyTorch's DDP collie's communication memory for its host buckets: "
      "make(rank, size, communicator handle, collie_comm_mem_alloc, collie_mem_free).");
  m.def(
      "detach",
      [](const c10::intrusive_ptr<c10d::Backend>& b) {
        if (auto* c = dynamic_cast<CommMemory*>(b.get())) c->detach();
      },
      "No more allocations through this backend: its communicator is closing.");
  m.def(
      "allocations", [] { return g_allocations.load(); },
      "How many buckets the backends of this process have allocated in collie's memory.");
}
