// comm/mpi/mpi_runner.cc: see mpi_runner.h.
#include "collie_build_config.h"

#if COLLIE_HAVE_MPI

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/config.h"
#include "base/log.h"
#include "base/reduce.h"
#include "base/topology.h"
#include "base/trace.h"
#include "comm/host_executor.h"
#include "comm/mpi/mpi_check.h"
#include "comm/mpi/mpi_process.h"
#include "comm/mpi/mpi_runner.h"
#include "comm/stall_inspector.h"

namespace collie::mpi {

namespace {

using Clock = std::chrono::steady_clock;

// Room for an abort message between ranks: "code\ntext".
constexpr int kAbortBytes = 1024;
constexpr int kAbortTag = 1;

// What the process `pid` (of this host) is doing, as a stall report says
// it: "stopped" (SIGSTOP, a debugger), "gone" (exited), else "alive".
std::string process_state(int64_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (pid <= 0 || !std::getline(stat, line)) return "gone";
  const auto close = line.rfind(')');  // the name may hold spaces and parentheses
  const char state = close != std::string::npos && close + 2 < line.size() ? line[close + 2] : '?';
  if (state == 'T' || state == 't') return "stopped";
  if (state == 'Z' || state == 'X') return "gone";
  return "alive";
}

}  // namespace

MpiRunner::MpiRunner(const BackendContext& ctx, MPI_Comm data)
    : proc_(Process::get()),
      data_(data),
      me_(ctx.launch.rank),
      n_(ctx.launch.world_size),
      names_(ctx.names),
      failure_(ctx.failure),
      timeout_(ctx.launch.timeout) {
  auto s = config::mpi_settings(ctx.env);
  check_ = s.check;
  // Open MPI's own verdict on oversubscription (without it, 2 ranks on 2
  // cores napped between tests, and an 8 KiB all-reduce took 90 us
  // instead of 10).
  int spin = s.spin_us;
  if (spin < 0)
    spin = config::ranks_fit_cores(ctx.busy_threads_on_host(), topology::usable_cpus(), ctx.env)
               ? 2000
               : 0;
  spin_ = std::chrono::microseconds(spin);
  auto lk = proc_.lock();
  MPI_Comm_set_errhandler(data_, MPI_ERRORS_RETURN);
  MPI_Comm_dup(data_, &ctrl_);
  MPI_Comm_set_errhandler(ctrl_, MPI_ERRORS_RETURN);
  // Whether every rank is on this host (the same answer on every rank).
  MPI_Comm node;
  int local = 0;
  if (MPI_Comm_split_type(data_, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
    MPI_Comm_size(node, &local);
    MPI_Comm_free(&node);
  }
  network_ = local != n_ || !s.shared_memory_btl;
  if (check_ == 1 && n_ > 1 && local == n_) area_ = CheckArea::make(data_, me_, n_);
  if (n_ > 1)
    log::info(names_(me_) + ": the mpi backend checks each collective " +
              (!check_ ? std::string("not at all (COLLIE_MPI_CHECK=0)")
               : area_ ? std::string("through shared memory")
                       : std::string("by MPI messages")));
  abort_in_.resize(kAbortBytes);
  MPI_Irecv(abort_in_.data(), kAbortBytes, MPI_CHAR, MPI_ANY_SOURCE, kAbortTag, ctrl_, &abort_req_);
}

void MpiRunner::run_collective(const Op& op, Deadline dl) {
  const OpDesc& d = op.desc;
  if (area_) area_->progress(me_).issued.store(d.seq, std::memory_order_relaxed);
  // The check's round trip overlaps the op's own (see Check).
  std::optional<Check> check;
  if (check_ && n_ > 1) {
    check.emplace(*this, d);
    // Where a wrong op's MPI error would abort the job, the check ends
    // first (a round trip more).
    if (!proc_.errors_return()) check->finish(dl);
  }
  Check* c = check ? &*check : nullptr;
  const DType t = d.dtype;
  const MPI_Datatype type = proc_.type(t);
  const size_t esz = dtype_size(t);
  switch (d.op) {
    case OpKind::allreduce: {
      auto* in = static_cast<const uint8_t*>(op.in.data);
      auto* out = static_cast<uint8_t*>(op.out.data);
      const bool in_place = op.in.data == op.out.data;
      const NbcAllreduce alg = allreduce_algorithm(d.count * esz, d.count, n_, network_);
      trace::algorithm(
          op, proc_.chooses(alg) ? kNbcAllreduceNames[static_cast<int>(alg)] : "MPI_Iallreduce");
      in_pieces(d.count, [&](size_t at, int c_) {
        run(d, dl, c, [&](MPI_Request* r) {
          return proc_.start_allreduce(alg, [&] {
            return MPI_Iallreduce(in_place ? MPI_IN_PLACE : in + at * esz, out + at * esz, c_, type,
                                  proc_.op(d.redop, t), data_, r);
          });
        });
      });
      if (d.redop == ReduceOp::avg) kernels::divide(t, op.out.data, op.out.data, d.count, n_);
      break;
    }
    case OpKind::broadcast: {
      trace::algorithm(op, "MPI_Ibcast");
      auto* buf = static_cast<uint8_t*>(op.in.data);
      in_pieces(d.count, [&](size_t at, int c_) {
        run(d, dl, c, [&](MPI_Request* r) {
          auto lk = proc_.lock();
          return MPI_Ibcast(buf + at * esz, c_, type, d.tag, data_, r);
        });
      });
      break;
    }
    case OpKind::allgather: {
      trace::algorithm(op, "MPI_Iallgather");
      const int n = int_count(d, op.in.numel);
      const bool in_place = op.in.data == static_cast<uint8_t*>(op.out.data) +
                                              static_cast<size_t>(me_) * op.in.nbytes();
      run(d, dl, c, [&](MPI_Request* r) {
        auto lk = proc_.lock();
        return MPI_Iallgather(in_place ? MPI_IN_PLACE : op.in.data, n, type, op.out.data, n, type,
                              data_, r);
      });
      break;
    }
    case OpKind::reduce_scatter: {
      trace::algorithm(op, "MPI_Ireduce_scatter_block");
      const int n = int_count(d, op.out.numel);
      // Collie's in place is the output at this rank's block of the input;
      // MPI's puts it at the start. Out of place either way.
      void* out = op.out.data;
      std::unique_ptr<uint8_t[]> tmp;
      const auto* mine =
          static_cast<const uint8_t*>(op.in.data) + static_cast<size_t>(me_) * op.out.nbytes();
      if (mine == op.out.data && me_ != 0) {
        tmp.reset(new uint8_t[op.out.nbytes()]);
        out = tmp.get();
      }
      try {
        run(d, dl, c, [&](MPI_Request* r) {
          auto lk = proc_.lock();
          return MPI_Ireduce_scatter_block(op.in.data == out ? MPI_IN_PLACE : op.in.data, out, n,
                                           type, proc_.op(d.redop, t), data_, r);
        });
      } catch (...) {
        (void)tmp.release();  // abandoned in MPI, which may still write it
        throw;
      }
      if (tmp) std::memcpy(op.out.data, tmp.get(), op.out.nbytes());
      if (d.redop == ReduceOp::avg) kernels::divide(t, op.out.data, op.out.data, d.count, n_);
      break;
    }
    case OpKind::alltoall: {
      trace::algorithm(op, "MPI_Ialltoall");
      const int n = int_count(d, op.in.numel / static_cast<size_t>(n_));
      run(d, dl, c, [&](MPI_Request* r) {
        auto lk = proc_.lock();
        return MPI_Ialltoall(op.in.data, n, type, op.out.data, n, type, data_, r);
      });
      break;
    }
    case OpKind::barrier:
      trace::algorithm(op, "MPI_Ibarrier");
      run(d, dl, c, [&](MPI_Request* r) {
        auto lk = proc_.lock();
        return MPI_Ibarrier(data_, r);
      });
      break;
    case OpKind::p2p:
    case OpKind::split:
      throw Error(ErrorCode::internal, what(d) + " is not a collective the mpi backend runs");
  }
  // An op of no elements starts nothing in MPI, and its check has not
  // been waited for: its buffers must outlive it, and a mismatch is one
  // still.
  if (c && !c->done()) c->finish(dl);
  if (area_) area_->progress(me_).completed.store(d.seq, std::memory_order_relaxed);
}

void MpiRunner::run_p2p(P2pBatch& batch, Deadline dl) {
  // Every op of the batch is posted at once, and those issued while it runs
  // join it, so that the exchange (both send, then both receive) cannot
  // wait on itself. Each completes as soon as MPI says it has.
  std::vector<MPI_Request> reqs;  // reqs[k] is batch.ops[k]'s
  size_t left = 0;
  auto post_new = [&] {
    while (reqs.size() < batch.ops.size()) {
      const Op& op = batch.ops[reqs.size()];
      const int tag = op.desc.tag;
      if (tag < 0 || tag > tag_ub())
        throw Error(ErrorCode::invalid_argument, what(op.desc) + ": tag " + std::to_string(tag) +
                                                     " is outside what this MPI allows (0.." +
                                                     std::to_string(tag_ub()) + ")");
      if (op.in.nbytes() > static_cast<size_t>(INT_MAX))
        throw Error(ErrorCode::invalid_argument,
                    what(op.desc) + ": " + std::to_string(op.in.nbytes()) +
                        " bytes is more than one MPI message holds (2^31 - 1) on the mpi backend");
      MPI_Request r;
      int rc;
      {
        auto lk = proc_.lock();
        rc = op.is_send ? MPI_Isend(op.in.data, static_cast<int>(op.in.nbytes()), MPI_BYTE, op.peer,
                                    tag, data_, &r)
                        : MPI_Irecv(op.in.data, static_cast<int>(op.in.nbytes()), MPI_BYTE, op.peer,
                                    tag, data_, &r);
      }
      if (rc != MPI_SUCCESS) failed(op.desc, rc);
      reqs.push_back(r);
      ++left;
    }
  };
  post_new();
  std::vector<int> done;
  std::vector<MPI_Status> st;
  poll(batch.ops.front().desc, dl, [&] {
    if (woken_.exchange(false) && batch.refill()) post_new();
    done.resize(reqs.size());
    st.resize(reqs.size());
    int outcount = 0;
    int rc;
    {
      auto lk = proc_.lock();
      rc = MPI_Testsome(static_cast<int>(reqs.size()), reqs.data(), &outcount, done.data(),
                        st.data());
    }
    if (outcount == MPI_UNDEFINED) outcount = 0;
    for (int k = 0; k < outcount; ++k) {
      const Op& op = batch.ops[static_cast<size_t>(done[k])];
      // MPI_ERR_IN_STATUS: this op's own error is in its status.
      if (rc != MPI_SUCCESS && st[k].MPI_ERROR != MPI_SUCCESS) p2p_failed(op, st[k].MPI_ERROR);
      if (!op.is_send) {
        int got = 0;
        MPI_Get_count(&st[k], MPI_BYTE, &got);
        if (static_cast<size_t>(got) != op.in.nbytes())
          throw Error(ErrorCode::mismatch,
                      what(op.desc) + ": " + names_(op.peer) + " sent " + std::to_string(got) +
                          " bytes and this receive expects " + std::to_string(op.in.nbytes()) +
                          ": the sender's count and dtype must match the receiver's");
      }
      batch.finished(static_cast<size_t>(done[k]));
      --left;
    }
    if (rc != MPI_SUCCESS) failed(batch.ops.front().desc, rc);
    if (left > 0) return false;
    if (!batch.refill()) return true;
    post_new();
    return false;
  });
}

void MpiRunner::abort_peers(const Error& e) noexcept {
  if (told_ || closed_ || !proc_.usable()) return;
  told_ = true;
  // Eager-sized messages, never waited for: a peer stuck in a collective
  // of its own sees them in its next test.
  abort_out_ = std::to_string(static_cast<int>(e.code())) + "\n" +
               std::string(e.what()).substr(0, kAbortBytes - 8);
  auto lk = proc_.lock();
  for (int q = 0; q < n_; ++q) {
    if (q == me_) continue;
    MPI_Request r;
    if (MPI_Isend(abort_out_.data(), static_cast<int>(abort_out_.size()), MPI_CHAR, q, kAbortTag,
                  ctrl_, &r) == MPI_SUCCESS)
      MPI_Request_free(&r);
  }
}

void MpiRunner::close() noexcept {
  if (closed_) return;
  closed_ = true;
  if (!proc_.usable()) return;
  auto lk = proc_.lock();
  if (abort_req_ != MPI_REQUEST_NULL) {
    MPI_Cancel(&abort_req_);
    MPI_Wait(&abort_req_, MPI_STATUS_IGNORE);
  }
  // An abandoned operation may still use data_: MPI frees it once that ends.
  MPI_Comm_free(&ctrl_);
  MPI_Comm_free(&data_);
}

int MpiRunner::tag_ub() {
  if (tag_ub_ < 0) {
    void* v = nullptr;
    int flag = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &v, &flag);
    tag_ub_ = flag ? *static_cast<int*>(v) : 32767;
  }
  return tag_ub_;
}

int MpiRunner::int_count(const OpDesc& d, size_t count) const {
  if (count > static_cast<size_t>(INT_MAX))
    throw Error(ErrorCode::invalid_argument,
                what(d) + ": " + std::to_string(count) +
                    " elements per rank is more than an MPI count holds (2^31 - 1); split it");
  return static_cast<int>(count);
}

void MpiRunner::p2p_failed(const Op& op, int rc) {
  int cls = 0;
  MPI_Error_class(rc, &cls);
  if (cls == MPI_ERR_TRUNCATE)
    throw Error(ErrorCode::mismatch,
                what(op.desc) + ": " + names_(op.peer) + " sent more than the " +
                    std::to_string(op.in.nbytes()) +
                    " bytes this receive holds: the sender's count and dtype must match the "
                    "receiver's");
  failed(op.desc, rc);
}

void MpiRunner::failed(const OpDesc& d, int rc) {
  throw Error(ErrorCode::internal, what(d) + " failed in MPI: " + mpi_error(rc));
}

void MpiRunner::run(const OpDesc& d, Deadline dl, Check* check,
                    const std::function<int(MPI_Request*)>& start) {
  MPI_Request req;
  int rc = start(&req);
  if (rc != MPI_SUCCESS) {
    if (check) check->finish(dl);  // a mismatch says more than MPI's error
    failed(d, rc);
  }
  int error = MPI_SUCCESS;
  bool done = false;
  poll(d, dl, [&] {
    if (check && !check->done() && check->test()) {
      // Wrong: the op may never end. MPI has it; this process will not
      // finalise, and the communicator is failed.
      proc_.abandoned();
      check->mismatch(dl);
    }
    if (!done) {
      int flag = 0;
      auto lk = proc_.lock();
      int r = MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
      if (r != MPI_SUCCESS) {
        error = r;
        done = true;
      } else {
        done = flag != 0;
      }
    }
    if (done && error != MPI_SUCCESS && (!check || check->done())) failed(d, error);
    return done && (!check || check->done());
  });
}

void MpiRunner::poll(const OpDesc& d, Deadline dl, const std::function<bool()>& test) {
  const auto start = Clock::now();
  for (unsigned polls = 1;; ++polls) {
    if (test()) return;
    if (polls % 64 != 0) continue;
    try {
      look_for_abort(d);
      if (failure_->failed()) throw *failure_->get();
      const auto now = Clock::now();
      if (now >= dl) timed_out(d);
      const auto waited = now - start;
      if (waited > spin_)
        std::this_thread::sleep_for(
            std::min<Clock::duration>(waited / 16, std::chrono::milliseconds(1)));
    } catch (...) {
      proc_.abandoned();
      throw;
    }
  }
}

void MpiRunner::look_for_abort(const OpDesc& d) {
  int flag = 0;
  MPI_Status st;
  {
    auto lk = proc_.lock();
    MPI_Test(&abort_req_, &flag, &st);
  }
  if (!flag) return;
  int got = 0;
  MPI_Get_count(&st, MPI_CHAR, &got);
  std::string msg(abort_in_.data(), static_cast<size_t>(std::max(got, 0)));
  auto nl = msg.find('\n');
  int code = nl == std::string::npos ? 0 : std::atoi(msg.substr(0, nl).c_str());
  if (code < 1 || code > kNumErrorCodes) code = static_cast<int>(ErrorCode::aborted);
  // This rank tells no one: the one that aborted told everybody.
  told_ = true;
  throw Error(static_cast<ErrorCode>(code),
              what(d) + ": " + names_(st.MPI_SOURCE) + " aborted the communicator: " +
                  (nl == std::string::npos ? msg : msg.substr(nl + 1)));
}

void MpiRunner::timed_out(const OpDesc& d) {
  throw Error(ErrorCode::timeout,
              what(d) + " timed out after " + std::to_string(timeout_.count() / 1000) +
                  " s in MPI (a rank is stalled, dead, or not calling the same operation; "
                  "COLLIE_TIMEOUT sets the deadline). MPI cannot cancel it: this process will "
                  "not finalise MPI, and mpirun ends the job when it exits" +
                  where_ranks_are(d));
}

std::string MpiRunner::where_ranks_are(const OpDesc& d) {
  if (!area_ || d.op == OpKind::p2p) return "";
  std::vector<RankPosition> at(static_cast<size_t>(n_));
  for (int q = 0; q < n_; ++q) {
    auto& p = area_->progress(q);
    at[static_cast<size_t>(q)] = {true, p.issued.load(std::memory_order_relaxed),
                                  p.completed.load(std::memory_order_relaxed),
                                  process_state(p.pid.load(std::memory_order_relaxed))};
  }
  return ". Where the ranks are (read from the shared check area): " +
         describe_positions(d.seq, at, "");
}

}  // namespace collie::mpi

#endif  // COLLIE_HAVE_MPI
