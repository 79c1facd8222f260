// comm/fake/fake_backend.h: the `fake` backend: every rank a thread of one
// process, its bytes moved by the in-process fake network
// (comm/fake/fake_network.h) with collie's own algorithms, chosen as the
// TCP backend chooses them. It is for tests of everything above a backend
// (the front, the reducer, the hooks, the C ABI) in milliseconds and without
// collie-run, with failure injection (config::fake_injection:
// COLLIE_FAKE_SHUFFLE, COLLIE_FAKE_VANISH).
//
// Never picked by `auto`: ask for it by name (Options::backend = "fake"),
// with a store every rank of the process shares (make_memory_store, or a
// TCP store). Rank 0 makes the network and names it in the store; the other
// ranks find it in this process by that name (a rank in another process is
// told it cannot join).
#pragma once

#include "comm/host_executor.h"

namespace collie::fake {

// The registry's line for this backend.
BackendEntry backend_entry();

}  // namespace collie::fake
