// comm/tcp/tcp_backend.h: collie's own TCP transport as a backend.
//
// Creation rendezvouses through the store (each rank publishes the address
// it listens on, connects to every lower rank and accepts every higher one,
// each connection opened with the job secret) and leaves a full mesh of
// sockets (tcp_mesh.h). Operations run on a HostExecutor; collectives are
// collie's algorithms (comm/algorithms/) over the mesh.
#pragma once

#include "comm/host_executor.h"

namespace collie::tcp {

// The registry's line for this backend.
BackendEntry backend_entry();

// The runner behind the backend, for backends built of others (comm/hier/):
// collective over the ranks of `ctx`.
std::unique_ptr<HostRunner> make_runner(const BackendContext& ctx);

}  // namespace collie::tcp
