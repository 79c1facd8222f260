// comm/tcp/tcp_backend.h: collie's own TCP transport as a backend.
//
// Creation rendezvouses through the store (each rank publishes the address
// it listens on, connects to every lower rank and accepts every higher one,
// each connection opened with the job secret) and leaves a full mesh of
// sockets (tcp_mesh.h). Operations run on a HostExecutor; collectives are
// collie's algorithms (comm/algorithms/) over the mesh.
#pragma once

#include "comm/backend.h"

namespace collie::tcp {

// The registry's line for this backend.
BackendEntry backend_entry();

}  // namespace collie::tcp
