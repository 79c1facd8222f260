// comm/shm/region.cc: memfd-backed allocations and the table that finds them.
#include "comm/shm/region.h"

#include <sys/mman.h>
#include <unistd.h>

#include <map>
#include <mutex>

#include "base/shared_file.h"

namespace collie::shm {

namespace {

struct Table {
  std::mutex mu;
  std::map<uintptr_t, RegionRef> by_base;  // offset unused here
  uint64_t next_id = 1;
};

Table& table() {
  static auto* t = new Table;  // never destroyed: regions may be freed at exit
  return *t;
}

}  // namespace

std::shared_ptr<void> allocate_region(size_t bytes) {
  if (bytes == 0) bytes = 1;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t len = (bytes + page - 1) / page * page;
  const auto [fd, p] = shared_file::create("collie-buf", len, "shm", "shared memory");
  Table& t = table();
  {
    std::lock_guard lk(t.mu);
    t.by_base[reinterpret_cast<uintptr_t>(p)] = RegionRef{t.next_id++, fd, len, 0};
  }
  // The fd stays open while the memory lives: peers open it through /proc.
  // (fd = fd: clang before 16 cannot capture a structured binding.)
  return std::shared_ptr<void>(p, [fd = fd, len](void* q) {
    {
      Table& tb = table();
      std::lock_guard lk(tb.mu);
      tb.by_base.erase(reinterpret_cast<uintptr_t>(q));
    }
    munmap(q, len);
    ::close(fd);
  });
}

std::optional<RegionRef> find_region(const void* p, size_t len) {
  Table& t = table();
  std::lock_guard lk(t.mu);
  if (t.by_base.empty()) return std::nullopt;
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = t.by_base.upper_bound(a);
  if (it == t.by_base.begin()) return std::nullopt;
  --it;
  RegionRef r = it->second;
  if (a + len > it->first + r.bytes) return std::nullopt;
  r.offset = a - it->first;
  return r;
}

}  // namespace collie::shm
