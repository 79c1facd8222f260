// comm/shm/region.h: host memory that the other ranks of the host can map,
// so that a collective reads and writes it in place (no copy into the
// segment and out again).
//
// Each allocation is its own anonymous memfd, kept open by the process that
// made it; a peer maps it through /proc/<pid>/fd/<fd> on the first operation
// that names it, as the segment is shared. Nothing ever has a name in
// /dev/shm, and the pages go with the last mapping, crash or not. The
// memory outlives the communicator that handed it out: it is freed when
// the last holder of its pointer lets go.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>

namespace collie::shm {

// Zeroed, page-aligned memory of `bytes` bytes that peers can map.
// Throws collie::Error (unavailable) when the kernel refuses.
std::shared_ptr<void> allocate_region(size_t bytes);

// Where [p, p + len) lies in a region of this process, if it does.
struct RegionRef {
  uint64_t id = 0;  // unique in this process, never reused; 0: none
  int32_t fd = -1;
  uint64_t bytes = 0;   // the region's size
  uint64_t offset = 0;  // of p in it
};
std::optional<RegionRef> find_region(const void* p, size_t len);

}  // namespace collie::shm
