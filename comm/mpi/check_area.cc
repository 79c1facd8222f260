// comm/mpi/check_area.cc: see check_area.h.
#include "collie_build_config.h"

#if COLLIE_HAVE_MPI

#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>

#include "base/shared_file.h"
#include "base/topology.h"
#include "collie/error.h"
#include "comm/mpi/check_area.h"

namespace collie::mpi {

std::unique_ptr<CheckArea> CheckArea::make(MPI_Comm comm, int me, int n) {
  const size_t bytes =
      2 * static_cast<size_t>(n) * sizeof(Slot) + static_cast<size_t>(n) * sizeof(Progress);
  char where[128] = {0};
  shared_file::Made made;  // rank 0's; the others' fd stays -1
  if (me == 0) {
    try {
      made = shared_file::create("collie-mpi-check", bytes, "mpi", "the check area");
      std::snprintf(where, sizeof where, "%ld %d %s", static_cast<long>(getpid()), made.fd,
                    topology::boot_id().c_str());
    } catch (const Error&) {  // the check goes by messages
    }
  }
  MPI_Bcast(where, sizeof where, MPI_CHAR, 0, comm);
  if (me != 0 && where[0]) {
    long pid = 0;
    int theirs = -1;
    char boot[64] = {0};
    if (std::sscanf(where, "%ld %d %63s", &pid, &theirs, boot) >= 2 &&
        (!boot[0] || topology::boot_id() == boot)) {
      try {
        made.base = shared_file::open(pid, theirs, bytes, "mpi", "the check area");
      } catch (const Error&) {  // every rank falls back to messages, below
      }
    }
  }
  void* p = made.base;
  int ok = p != nullptr, all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, comm);
  if (made.fd >= 0) ::close(made.fd);  // every rank has it mapped, or gives up
  if (!all) {
    if (p) munmap(p, bytes);
    return nullptr;
  }
  std::unique_ptr<CheckArea> area(new CheckArea(static_cast<Slot*>(p), bytes, n));
  area->progress(me).pid.store(getpid(), std::memory_order_relaxed);
  return area;
}

CheckArea::~CheckArea() {
  munmap(slots_, bytes_);
}

}  // namespace collie::mpi

#endif  // COLLIE_HAVE_MPI
