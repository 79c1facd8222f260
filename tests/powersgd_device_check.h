// tests/powersgd_device_check.h: the PowerSGD hook on CUDA buckets against
// the CPU hook on the same data, step by step, and a checkpoint of the CUDA
// hook resumed by a fresh one against an uninterrupted run. Written against
// cuda::device_api(), so the same checks run on a fake device in CI
// (test_powersgd_cuda) and on a real GPU (test_gpu).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "base/cuda_api.h"
#include "collie/comm.h"
#include "hooks/comm_hook.h"

namespace collie::testing {

// Two buckets: [a 12 x 10 matrix, a bias of 5] and [a 3 x 4 matrix too small
// to compress at rank 2, a 9 x 8 matrix]; numel and rows of each tensor.
struct DeviceCheckTensor {
  size_t numel, rows;
};
inline const std::vector<std::vector<DeviceCheckTensor>>& device_check_buckets() {
  static const std::vector<std::vector<DeviceCheckTensor>> b = {{{120, 12}, {5, 0}},
                                                                {{12, 3}, {72, 9}}};
  return b;
}

// A bucket's memory, on the host or on the device, with its GradBucket.
class CheckBucket {
 public:
  CheckBucket(size_t index, DType t, Device d) : t_(t), d_(d) {
    const auto& tensors = device_check_buckets()[index];
    for (const auto& x : tensors) numel_ += x.numel;
    const size_t bytes = numel_ * dtype_size(t);
    if (d.is_cpu()) {
      host_.resize(bytes);
      data_ = host_.data();
    } else {
      api_ = cuda::device_api();
      data_ = api_->device_alloc(bytes);
    }
    b_.index = index;
    b_.is_last = index + 1 == device_check_buckets().size();
    b_.buffer = TensorView{data_, t, numel_, d};
    size_t at = 0;
    for (const auto& x : tensors) {
      b_.grads.push_back(b_.buffer.slice(at, x.numel));
      b_.rows.push_back(x.rows);
      at += x.numel;
    }
  }
  ~CheckBucket() {
    if (api_) api_->device_free(data_);
  }
  CheckBucket(const CheckBucket&) = delete;
  CheckBucket& operator=(const CheckBucket&) = delete;

  // Copies in (queued on the current stream on a device: the hook must
  // order itself after it); `bytes` must outlive the hook's Work.
  void set(const std::vector<uint8_t>& bytes) { cuda::copy(data_, bytes.data(), bytes.size(), d_); }
  // Read on the legacy default stream, not the hook's: the hook's Work
  // ends once the bucket holds the result, whichever stream reads it.
  std::vector<double> get() const {
    std::vector<uint8_t> bytes(numel_ * dtype_size(t_));
    void* const stream = cuda_stream();
    set_cuda_stream(nullptr);
    cuda::copy(bytes.data(), data_, bytes.size(), d_);
    cuda::wait_queued(d_);
    set_cuda_stream(stream);
    std::vector<double> v(numel_);
    for (size_t i = 0; i < numel_; ++i)
      v[i] = t_ == DType::f32 ? reinterpret_cast<const float*>(bytes.data())[i]
                              : reinterpret_cast<const double*>(bytes.data())[i];
    return v;
  }
  GradBucket& grad_bucket() { return b_; }
  Device device() const { return d_; }
  size_t numel() const { return numel_; }

