// comm/mpi/check_area.h: where every rank of an MPI communicator shares one
// host, the few cache lines of shared memory in which the ranks compare
// their collectives (mpi_backend.cc's Check), instead of an MPI all-reduce.
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace collie::mpi {

// Where every rank of a communicator shares one host, the ranks compare
// their collectives (MpiRunner::Check) in a few cache lines of shared
// memory instead of by an MPI all-reduce: each writes its descriptor and
// check number into its own slot, and reads the others'. Over Open MPI's
// TCP path the all-reduce was one more message exchange per collective,
// about 5 us on loopback (bench/RESULTS.md). An anonymous memfd that rank
// 0 makes and the others open through /proc (as the shm backend's
// segment), so nothing is left behind however the job ends.
class CheckArea {
 public:
  struct alignas(64) Slot {
    std::atomic<uint64_t> number;  // k + 1 once check k's descriptor is in
    uint64_t desc[6];              // written before number, read after it
  };

  // Collective over `comm` (of `n` ranks, this one `me`, all on one host):
  // the area, or null on every rank when any of them cannot map rank 0's
  // memory (another PID namespace, say).
  static std::unique_ptr<CheckArea> make(MPI_Comm comm, int me, int n);
  ~CheckArea();
  CheckArea(const CheckArea&) = delete;
  CheckArea& operator=(const CheckArea&) = delete;

  // Rank r's slot for check k: two per rank, since no rank gets two checks
  // ahead of another (check k + 1 ends only once every rank has posted
  // it, after its own check k ended), so a slot is rewritten only after
  // every rank has read it.
  Slot& slot(int r, uint64_t k) { return slots_[2 * static_cast<size_t>(r) + (k & 1)]; }

 private:
  CheckArea(Slot* slots, size_t bytes) : slots_(slots), bytes_(bytes) {}
  Slot* slots_;
  size_t bytes_;
};

}  // namespace collie::mpi
