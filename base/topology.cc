#include "base/topology.h"

#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <thread>
#include <utility>
#include <vector>

#include "collie/error.h"
#include "collie_build_config.h"

#if COLLIE_HAVE_HWLOC
#include <hwloc.h>
#endif

namespace collie::topology {

namespace {

// Bumped by bind(): usable_cpus() counts again after a binding.
std::atomic<int> cached_cpus{0};

std::string cpu_list(const cpu_set_t& set) {
  std::string s;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (!CPU_ISSET(c, &set)) continue;
    int e = c;
    while (e + 1 < CPU_SETSIZE && CPU_ISSET(e + 1, &set)) ++e;
    s += (s.empty() ? "" : ",") + std::to_string(c) + (e > c ? "-" + std::to_string(e) : "");
    c = e;
  }
  return s;
}

// The items [first, last) of `units` that local rank r of L gets: a
// contiguous block, units divided evenly, at least one (shared when there
// are fewer units than ranks); with `one`, item r mod units only.
std::pair<int, int> share(int r, int L, int units, bool one) {
  if (one || units < L) return {r % units, r % units + 1};
  return {static_cast<int>(static_cast<long>(r) * units / L),
          static_cast<int>(static_cast<long>(r + 1) * units / L)};
}

#if COLLIE_HAVE_HWLOC
// A loaded topology, destroyed with this object.
struct Topo {
  hwloc_topology_t t = nullptr;
  Topo() {
    if (hwloc_topology_init(&t) != 0) {
      t = nullptr;
      return;
    }
    if (hwloc_topology_load(t) != 0) {
      hwloc_topology_destroy(t);
      t = nullptr;
    }
  }
  ~Topo() {
    if (t) hwloc_topology_destroy(t);
  }
  int count(hwloc_obj_type_t type) const { return t ? hwloc_get_nbobjs_by_type(t, type) : 0; }
};
#endif

}  // namespace

int usable_cpus() {
  if (int n = cached_cpus.load(std::memory_order_relaxed); n > 0) return n;
  int count = 0;
#if COLLIE_HAVE_HWLOC
  Topo topo;
  if (topo.t) {
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    if (set && hwloc_get_cpubind(topo.t, set, HWLOC_CPUBIND_PROCESS) == 0)
      count = hwloc_bitmap_weight(set);
    if (count <= 0) count = topo.count(HWLOC_OBJ_PU);
    if (set) hwloc_bitmap_free(set);
  }
#endif
  if (count <= 0) count = static_cast<int>(std::thread::hardware_concurrency());
  cached_cpus.store(count, std::memory_order_relaxed);
  return count;
}

size_t l2_per_core() {
  // Read once: hwloc loads the whole topology, and rank 0 asks on every
  // segment it makes (splits, sub-communicators).
  static const size_t cached = [] {
    size_t best = 0;
#if COLLIE_HAVE_HWLOC
    Topo topo;
    if (topo.t) {
      hwloc_bitmap_t mine = hwloc_bitmap_alloc();
      if (mine && hwloc_get_cpubind(topo.t, mine, HWLOC_CPUBIND_PROCESS) != 0)
        hwloc_bitmap_copy(mine, hwloc_topology_get_allowed_cpuset(topo.t));
      for (int i = 0; mine && i < topo.count(HWLOC_OBJ_L2CACHE); ++i) {
        hwloc_obj_t c = hwloc_get_obj_by_type(topo.t, HWLOC_OBJ_L2CACHE, i);
        if (!c->attr || !hwloc_bitmap_intersects(c->cpuset, mine)) continue;
        const int cores =
            std::max(1, hwloc_get_nbobjs_inside_cpuset_by_type(topo.t, c->cpuset, HWLOC_OBJ_CORE));
        const size_t share = static_cast<size_t>(c->attr->cache.size) / cores;
        if (share > 0 && (best == 0 || share < best)) best = share;
      }
      if (mine) hwloc_bitmap_free(mine);
    }
#endif
    if (best == 0) {
      const long v = sysconf(_SC_LEVEL2_CACHE_SIZE);
      if (v > 0) best = static_cast<size_t>(v);
    }
    return best;
  }();
  return cached;
}

