// comm/mpi/mpi_runner.h: the mpi backend's HostRunner, one per collie
// communicator: its collectives and point-to-point ops started non-blocking
// on an MPI communicator of its own and tested to their ends under collie's
// deadline, with the cross-rank check beside each collective (Check, in
// mpi_check.h) and aborts told to the peers on a second communicator.
// Private to comm/mpi/ (mpi_backend.cc makes it).
#pragma once

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/host_executor.h"
#include "comm/mpi/check_area.h"
#include "comm/mpi/mpi_process.h"

namespace collie::mpi {

class MpiRunner final : public HostRunner {
 public:
  // Takes `data` (a communicator of its own) and dups a control one.
  MpiRunner(const BackendContext& ctx, MPI_Comm data);
  ~MpiRunner() override { close(); }

  MPI_Comm comm() const { return data_; }

  bool runs_alltoall() const override { return true; }
  void run_collective(const Op& op, Deadline dl) override;
  void run_p2p(P2pBatch& batch, Deadline dl) override;
  void abort_peers(const Error& e) noexcept override;
  void close() noexcept override;
  void wake() noexcept override { woken_ = true; }

 private:
  class Check;  // mpi_check.h

  std::string what(const OpDesc& d) const { return d.describe() + " on " + names_(me_); }
  int tag_ub();

  // MPI counts are int: fn(first element, count) for each piece of at most
  // 2^30 elements, in order.
  template <class Fn>
  static void in_pieces(size_t count, Fn fn) {
    const size_t piece = size_t{1} << 30;
    for (size_t at = 0; at < count; at += piece)
      fn(at, static_cast<int>(std::min(piece, count - at)));
  }

  int int_count(const OpDesc& d, size_t count) const;
  [[noreturn]] void p2p_failed(const Op& op, int rc);
  [[noreturn]] void failed(const OpDesc& d, int rc);
  // Starts one non-blocking MPI operation and tests it, and the op's check
  // when there is one (`check`, null for none), to their ends. `start`
  // takes the MPI lock itself.
  void run(const OpDesc& d, Deadline dl, Check* check,
           const std::function<int(MPI_Request*)>& start);
  // Calls `test` until it returns true. MPI moves data only inside its
  // calls, so the first spin_ of a wait tests without pausing; after that
  // it pauses between tests for a sixteenth of the time waited so far (at
  // most 1 ms): a slow peer costs a few percent of a core, not a core, and a
  // long transfer is slowed by a few percent at most. Every 64 tests it
  // looks for a peer's abort, this communicator's failure and the deadline.
  void poll(const OpDesc& d, Deadline dl, const std::function<bool()>& test);
  // Throws the abort a peer told this rank of, if one has come.
  void look_for_abort(const OpDesc& d);
  [[noreturn]] void timed_out(const OpDesc& d);
  // Where every rank is, from the progress each posts in the check area
  // (", where the ranks are ..."); "" without one (ranks on several hosts,
  // or the check by messages) and for point-to-point ops.
  std::string where_ranks_are(const OpDesc& d);

  Process& proc_;
  MPI_Comm data_ = MPI_COMM_NULL, ctrl_ = MPI_COMM_NULL;
  const int me_, n_;
  const RankNames names_;
  std::shared_ptr<FailureLatch> failure_;
  const std::chrono::milliseconds timeout_;
  int check_ = 1;                    // config::MpiSettings::check
  std::unique_ptr<CheckArea> area_;  // the check's shared memory, or null
  uint64_t checks_ = 0;              // checks started through area_
  bool network_ = true;              // see allreduce_algorithm()
  std::chrono::microseconds spin_{0};
  int tag_ub_ = -1;
  std::atomic<bool> woken_{false};
  std::vector<char> abort_in_;
  std::string abort_out_;
  MPI_Request abort_req_ = MPI_REQUEST_NULL;
  bool told_ = false, closed_ = false;
};

}  // namespace collie::mpi