 private:
  DType t_;
  Device d_;
  size_t numel_ = 0;
  std::vector<uint8_t> host_;
  std::shared_ptr<cuda::Api> api_;
  void* data_ = nullptr;
  GradBucket b_;
};

// This rank's gradients for bucket `index` at `step`, in dtype t.
inline std::vector<uint8_t> device_check_grads(DType t, size_t numel, int rank, int step,
                                               size_t index) {
  std::mt19937_64 g(1000003ull * static_cast<uint64_t>(rank) + 7919ull * step + index);
  std::normal_distribution<double> nd;
  std::vector<uint8_t> out(numel * dtype_size(t));
  for (size_t i = 0; i < numel; ++i) {
    // A common part that persists across steps, so that warm start and
    // error feedback have something to carry, plus this rank's noise.
    const double v = std::sin(0.37 * static_cast<double>(i) + index) + 0.3 * nd(g);
    if (t == DType::f32)
      reinterpret_cast<float*>(out.data())[i] = static_cast<float>(v);
    else
      reinterpret_cast<double*>(out.data())[i] = v;
  }
  return out;
}

// Runs `hook` on every bucket of `buckets` with this step's gradients, and
// waits: one hook at a time, so that every rank issues the same
// all-reduces in the same order.
inline void device_check_step(Communicator& comm, CommHook& hook,
                              std::vector<std::unique_ptr<CheckBucket>>& buckets, DType t,
                              int step) {
  std::vector<std::vector<uint8_t>> grads;
  // Even when the hook fails: nothing queued on the stream (the copies of
  // `grads` into the buckets) may outlive `grads` or run into buckets that
  // a failed test frees.
  struct Drain {
    Device d;
    ~Drain() {
      try {
        cuda::wait_queued(d);
      } catch (...) {
      }
    }
  } drain{buckets.front()->device()};
  for (size_t i = 0; i < buckets.size(); ++i) {
    grads.push_back(device_check_grads(t, buckets[i]->numel(), comm.rank(), step, i));
    buckets[i]->set(grads.back());
  }
  std::vector<Work> works;
  for (auto& b : buckets) works.push_back(hook.run(comm, b->grad_bucket()));
  wait_all(works);
}

inline std::vector<std::unique_ptr<CheckBucket>> device_check_make(DType t, Device d) {
  std::vector<std::unique_ptr<CheckBucket>> v;
  for (size_t i = 0; i < device_check_buckets().size(); ++i)
    v.push_back(std::make_unique<CheckBucket>(i, t, d));
  return v;
}

// The largest difference between two runs' buckets, relative to the
// largest value of `want`.
inline double device_check_distance(const std::vector<std::unique_ptr<CheckBucket>>& want,
                                    const std::vector<std::unique_ptr<CheckBucket>>& got) {
  double worst = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    auto w = want[i]->get(), g = got[i]->get();
    for (size_t k = 0; k < w.size(); ++k) {
      worst = std::max(worst, std::abs(w[k] - g[k]));
      scale = std::max(scale, std::abs(w[k]));
    }
  }
  return scale > 0 ? worst / scale : worst;
}

// `spec` on CUDA buckets (device `d`) and on host buckets, `steps` steps of
// the same gradients: each step's results within `tol` of each other,
// relative to the largest value. Returns the worst step's distance.
inline double cuda_powersgd_against_cpu(Communicator& comm, const std::string& spec, DType t,
                                        int steps, double tol, Device d = Device::cuda(0)) {
  auto cpu_hook = make_comm_hook(spec), cuda_hook = make_comm_hook(spec);
  auto host = device_check_make(t, Device::cpu()), dev = device_check_make(t, d);
  double worst = 0;
  for (int step = 0; step < steps; ++step) {
    device_check_step(comm, *cpu_hook, host, t, step);
    device_check_step(comm, *cuda_hook, dev, t, step);
    const double dist = device_check_distance(host, dev);
    EXPECT_LE(dist, tol) << spec << " " << to_string(t) << " step " << step;
    worst = std::max(worst, dist);
  }
  return worst;
}

// `spec` on CUDA buckets, saved after `save_at` steps and loaded by a fresh
// hook (on fresh buckets), against a hook that never stopped: the same
// results, bit for bit, at every later step.
inline void cuda_powersgd_resume_matches(Communicator& comm, const std::string& spec, DType t,
                                         int steps, int save_at, Device d = Device::cuda(0)) {
  auto whole = make_comm_hook(spec), first = make_comm_hook(spec);
  auto wb = device_check_make(t, d);
  auto fb = device_check_make(t, d);
  for (int step = 0; step < save_at; ++step) {
    device_check_step(comm, *whole, wb, t, step);
    device_check_step(comm, *first, fb, t, step);
  }
  const Bytes saved = first->save_state();
  first.reset();
  fb.clear();
  auto resumed = make_comm_hook(spec);
  resumed->load_state(saved);
  auto rb = device_check_make(t, d);
  for (int step = save_at; step < steps; ++step) {
    device_check_step(comm, *whole, wb, t, step);
    device_check_step(comm, *resumed, rb, t, step);
    EXPECT_EQ(device_check_distance(wb, rb), 0.0)
        << spec << " " << to_string(t) << " step " << step << " after resuming at " << save_at;
  }
}

}  // namespace collie::testing