std::string binding() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return "?";
  return cpu_list(set);
}

std::string describe_host() {
#if COLLIE_HAVE_HWLOC
  Topo topo;
  if (topo.t) {
    const int cores = topo.count(HWLOC_OBJ_CORE), pus = topo.count(HWLOC_OBJ_PU);
    const int numa = std::max(1, topo.count(HWLOC_OBJ_NUMANODE));
    const int l3 = topo.count(HWLOC_OBJ_L3CACHE);
    auto plural = [](int n, const char* one, const char* many) {
      return std::to_string(n) + " " + (n == 1 ? one : many);
    };
    std::string s = plural(cores, "core", "cores") + " (" +
                    plural(pus, "hardware thread", "hardware threads") + "), " +
                    plural(numa, "NUMA node", "NUMA nodes");
    if (l3 > 0)
      s += ", " + plural(l3, "L3", "L3s") +
           (l3 == 1 ? " shared by all cores" : " (" + std::to_string(cores / l3) + " cores each)");
    return s;
  }
#endif
  return std::to_string(std::thread::hardware_concurrency()) + " hardware threads (no hwloc)";
}

std::string bind(const std::string& how, int local_rank, int local_world_size) {
  if (how == "none") return binding();
  const int L = std::max(1, local_world_size), r = std::max(0, local_rank);
  auto fail = [&](const std::string& why) {
    return Error(ErrorCode::unavailable,
                 "COLLIE_BIND=" + how + " on local rank " + std::to_string(r) + ": " + why);
  };
#if COLLIE_HAVE_HWLOC
  Topo topo;
  if (!topo.t) throw fail("hwloc cannot read this host's topology");
  // Only the CPUs this process may use now (a launcher's or taskset's
  // binding) are shared out: the cores and nodes that have some of them.
  hwloc_bitmap_t allowed = hwloc_bitmap_alloc(), set = hwloc_bitmap_alloc();
  if (hwloc_get_cpubind(topo.t, allowed, HWLOC_CPUBIND_PROCESS) != 0)
    hwloc_bitmap_copy(allowed, hwloc_topology_get_allowed_cpuset(topo.t));
  const hwloc_obj_type_t type = how == "core" ? HWLOC_OBJ_CORE : HWLOC_OBJ_NUMANODE;
  std::vector<hwloc_obj_t> usable;
  for (int i = 0; i < topo.count(type); ++i) {
    hwloc_obj_t o = hwloc_get_obj_by_type(topo.t, type, i);
    if (hwloc_bitmap_intersects(o->cpuset, allowed)) usable.push_back(o);
  }
  const int U = static_cast<int>(usable.size());
  if (U == 0) {
    hwloc_bitmap_free(allowed);
    hwloc_bitmap_free(set);
    throw fail(how == "core" ? "hwloc finds no core this process may use"
                             : "hwloc finds no NUMA node this process may use");
  }
  // core: a block of cores per rank; numa: one node.
  const auto [lo, hi] = share(r, L, U, how == "numa");
  for (int i = lo; i < hi; ++i) hwloc_bitmap_or(set, set, usable[i]->cpuset);
  hwloc_bitmap_and(set, set, allowed);
  const int rc = hwloc_set_cpubind(topo.t, set, HWLOC_CPUBIND_PROCESS);
  const int err = errno;
  hwloc_bitmap_free(allowed);
  hwloc_bitmap_free(set);
  if (rc != 0) throw fail(std::string("binding failed: ") + std::strerror(err));
#else
  if (how == "numa") throw fail("this build has no hwloc (install libhwloc-dev and rebuild)");
  cpu_set_t now, want;
  CPU_ZERO(&now);
  CPU_ZERO(&want);
  sched_getaffinity(0, sizeof now, &now);
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &now)) cpus.push_back(c);
  const auto [lo, hi] = share(r, L, static_cast<int>(cpus.size()), false);
  for (int c = lo; c < hi; ++c) CPU_SET(cpus[c], &want);
  if (sched_setaffinity(0, sizeof want, &want) != 0)
    throw fail(std::string("binding failed: ") + std::strerror(errno));
#endif
  cached_cpus.store(0, std::memory_order_relaxed);
  return binding();
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
