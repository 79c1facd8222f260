// comm/core/clock.h: deadlines read from the coarse monotonic clock.
//
// Every operation sets a deadline seconds away, on the path of every small
// all-reduce. A precise read of the clock costs about 24 ns on this kind of
// VM, a coarse one about 5 ns, and two precise reads were a tenth of an 8 B
// shm all-reduce. The coarse clock runs on the same time base as
// steady_clock (CLOCK_MONOTONIC) but lags it by up to one tick (1 to 4 ms);
// one tick is added, so a coarse deadline is never earlier than the precise
// one and at most a tick later.
#pragma once

#include <time.h>

#include <chrono>

namespace collie {

inline std::chrono::steady_clock::time_point coarse_deadline(std::chrono::nanoseconds timeout) {
  static const std::chrono::nanoseconds tick = [] {
    timespec r{};
    if (clock_getres(CLOCK_MONOTONIC_COARSE, &r) != 0) return std::chrono::nanoseconds(-1);
    return std::chrono::seconds(r.tv_sec) + std::chrono::nanoseconds(r.tv_nsec);
  }();
  timespec now{};
  if (tick.count() < 0 || clock_gettime(CLOCK_MONOTONIC_COARSE, &now) != 0)
    return std::chrono::steady_clock::now() + timeout;
  std::chrono::steady_clock::duration since(std::chrono::seconds(now.tv_sec) +
                                            std::chrono::nanoseconds(now.tv_nsec) + tick);
  return std::chrono::steady_clock::time_point(since) + timeout;
}

}  // namespace collie
