// comm/core/topology.h: facts about this host that tuning depends on.
#pragma once

#include <string>

namespace collie::topology {

// Hardware threads this process may run on: its CPU binding (taskset, a
// launcher's --bind-to, cgroup limits) as hwloc reads it when collie is
// built with hwloc, else std::thread::hardware_concurrency(). Busy-polling
// only pays while every local rank has a thread of its own.
int usable_cpus();

// This kernel's boot id ("" if unreadable): processes that share it share
// memory, whatever their host names say.
std::string boot_id();

// What tells this rank's host from another's, compared between ranks:
// `override_name` (COLLIE_HOSTNAME) when not empty, else the host name, the
// boot id and the network namespace, so that containers or network
// namespaces on one machine (ranks that talk over a network, not loopback)
// count as hosts of their own.
std::string host_identity(const std::string& override_name);

}  // namespace collie::topology
