// comm/front/registry.cc: every backend collie knows of, built or not, in the
// order `auto` prefers them. This is the one file that names a backend's
// folder: a backend is added with a line here (see docs/architecture.md).
#include <cstring>
#include <new>

#include "comm/backend.h"
#include "comm/fake/fake_backend.h"
#include "comm/hier/hier_backend.h"
#include "comm/mpi/mpi_backend.h"
#include "comm/nccl/nccl_backend.h"
#include "comm/shm/shm_backend.h"
#include "comm/tcp/tcp_backend.h"

namespace collie {

std::shared_ptr<void> Backend::allocate(size_t bytes) {
  constexpr size_t kAlign = 64;
  if (bytes == 0) bytes = 1;
  void* p = ::operator new(bytes, std::align_val_t(kAlign), std::nothrow);
  if (!p)
    throw Error(ErrorCode::unavailable,
                "could not allocate " + std::to_string(bytes) + " bytes of host memory");
  std::memset(p, 0, bytes);
  return std::shared_ptr<void>(p, [](void* q) { ::operator delete(q, std::align_val_t(kAlign)); });
}

const std::vector<BackendEntry>& backend_registry() {
  static const std::vector<BackendEntry> registry = {
      nccl::backend_entry(),
      shm::backend_entry(),
      // Under mpirun across hosts: MPI's interconnect before TCP.
      mpi::backend_entry(),
      hier::backend_entry(),
      tcp::backend_entry(),
      // Every rank a thread of one process, for tests: never `auto`'s.
      fake::backend_entry(),
  };
  return registry;
}

namespace {

std::string names(bool built_only) {
  std::string s;
  for (const auto& b : backend_registry())
    if (b.built || !built_only) s += (s.empty() ? "" : ", ") + std::string(b.name);
  return s;
}

std::string unusable(const BackendEntry& b, const config::Launch& launch) {
  return b.unusable ? b.unusable(launch) : std::string();
}

}  // namespace

const BackendEntry& pick_backend(const std::string& requested, const config::Launch& launch) {
  const auto& all = backend_registry();
  if (requested == "auto") {
    for (const auto& b : all)
      if (b.built && b.automatic && unusable(b, launch).empty()) return b;
    throw Error(ErrorCode::unavailable, "no backend of this build can serve " +
                                            std::to_string(launch.world_size) +
                                            " ranks (built: " + names(true) + ")");
  }
  for (const auto& b : all) {
    if (requested != b.name) continue;
    if (!b.built)
      throw Error(ErrorCode::unavailable, "backend '" + requested +
                                              "' is not available: " + b.why_not_built +
                                              " (available: " + names(true) + ")");
    if (std::string why = unusable(b, launch); !why.empty())
      throw Error(ErrorCode::unavailable, "backend '" + requested + "' cannot serve these ranks: " +
                                              why + " (available: " + names(true) + ")");
    return b;
  }
  throw Error(ErrorCode::invalid_argument,
              "unknown backend '" + requested + "'; choose one of auto, " + names(false));
}

std::unique_ptr<HostRunner> make_host_runner(const std::string& name, const BackendContext& ctx) {
  for (const auto& b : backend_registry())
    if (name == b.name && b.make_runner) return b.make_runner(ctx);
  throw Error(ErrorCode::internal, "no host backend named '" + name + "' in this build");
}

}  // namespace collie
