// comm/mpi/mpi_check.h: the cross-rank check beside each collective of
// the mpi backend (MpiRunner::Check): does every rank issue the same one?
// MPI with different counts on different ranks hangs or fails, so each
// rank compares its collective's descriptor with the others', and a
// mismatch names the rank and what it called. Included by mpi_runner.cc
// only.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <memory>
#include <vector>

#include "base/fingerprint.h"
#include "comm/mpi/mpi_runner.h"

namespace collie::mpi {

// Every rank checks that the others issued the same collective, and the
// check runs beside the op, started just before it, so that the two
// overlap (over TCP, 8 B: the check after the op cost a second round
// trip). The op may have started wrong meanwhile: MPI never writes past a
// receive buffer (a longer message is a truncation error), and the op is
// abandoned when the check fails.
//
// On one host (area_): each rank posts its descriptor in shared memory
// and reads the others'. Else one all-reduce of (h, ~h) with max, where h
// fingerprints the descriptor: equal on every rank exactly when the
// maxima are h and ~h; only on a mismatch does it gather the
// descriptors, to name the rank and what it called.
class MpiRunner::Check {
 public:
  Check(MpiRunner& r, const OpDesc& d)
      : r_(r),
        d_(d),
        desc_{static_cast<uint64_t>(d.op),
              static_cast<uint64_t>(d.dtype),
              d.op == OpKind::allreduce || d.op == OpKind::reduce_scatter
                  ? static_cast<uint64_t>(d.redop)
                  : 0,
              d.seq,
              d.count,
              static_cast<uint64_t>(static_cast<uint32_t>(d.tag))} {
    if (r_.area_) {
      k_ = r_.checks_++;
      auto& mine = r_.area_->slot(r_.me_, k_);
      std::copy(std::begin(desc_), std::end(desc_), mine.desc);
      mine.number.store(k_ + 1, std::memory_order_release);
      next_ = r_.me_ == 0 ? 1 : 0;
      return;
    }
    h_ = fnv1a(kFnvBasis, desc_, sizeof desc_);  // only this path compares fingerprints
    io_.reset(new uint64_t[4]{h_, ~h_, 0, 0});
    int rc = r_.proc_.start_allreduce(NbcAllreduce::recursive_doubling, [&] {
      return MPI_Iallreduce(io_.get(), io_.get() + 2, 2, MPI_UINT64_T, MPI_MAX, r_.data_, &req_);
    });
    if (rc != MPI_SUCCESS) r_.failed(d_, rc);
  }
  // Left unfinished (a timeout, an abort): MPI may still write the
  // result, so the buffers go with the abandoned op.
  ~Check() {
    if (!done()) (void)io_.release();
  }
  Check(const Check&) = delete;
  Check& operator=(const Check&) = delete;

  bool done() const { return r_.area_ ? next_ >= r_.n_ : req_ == MPI_REQUEST_NULL; }

  // Whether it has ended and found a mismatch.
  bool test() {
    if (r_.area_) {
      // The ranks in order, this one skipped; each read once it has posted.
      while (next_ < r_.n_) {
        const auto& theirs = r_.area_->slot(next_, k_);
        if (theirs.number.load(std::memory_order_acquire) != k_ + 1) return false;
        if (!std::equal(std::begin(desc_), std::end(desc_), theirs.desc)) {
          wrong_ = next_;
          next_ = r_.n_;
          return true;
        }
        if (++next_ == r_.me_) ++next_;
      }
      return false;
    }
    int flag = 0;
    int rc;
    {
      auto lk = r_.proc_.lock();
      rc = MPI_Test(&req_, &flag, MPI_STATUS_IGNORE);
    }
    if (rc != MPI_SUCCESS) r_.failed(d_, rc);
    return flag && !(io_[2] == h_ && io_[3] == ~h_);
  }

  // Waits for it; throws the mismatch if there is one.
  void finish(Deadline dl) {
    bool wrong = false;
    r_.poll(d_, dl, [&] {
      wrong = test();
      return done();
    });
    if (wrong) mismatch(dl);
  }

  [[noreturn]] void mismatch(Deadline dl) {
    if (wrong_ >= 0) mismatched(wrong_, r_.area_->slot(wrong_, k_).desc);
    std::vector<uint64_t> all(6 * static_cast<size_t>(r_.n_));
    r_.run(d_, dl, nullptr, [&](MPI_Request* r) {
      auto lk = r_.proc_.lock();
      return MPI_Iallgather(desc_, 6, MPI_UINT64_T, all.data(), 6, MPI_UINT64_T, r_.data_, r);
    });
    for (int q = 0; q < r_.n_; ++q) {
      const uint64_t* o = &all[6 * static_cast<size_t>(q)];
      if (!std::equal(o, o + 6, desc_)) mismatched(q, o);
    }
    throw Error(ErrorCode::mismatch, r_.what(d_) + " does not match every other rank's collective");
  }

 private:
  // Rank q called the collective `o` describes.
  [[noreturn]] void mismatched(int q, const uint64_t* o) {
    OpDesc theirs;
    theirs.op = static_cast<OpKind>(o[0]);
    theirs.dtype = static_cast<DType>(o[1] < kNumDTypes ? o[1] : 0);
    theirs.redop = static_cast<ReduceOp>(o[2] < kNumReduceOps ? o[2] : 0);
    theirs.seq = static_cast<uint32_t>(o[3]);
    theirs.count = o[4];
    theirs.tag = static_cast<int32_t>(o[5]);
    throw collective_mismatch(r_.what(d_), r_.names_(q), theirs);
  }

  MpiRunner& r_;
  const OpDesc& d_;
  const uint64_t desc_[6];
  uint64_t h_ = 0;  // by MPI: the descriptor's fingerprint
  // By MPI: this rank's (h, ~h), then the maxima, and the all-reduce.
  std::unique_ptr<uint64_t[]> io_;
  MPI_Request req_ = MPI_REQUEST_NULL;
  // Through area_: the check's number, the next rank to read, and the
  // rank found different (-1: none).
  uint64_t k_ = 0;
  int next_ = 0;
  int wrong_ = -1;
};

}  // namespace collie::mpi
