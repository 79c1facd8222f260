// base/spin.h: how long a host backend busy-polls before it sleeps.
//
// A sleep costs a wake-up when the data comes: tens of microseconds on a VM
// (the interrupt, the reschedule), several times a small op's round trip.
// With a fixed spin shorter than a wake-up plus the peer's own turn, the
// time per op is bimodal: once one rank sleeps, its late answer runs its
// peer's spin out too, and the pair stays in the slow mode for the run
// (measured: an 8 B TCP all-reduce took about 10 us in half the runs and
// about 70 us in the rest, with a 50 us spin).
//
// So the spin adapts, per waiter. A wait that slept and was answered within
// one more spin (a sleep of less than the budget plus a wake-up, taken as
// 100 us) would have been cheaper spinning: the budget doubles, up to `max`.
// A sleep much longer than that means the peer is really late (computing,
// or descheduled), where spinning only burns a core: the budget halves,
// down to `base`. A core is never spun on for longer than `max` per
// wait, and a rank that waits on a slow peer sleeps.
#pragma once

#include <algorithm>
#include <chrono>

namespace collie {

class SpinBudget {
 public:
  using Clock = std::chrono::steady_clock;

  // `adaptive` false: always `base_us` (the user set COLLIE_SPIN_US).
  SpinBudget(int base_us, bool adaptive, int max_us = 0)
      : base_(base_us),
        max_(adaptive ? std::max(base_us, max_us > 0 ? max_us : 8 * base_us) : base_us),
        now_(base_us) {}

  // What a COLLIE_SPIN_US setting gives: when set (>= 0), that spin, fixed;
  // unset (-1), 50 us adapting while every busy thread of the host has a
  // core (`cores_free`), else no spin at all.
  static SpinBudget from_setting(int spin_us, bool cores_free) {
    if (spin_us >= 0) return SpinBudget(spin_us, false);
    return SpinBudget(cores_free ? 50 : 0, true);
  }

  std::chrono::microseconds get() const { return std::chrono::microseconds(now_); }

  // A wait spun for get(), then slept for `slept` until it was answered.
  void slept(Clock::duration slept) {
    auto us = std::chrono::duration_cast<std::chrono::microseconds>(slept).count();
    if (us < now_ + kWakeUs)
      now_ = std::min(max_, 2 * now_);
    else if (us > 4 * static_cast<long long>(now_) + kWakeUs)
      now_ = std::max(base_, now_ / 2);
  }

 private:
  static constexpr int kWakeUs = 100;
  const int base_, max_;
  int now_;
};

}  // namespace collie
