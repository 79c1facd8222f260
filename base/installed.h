// base/installed.h: a process-wide interface that a test may replace
// (the CUDA runtime, the NCCL library: tests install fakes of them).
#pragma once

#include <memory>
#include <mutex>

namespace collie {

template <class Api>
class Installed {
 public:
  using Fallback = std::shared_ptr<Api> (*)();
  explicit Installed(Fallback fallback) : fallback_(fallback) {}
  // What was installed, else the fallback's.
  std::shared_ptr<Api> get() {
    std::lock_guard lk(mu_);
    return installed_ ? installed_ : fallback_();
  }
  void set(std::shared_ptr<Api> api) {
    std::lock_guard lk(mu_);
    installed_ = std::move(api);
  }

 private:
  const Fallback fallback_;
  std::mutex mu_;
  std::shared_ptr<Api> installed_;
};

}  // namespace collie
