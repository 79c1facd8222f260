// comm/mpi/check_area.h: where every rank of an MPI communicator shares one
// host, the few cache lines of shared memory in which the ranks compare
// their collectives (mpi_check.h), instead of an MPI all-reduce, and where
// each posts its progress, for the report of a stall.
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
  // A rank's progress: the last collective it issued and completed, and
  // its pid, which the others read when a collective passes its deadline
  // (a stopped rank's counters are still there to read).
  struct alignas(64) Progress {
    std::atomic<uint32_t> issued, completed;
    std::atomic<int64_t> pid;
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
  // Rank r's progress, after every rank's slots.
  Progress& progress(int r) {
    return reinterpret_cast<Progress*>(slots_ + 2 * static_cast<size_t>(n_))[r];
  }
  int size() const { return n_; }

 private:
  CheckArea(Slot* slots, size_t bytes, int n) : slots_(slots), bytes_(bytes), n_(n) {}
  Slot* slots_;
  size_t bytes_;
  int n_;
};

}  // namespace collie::mpi
