// hooks/builtin_hooks.h: the hooks without parameters, as the registry
// (comm_hook.cc) makes them.
#pragma once

#include <memory>

#include "hooks/comm_hook.h"

namespace collie {

// The average over every rank (the default hook).
std::unique_ptr<CommHook> make_allreduce_hook();
// Sends nothing: each rank keeps its own gradients.
std::unique_ptr<CommHook> make_noop_hook();
// Compresses the bucket to `narrow` (f16 or bf16); alone (`inner` null) it
// sums in the narrow type, divided by the world size first (PyTorch's
// fp16_compress_hook); around `inner` it hands that the narrow bucket.
std::unique_ptr<CommHook> make_compress_hook(DType narrow, std::unique_ptr<CommHook> inner);

}  // namespace collie
