// base/topology.h: facts about this host that tuning depends on.
#pragma once

#include <cstddef>
#include <string>

namespace collie::topology {

// Hardware threads this process may run on: its CPU binding (taskset, a
// launcher's --bind-to, cgroup limits) as hwloc reads it when collie is
// built with hwloc, else std::thread::hardware_concurrency(). Busy-polling
// only pays while every local rank has a thread of its own.
int usable_cpus();

// The L2 cache a core of this process has to itself, in bytes: the
// smallest L2 among the cores it may run on, divided by the cores that share
// it (from hwloc; without it, what the C library reports for the L2). 0 when
// unknown. The shm backend sizes its rounds by it.
size_t l2_per_core();

// This kernel's boot id ("" if unreadable): processes that share it share
// memory, whatever their host names say.
std::string boot_id();

// This host as collie sees it: "2 cores (2 hardware threads), 1 NUMA node,
// 1 L3 shared by all cores" (from hwloc; without it, the thread count only).
std::string describe_host();

// The CPUs this process may run on now, as a list: "0-3,8".
std::string binding();

// Binds this process (every thread, those started later too) to the share
// of this host that `how` gives local rank `local_rank` of `local_world_size`:
// "core": a contiguous block of the cores this process may use (its
// launcher's or taskset's binding), divided evenly (a rank gets one core,
// shared, when there are fewer cores than ranks); "numa": the usable NUMA
// node local_rank mod nodes; "none": nothing. Returns the CPUs
// bound to; throws collie::Error when the binding fails.
std::string bind(const std::string& how, int local_rank, int local_world_size);

// What tells this rank's host from another's, compared between ranks:
// `override_name` (COLLIE_HOSTNAME) when not empty, else the host name, the
// boot id and the network namespace, so that containers or network
// namespaces on one machine (ranks that talk over a network, not loopback)
// count as hosts of their own.
std::string host_identity(const std::string& override_name);

}  // namespace collie::topology
