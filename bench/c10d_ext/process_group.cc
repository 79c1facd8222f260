// bench/c10d_ext/process_group.cc: a measurement, not the backend users
// get. The collie torch.distributed backend written the other way issue 34
// names: a C++ c10d::Backend compiled against the installed PyTorch (as
// PyTorch's Gloo, MPI and UCC process groups are), over collie's C ABI,
// with all_reduce, broadcast, barrier and a blocking all_gather only:
// enough to time a small op and PyTorch's DDP step against the Python
// ProcessGroup (python/collie/distributed.py), with --cpp in
// bench/torch_backend_latency.py and bench/torch_ddp_bench.py. Built by
// bench/c10d_ext/register.py with torch.utils.cpp_extension; the
// communicator comes from Python (collie's rendezvous through PyTorch's
// store), passed as its handle.
//
// An op's Work waits in C++ (collie_work_wait, no GIL); its future is
// completed by collie_work_on_complete on collie's continuation thread,
// where PyTorch's C++ DDP hook (divide by the world size) runs inline. A
// Python comm hook that waits for another op there would deadlock: the
// Python backend hands completions to a pool for that reason.
#include <torch/extension.h>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

#include "collie/collie.h"

namespace {

int32_t dtype_of(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return COLLIE_F32;
    case at::kDouble:
      return COLLIE_F64;
    case at::kHalf:
      return COLLIE_F16;
    case at::kBFloat16:
      return COLLIE_BF16;
    case at::kInt:
      return COLLIE_I32;
    case at::kLong:
      return COLLIE_I64;
    case at::kByte:
      return COLLIE_U8;
    case at::kChar:
      return COLLIE_I8;
    default:
      TORCH_CHECK(false, "collie_cpp: no collie dtype for ", t.scalar_type());
  }
}

collie_tensor view(const at::Tensor& t) {
  TORCH_CHECK(t.device().is_cpu() && t.is_contiguous(), "collie_cpp: CPU, contiguous tensors only");
  return collie_tensor{t.data_ptr(), static_cast<uint64_t>(t.numel()), dtype_of(t), COLLIE_CPU, 0};
}

collie_op op_of(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return COLLIE_SUM;
    case c10d::ReduceOp::AVG:
      return COLLIE_AVG;
    case c10d::ReduceOp::MIN:
      return COLLIE_MIN;
    case c10d::ReduceOp::MAX:
      return COLLIE_MAX;
    case c10d::ReduceOp::PRODUCT:
      return COLLIE_PROD;
    default:
      TORCH_CHECK(false, "collie_cpp: reduce op not supported");
  }
}

void check(collie_status s) {
  if (s != COLLIE_OK && s != COLLIE_IN_PROGRESS) TORCH_CHECK(false, collie_last_error());
}

class CollieWork : public c10d::Work {
 public:
  CollieWork(collie_work* w, std::vector<at::Tensor> tensors, int rank, c10d::OpType type)
      : c10d::Work(rank, type),
        w_(w),
        tensors_(std::move(tensors)),
        future_(c10::make_intrusive<c10::ivalue::Future>(
            c10::ListType::create(c10::TensorType::get()))) {}

  // The Work for collie's op `w`: its future completes when the op ends.
  // The future and the tensors live until then: the callback holds a
  // reference to the Work (taken here, not in the constructor, which
  // intrusive_ptr forbids).
  static c10::intrusive_ptr<c10d::Work> make(collie_work* w, std::vector<at::Tensor> tensors,
                                             int rank, c10d::OpType type) {
    auto work = c10::make_intrusive<CollieWork>(w, std::move(tensors), rank, type);
    c10::raw::intrusive_ptr::incref(work.get());
    check(collie_work_on_complete(
        w,
        [](void* user, collie_status status, const char* message) {
          auto* self = static_cast<CollieWork*>(user);
          if (status == COLLIE_OK)
            self->future_->markCompleted(c10::IValue(self->tensors_));
          else
            self->future_->setError(std::make_exception_ptr(
                std::runtime_error(message ? message : "collie_cpp: the op failed")));
          c10::raw::intrusive_ptr::decref(self);
        },
        work.get()));
    return work;
  }
  ~CollieWork() override { collie_work_free(w_); }

  bool isCompleted() override { return collie_work_query(w_) != COLLIE_IN_PROGRESS; }
  bool isSuccess() const override { return collie_work_query(w_) == COLLIE_OK; }
  bool wait(std::chrono::milliseconds timeout) override {
    collie_status s = timeout == kNoTimeout ? collie_work_wait(w_)
                                            : collie_work_wait_for(w_, timeout.count() / 1000.0);
    check(s);
    return true;
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  collie_work* w_;
  std::vector<at::Tensor> tensors_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// An op done before its call returned (allgather here: DDP's start-up
// check of the parameters' shapes, not on the timed path).
class DoneWork : public c10d::Work {
 public:
  explicit DoneWork(std::vector<at::Tensor> result)
      : future_(c10::make_intrusive<c10::ivalue::Future>(
            c10::ListType::create(c10::TensorType::get()))) {
    future_->markCompleted(c10::IValue(std::move(result)));
  }
  bool isCompleted() override { return true; }
  bool isSuccess() const override { return true; }
  bool wait(std::chrono::milliseconds) override { return true; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

class CollieBackend : public c10d::Backend {
 public:
  CollieBackend(int64_t comm, int rank, int size)
      : c10d::Backend(rank, size), comm_(reinterpret_cast<collie_comm*>(comm)) {}

  const std::string getBackendName() const override { return "collie_cpp"; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    TORCH_CHECK(tensors.size() == 1, "collie_cpp: one tensor per call");
    collie_work* w = nullptr;
    collie_tensor t = view(tensors[0]);
    check(collie_comm_allreduce(comm_, t, t, op_of(opts.reduceOp), &w));
    return CollieWork::make(w, tensors, rank_, c10d::OpType::ALLREDUCE);
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    TORCH_CHECK(tensors.size() == 1, "collie_cpp: one tensor per call");
    collie_work* w = nullptr;
    check(collie_comm_broadcast(comm_, view(tensors[0]), static_cast<int>(opts.rootRank), &w));
    return CollieWork::make(w, tensors, rank_, c10d::OpType::BROADCAST);
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions&) override {
    TORCH_CHECK(inputs.size() == 1 && outputs.size() == 1, "collie_cpp: one tensor per call");
    at::Tensor in = inputs[0].contiguous();
    at::Tensor flat = at::empty({in.numel() * size_}, in.options());
    collie_work* w = nullptr;
    check(collie_comm_allgather(comm_, view(in), view(flat), &w));
    collie_status st = collie_work_wait(w);
    collie_work_free(w);
    check(st);
    for (int r = 0; r < size_; ++r)
      outputs[0][r].copy_(flat.narrow(0, r * in.numel(), in.numel()).view_as(outputs[0][r]));
    return c10::make_intrusive<DoneWork>(outputs[0]);
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override {
    collie_work* w = nullptr;
    check(collie_comm_barrier(comm_, &w));
    return CollieWork::make(w, {}, rank_, c10d::OpType::BARRIER);
  }

 private:
  collie_comm* comm_;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def(
      "make",
      [](int64_t comm, int rank, int size) -> c10::intrusive_ptr<c10d::Backend> {
        return c10::make_intrusive<CollieBackend>(comm, rank, size);
      },
      "A c10d backend over the collie communicator whose handle is `comm`.");
}
