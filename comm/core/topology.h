// comm/core/topology.h: facts about this host that tuning depends on.
#pragma once

namespace collie::topology {

// Hardware threads this process may run on: its CPU binding (taskset, a
// launcher's --bind-to, cgroup limits) as hwloc reads it when collie is
// built with hwloc, else std::thread::hardware_concurrency(). Busy-polling
// only pays while every local rank has a thread of its own.
int usable_cpus();

}  // namespace collie::topology
