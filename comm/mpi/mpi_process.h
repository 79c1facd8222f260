// comm/mpi/mpi_process.h: what this process knows about MPI, one per
// process: who initialised it and at which thread level, the datatypes and
// reduce ops collie adds (f16, bf16, NaN-aware min and max), the lock
// around MPI calls where MPI grants less than MPI_THREAD_MULTIPLE, and
// Open MPI's libnbc all-reduce setting, written per call through the MPI
// tool interface (allreduce_algorithm() picks the algorithm).
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstddef>
#include <iterator>
#include <mutex>
#include <string>

#include "collie/types.h"

namespace collie::mpi {

// MPI's text for an error code.
std::string mpi_error(int rc);
// "MPI_THREAD_SERIALIZED" and the like.
std::string level_name(int level);

// The libnbc all-reduce algorithms collie picks from (allreduce_algorithm()),
// and their names in Open MPI's enumeration of the setting.
enum class NbcAllreduce { recursive_doubling, ring, rabenseifner };
inline constexpr const char* kNbcAllreduceNames[] = {"recursive_doubling", "ring", "rabenseifner"};

// libnbc's all-reduce algorithm for `bytes` (`count` elements) over `n`
// ranks. Below 16 KiB, recursive doubling:
// log2(n) rounds, each a pairwise exchange (8 B over TCP: 9.7 us, against
// 13 us for Open MPI 4.1's binomial tree and 18 us for a ring). From 16 KiB,
// bandwidth counts: a ring under 4 ranks (2 ranks on shared memory: 1 MiB
// in 330 us, the binomial tree's 506 us, the blocking MPI_Allreduce's 580
// us), Rabenseifner's halving and doubling from 4 (Open MPI's own pick
// there, which it drops for in-place calls, the reducer's kind). Over a
// network (`network`: ranks on several hosts, or Open MPI told not to use
// shared memory), where a message costs more than its bytes, recursive
// doubling holds under 4 ranks up to 32 KiB: one exchange, not a ring's
// two (2 ranks over TCP, 32 KiB: 23 us against 31 us, raw MPI_Allreduce
// 27 to 30 us). From 64 KiB its one message passes Open MPI's TCP eager
// limit (64 KiB) and waits for a rendezvous round trip: 50 us against the
// ring's 37 us.
NbcAllreduce allreduce_algorithm(size_t bytes, size_t count, int n, bool network);

// What this process knows about MPI: the thread level, who initialised it,
// the user-defined types and ops. One per process, made on first use.
class Process {
 public:
  static Process& get() {
    static Process* p = new Process();  // never destroyed: used from atexit
    return *p;
  }

  // `choose`: pick libnbc's all-reduce algorithm per call (see
  // allreduce_algorithm()); the first communicator's setting holds.
  void start(bool choose);

  // Starts a non-blocking all-reduce with libnbc's algorithm `alg`, then
  // puts the setting back: the setting is one per
  // process, so the write and the start are one step under a lock, and each
  // call gets the algorithm chosen for it. Which algorithm depends only on
  // what every rank agrees on (bytes, count, ranks), so all ranks pick the
  // same. Without the setting (another MPI, or turned off): MPI's choice.
  template <class Start>
  int start_allreduce(NbcAllreduce alg, Start start) {
    const int value = algorithm_values_[static_cast<int>(alg)];
    if (value < 0) {
      auto lk = lock();
      return start();
    }
    std::lock_guard alk(algorithm_mu_);
    auto lk = lock();
    MPI_T_cvar_write(algorithm_, &value);
    int rc = start();
    MPI_T_cvar_write(algorithm_, &users_algorithm_);
    return rc;
  }

  // Whether start_allreduce(alg) gets `alg` (else MPI chooses).
  bool chooses(NbcAllreduce alg) const { return algorithm_values_[static_cast<int>(alg)] >= 0; }

  // Held around every MPI call when MPI grants less than MULTIPLE.
  std::unique_lock<std::mutex> lock() {
    return serialize_ ? std::unique_lock<std::mutex>(call_mu_) : std::unique_lock<std::mutex>();
  }

  // An operation was left unfinished in MPI: finalising would wait for it.
  void abandoned() { abandoned_ = true; }
  bool usable() const {
    int finalized = 0;
    MPI_Finalized(&finalized);
    return !finalized;
  }
  int level() const { return level_; }
  // Whether a failed request comes back as an error code (see start()):
  // only then may an op start before its check has ended.
  bool errors_return() const { return errors_return_; }

  DType dtype_of(MPI_Datatype t) const;

  MPI_Datatype type(DType t) const;

  // avg is a sum here; the caller divides.
  MPI_Op op(ReduceOp r, DType t) const;

 private:
  void finalize_at_exit();

  // Open MPI's coll_libnbc_iallreduce_algorithm through the MPI tool
  // interface, when it can be written and nobody set it (mpi_process.cc).
  void find_algorithm_setting();

  std::mutex mu_, call_mu_, algorithm_mu_;
  MPI_T_cvar_handle algorithm_{};
  int users_algorithm_ = 0;
  // The setting's value for each NbcAllreduce; -1: MPI chooses.
  int algorithm_values_[std::size(kNbcAllreduceNames)] = {-1, -1, -1};
  bool started_ = false;
  bool we_initialised_ = false;
  bool serialize_ = false;
  bool errors_return_ = false;
  std::atomic<bool> abandoned_{false};
  int level_ = MPI_THREAD_SINGLE;
  MPI_Datatype f16_ = MPI_DATATYPE_NULL, bf16_ = MPI_DATATYPE_NULL;
  MPI_Op ops_[4] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
};

}  // namespace collie::mpi
