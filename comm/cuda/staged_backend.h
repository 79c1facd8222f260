// comm/cuda/staged_backend.h: CUDA tensors on the host backends (tcp, shm,
// hier, mpi), staged through pinned host memory.
//
// connect() puts this around a host backend whenever a CUDA API is there
// (a build with CUDA, or a test's fake device); it touches the device only
// when the first CUDA tensor comes. Host tensors go straight to the inner
// backend, unchanged, until then; afterwards they keep their place in
// order behind the staged operations.
//
// An all-reduce or broadcast of a CUDA tensor runs in pieces of
// COLLIE_CUDA_CHUNK bytes through two pinned buffers: the device-to-host
// copy of piece k+1 runs on the staging stream while the inner backend
// moves piece k, and each result is copied back on the same stream. Every
// piece is an operation of the inner backend, numbered on from the
// caller's (every rank cuts the same pieces, so the numbers agree). The
// other collectives stage the whole tensor at once; sends and receives
// stage theirs and do not hold the queue, so a pairwise exchange still
// progresses as one batch. The Work is a host completion: wait_on(stream)
// waits on the host.
//
// Where NCCL is built (COLLIE_CUDA_BACKEND=auto or nccl), CUDA tensors go
// to an NCCL communicator instead, made beside the inner one when the
// first CUDA tensor comes (every rank issues the same operations, so every
// rank makes it at the same one), as PyTorch's "cpu:gloo,cuda:nccl" does.
#pragma once

#include <functional>
#include <memory>

#include "base/cuda_api.h"
#include "comm/backend.h"

namespace collie::cuda {

// Makes the backend that moves this communicator's CUDA tensors instead of
// staging them (nccl's registry entry), from a context like the inner
// backend's with its own key.
using DeviceFactory = std::function<std::unique_ptr<Backend>(const BackendContext&)>;

// `make_device` may be empty (this build has no NCCL): CUDA tensors are
// then staged whatever COLLIE_CUDA_BACKEND says, except "nccl", which is an
// error at the first CUDA tensor.
std::unique_ptr<Backend> make_staged(std::unique_ptr<Backend> inner, std::shared_ptr<Api> api,
                                     const BackendContext& ctx, DeviceFactory make_device = {});

}  // namespace collie::cuda
