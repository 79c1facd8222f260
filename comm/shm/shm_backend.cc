// comm/shm/shm_backend.cc: the shm backend's registry line: whether it can
// serve these ranks (every rank on this host) and its runner
// (comm/shm/shm_runner.h) on a HostExecutor.
#include "comm/shm/shm_backend.h"

#include "comm/shm/shm_runner.h"

namespace collie::shm {

namespace {
std::string unusable(const config::Launch& l) {
  if (l.local_world_size == l.world_size) return "";
  return "it needs every rank on one host, and these " + std::to_string(l.world_size) +
         " ranks have " + std::to_string(l.local_world_size) + " per host (use tcp across hosts)";
}

}  // namespace

std::unique_ptr<HostRunner> make_runner(const BackendContext& ctx) {
  auto t = config::shm_tuning(ctx.env);
  // The spin is allowed whatever the rank count: the segment spins only
  // while the awake ranks fit their cores (Segment::core_free), which is
  // what the host-wide guess of the other backends approximates.
  return std::make_unique<ShmRunner>(ctx, t, SpinBudget::from_setting(t.spin_us, true));
}

BackendEntry backend_entry() {
  BackendEntry e{"shm", true, "", &unusable, [](const BackendContext& ctx) {
                   return make_host_backend("shm", &make_runner, ctx);
                 }};
  e.make_runner = &make_runner;
  return e;
}

}  // namespace collie::shm
