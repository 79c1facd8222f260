#include "comm/core/topology.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <thread>

#include "collie_build_config.h"

#if COLLIE_HAVE_HWLOC
#include <hwloc.h>
#endif

namespace collie::topology {

int usable_cpus() {
  static const int n = [] {
    int count = 0;
#if COLLIE_HAVE_HWLOC
    hwloc_topology_t topo;
    if (hwloc_topology_init(&topo) == 0) {
      if (hwloc_topology_load(topo) == 0) {
        hwloc_bitmap_t set = hwloc_bitmap_alloc();
        if (set && hwloc_get_cpubind(topo, set, HWLOC_CPUBIND_PROCESS) == 0)
          count = hwloc_bitmap_weight(set);
        if (count <= 0) count = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU);
        if (set) hwloc_bitmap_free(set);
      }
      hwloc_topology_destroy(topo);
    }
#endif
    if (count <= 0) count = static_cast<int>(std::thread::hardware_concurrency());
    return count;
  }();
  return n;
}

std::string boot_id() {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string s;
  std::getline(f, s);
  return s;
}

std::string host_identity(const std::string& override_name) {
  if (!override_name.empty()) return override_name;
  char name[256] = {0};
  if (gethostname(name, sizeof name - 1) != 0) name[0] = 0;
  std::string id = std::string(name) + " boot " + boot_id();
  struct stat st {};
  if (stat("/proc/self/ns/net", &st) == 0) id += " netns " + std::to_string(st.st_ino);
  return id;
}

}  // namespace collie::topology
