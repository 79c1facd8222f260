// comm/shm/segment_wait.cc: waiting in the segment, and waking: counters
// published and watched, a short spin and then a futex sleep (never while a
// woken peer needs this core), the gate of crowded hosts, a dead or
// aborted peer noticed within kSlice, deadlines turned into errors that
// name the late ranks; and the abort and goodbye that wake every waiter.
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "base/log.h"
#include "comm/shm/segment.h"

namespace collie::shm {

namespace {

using Clock = std::chrono::steady_clock;
// How often a sleeping waiter looks at the peer's process and its deadline.
constexpr auto kSlice = std::chrono::milliseconds(5);

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

long futex(std::atomic<uint32_t>* addr, int op, uint32_t val, const timespec* ts) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), op, val, ts, nullptr, 0);
}

bool reached(uint32_t v, uint32_t target) {
  return static_cast<int32_t>(v - target) >= 0;
}

}  // namespace

void Segment::publish(Counter& c, uint32_t v) {
  c.value.store(v, std::memory_order_seq_cst);
  if (c.sleepers.load(std::memory_order_seq_cst) != 0) wake(c);
}

int Segment::awake() const {
  return n_ - asleep_->load(std::memory_order_relaxed);
}

bool Segment::claim(int r, uint64_t tag, std::atomic<int32_t>* local) {
  auto& on = info(r).asleep_on;
  uint64_t t = tag;
  if (on.load(std::memory_order_relaxed) != tag ||
      !on.compare_exchange_strong(t, 0, std::memory_order_seq_cst))
    return false;
  asleep_->fetch_sub(1, std::memory_order_seq_cst);
  if (local) local->fetch_sub(1, std::memory_order_seq_cst);
  return true;
}

void Segment::wake(Counter& c, std::atomic<int32_t>* local, bool bump) noexcept {
  const uint64_t tag = word_tag(c);
  for (int r = 0; r < n_; ++r) claim(r, tag, local);
  // After the claims: a sleeper that read the word before this move fails
  // its futex wait; one that read it after sees its claim gone (sleep_until).
  if (bump) c.value.fetch_add(1, std::memory_order_seq_cst);
  futex(&c.value, FUTEX_WAKE, INT_MAX, nullptr);
}

void Segment::mark_asleep(Counter& c, std::atomic<int32_t>* local) {
  info(me_).asleep_on.store(word_tag(c), std::memory_order_seq_cst);
  asleep_->fetch_add(1, std::memory_order_seq_cst);
  if (local) local->fetch_add(1, std::memory_order_seq_cst);
}

void Segment::mark_awake(Counter& c, std::atomic<int32_t>* local) {
  // Woken by a waker, it counted this rank awake already; timed out or
  // never asleep (the word had moved), this rank does it.
  claim(me_, word_tag(c), local);
}

int Segment::here() {
  const int c = sched_getcpu();
  const int s = c < 0 ? 0 : c % kCpuLines;
  if (s != slot_) {
    if (slot_ >= 0) cpu_line(slot_).registered.fetch_sub(1, std::memory_order_seq_cst);
    cpu_line(s).registered.fetch_add(1, std::memory_order_seq_cst);
    info(me_).slot.store(s, std::memory_order_seq_cst);
    slot_ = s;
  }
  return s;
}

void Segment::wake_gate_sleepers(uint32_t low) noexcept {
  // The CPU lines with a sleeper whose wait this phase ended: this rank's
  // own, and those where no rank is awake in a collective's wait for it (one
  // that is, or was, wakes its CPU's sleepers itself as its wait ends,
  // without a wake-up from another CPU: about 16 us of the waker's time on
  // a VM, against 1.5 for one on its own CPU).
  const uint64_t first = word_tag(cpu_line(0).line);
  uint64_t lines = 0;
  for (int r = 0; r < n_; ++r) {
    const uint64_t tag = info(r).asleep_on.load(std::memory_order_seq_cst);
    if (tag < first || tag >= first + kCpuLines * sizeof(CpuLine)) continue;
    if (reached(progress(r).value.load(std::memory_order_acquire), low + 1)) continue;
    lines |= uint64_t{1} << ((tag - first) / sizeof(CpuLine));
  }
  auto looked_after = [&](int x) {
    if (cpu_line(x).watchers.load(std::memory_order_seq_cst) > 0) return true;
    for (int r : others_)
      if (info(r).slot.load(std::memory_order_seq_cst) == x &&
          info(r).asleep_on.load(std::memory_order_seq_cst) == 0 &&
          info(r).gate_target.load(std::memory_order_seq_cst) == low)
        return true;  // its wait for this phase has ended, or is about to
    return false;
  };
  for (int x = 0; lines != 0; ++x, lines >>= 1)
    if ((lines & 1) && (x == slot_ || !looked_after(x))) wake_cpu(x);
}

bool Segment::wake_done_here(int slot, uint32_t upto) noexcept {
  CpuLine& L = cpu_line(slot);
  if (L.asleep.load(std::memory_order_seq_cst) == 0) return false;
  const uint64_t tag = word_tag(L.line);
  for (int r : others_)
    if (info(r).asleep_on.load(std::memory_order_seq_cst) == tag &&
        !reached(progress(r).value.load(std::memory_order_acquire), upto + 1)) {
      wake_cpu(slot);
      return true;
    }
  return false;
}

void Segment::advance() {
  publish(progress(me_), ++phase_);
  // Waiters for everyone sleep on the gate. Only the move that completes a
  // phase for all (the slowest counter moves on) wakes them: one wake-up
  // per waiter per phase, not one per peer's arrival.
  Counter& g = gate();
  if (g.sleepers.load(std::memory_order_seq_cst) == 0) return;
  uint32_t low = phase_;
  for (int r = 0; r < n_; ++r) {
    uint32_t v = progress(r).value.load(std::memory_order_seq_cst);
    if (!reached(v, low)) low = v;
  }
  uint32_t seen = g.value.load(std::memory_order_seq_cst);
  while (low != seen && reached(low, seen))
    if (g.value.compare_exchange_weak(seen, low, std::memory_order_seq_cst)) {
      if (crowded_)
        wake_gate_sleepers(low);
      else
        wake(g);
      return;
    }
}

void Segment::ring(int r) {
  Counter& b = bell(r);
  b.value.fetch_add(1, std::memory_order_seq_cst);
  if (b.sleepers.load(std::memory_order_seq_cst) != 0) wake(b);
}

bool Segment::dead(int r) {
  if (r < 0 || r == me_) return false;
  if (pidfds_[r] >= 0) {
    pollfd p{pidfds_[r], POLLIN, 0};
    return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR));
  }
  return ::kill(pids_[r], 0) != 0 && errno == ESRCH;
}

void Segment::check() {
  uint32_t a = abort_word_->load(std::memory_order_acquire);
  if (a != 0 && static_cast<int>(a) - 1 != me_) {
    int r = static_cast<int>(a) - 1;
    RankInfo& i = info(r);
    int code = i.err_code.load(std::memory_order_acquire);
    std::string msg(i.err_msg, strnlen(i.err_msg, sizeof i.err_msg));
    throw Error(code > 0 ? static_cast<ErrorCode>(code) : ErrorCode::aborted,
                names_(r) + " aborted the communicator: " + msg);
  }
  if (failure_->failed()) throw *failure_->get();
}

std::string Segment::gone(int peer, const What& what) {
  if (peer < 0 || peer == me_) return "";
  if (info(peer).closed.load(std::memory_order_acquire))
    return names_(me_) + ": " + names_(peer) +
           " shut its communicator down while this rank waits for it in " + what.str();
  if (dead(peer))
    return names_(me_) + ": " + names_(peer) + " (pid " + std::to_string(pids_[peer]) +
           ") died while this rank waits for it in " + what.str();
  return "";
}

void Segment::timed_out(const std::vector<int>& late, const What& what) {
  throw Error(ErrorCode::timeout,
              what.str() + " timed out on " + names_(me_) + " after " + log::seconds(timeout_) +
                  " waiting for rank" + (late.size() > 1 ? "s " : " ") + names_.list(late) +
                  " (alive, but stalled or not calling the same operation; COLLIE_TIMEOUT sets "
                  "the deadline)");
}

template <class Pred, class May>
bool Segment::spin_for(Pred pred, May may_spin) {
  const auto spin = spin_.get();
  if (spin.count() <= 0 || !may_spin()) return false;
  // The clock is read after the first 64 polls: most small waits end
  // sooner, and a clock read cost an 8 B all-reduce a tenth of its time.
  Clock::time_point spin_end{};
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (pred()) return true;
      cpu_relax();
    }
    if (abort_word_->load(std::memory_order_relaxed) != 0 || failure_->failed()) check();
    if (!may_spin()) return false;
    auto now = Clock::now();
    if (spin_end == Clock::time_point{})
      spin_end = now + spin;
    else if (now >= spin_end)
      return false;
  }
}

template <class Pred>
void Segment::wait_on(Counter& c, std::span<const int> peers, Pred pred, const What& what,
                      Deadline deadline) {
  if (pred()) return;
  // Not while a woken peer needs this core.
  if (spin_for(pred, [&] { return core_free(); })) return;
  sleep_until(c, nullptr, peers, pred, what, deadline);
}

template <class Pred>
void Segment::sleep_until(Counter& c, std::atomic<int32_t>* local, std::span<const int> peers,
                          Pred pred, const What& what, Deadline deadline) {
  const auto asleep = Clock::now();
  auto answered = [&] { spin_.slept(Clock::now() - asleep); };
  for (bool first = true;; first = false) {
    check();
    // Whether the peers are alive is looked at after each slice asleep, not
    // before the first (a poll per peer was a tenth of a waiter's CPU time
    // with 4 ranks on 2 cores); a peer that died first is noticed one slice
    // later. A peer that made its last move and then left is not lost: look
    // again.
    for (int p : first ? std::span<const int>{} : peers) {
      if (std::string why = gone(p, what); !why.empty()) {
        if (pred()) return answered();
        failure_->lost(names_[p]);
        throw Error(ErrorCode::peer_lost, why);
      }
    }
    auto now = Clock::now();
    if (now >= deadline) return;  // the caller names the late ranks
    auto nap = std::min<Clock::duration>(kSlice, deadline - now);
    timespec ts{static_cast<time_t>(nap.count() / 1000000000),
                static_cast<long>(nap.count() % 1000000000)};
    // Counted asleep before the last look at `pred`: a waker that makes
    // it true after that look sees this rank asleep (wake_gate_sleepers
    // and a spinner's leave decide by these counts, not by c.sleepers).
    c.sleepers.fetch_add(1, std::memory_order_seq_cst);
    mark_asleep(c, local);
    uint32_t v = c.value.load(std::memory_order_seq_cst);
    if (!pred() && info(me_).asleep_on.load(std::memory_order_seq_cst) == word_tag(c))
      futex(&c.value, FUTEX_WAIT, v, &ts);
    mark_awake(c, local);
    c.sleepers.fetch_sub(1, std::memory_order_seq_cst);
    if (pred()) return answered();
  }
}

template <class Pred>
void Segment::wait_gate(uint32_t target, Pred pred, const What& what, Deadline deadline) {
  if (crowded_)
    wait_crowded(target, pred, what, deadline);
  else
    wait_on(gate(), others_, pred, what, deadline);
}

template <class Pred>
void Segment::wait_crowded(uint32_t target, Pred pred, const What& what, Deadline deadline) {
  const int s = here();
  CpuLine& L = cpu_line(s);
  info(me_).gate_target.store(target, std::memory_order_seq_cst);
  // Awake in this wait ("watching"): whoever completes the phase leaves
  // this CPU's sleepers to this rank, which wakes those whose wait the
  // phase ended (ranks at `target` or behind) once its own wait ends.
  L.watchers.fetch_add(1, std::memory_order_seq_cst);
  bool watching = true;
  auto unwatch = [&] {
    if (watching) L.watchers.fetch_sub(1, std::memory_order_seq_cst);
    watching = false;
  };
  try {
    if (pred()) {
      unwatch();
      wake_done_here(s, target);
      return;
    }
    // A rank asleep on this CPU that has not arrived yet (its own wait has
    // ended) must run: hand this CPU to it, a wake-up on this CPU, and then
    // this rank sleeps.
    const bool hand_off = wake_done_here(s, target - 1);
    // Spin while this rank is the only one awake on its CPU (so the CPU
    // does not halt), for at most the spin budget.
    auto alone = [&] {
      return L.registered.load(std::memory_order_relaxed) -
                 L.asleep.load(std::memory_order_relaxed) <=
             1;
    };
    if (!hand_off && spin_for(pred, alone)) {
      unwatch();
      wake_done_here(s, target);
      return;
    }
    // Or hand the CPU over between looks, for a while, before sleeping.
    if (yield_.count() > 0 && yield_for(pred, deadline)) {
      unwatch();
      wake_done_here(s, target);
      return;
    }
    unwatch();
  } catch (...) {
    unwatch();
    throw;
  }
  // advance() looks at the gate's sleepers to know whether anyone sleeps.
  Counter& g = gate();
  g.sleepers.fetch_add(1, std::memory_order_seq_cst);
  try {
    sleep_until(L.line, &L.asleep, others_, pred, what, deadline);
  } catch (...) {
    g.sleepers.fetch_sub(1, std::memory_order_seq_cst);
    throw;
  }
  g.sleepers.fetch_sub(1, std::memory_order_seq_cst);
  if (pred()) wake_done_here(s, target);
}

template <class Pred>
bool Segment::yield_for(Pred pred, Deadline deadline) {
  const auto end = std::min<Clock::time_point>(Clock::now() + yield_, deadline);
  for (;;) {
    for (int i = 0; i < 16; ++i) {
      if (pred()) return true;
      cpu_relax();
    }
    if (abort_word_->load(std::memory_order_relaxed) != 0 || failure_->failed()) check();
    sched_yield();
    if (pred()) return true;
    if (Clock::now() >= end) return false;
  }
}

void Segment::wait_rank(int r, uint32_t target, const What& what, Deadline deadline) {
  Counter& c = progress(r);
  auto ok = [&] { return reached(c.value.load(std::memory_order_acquire), target); };
  wait_on(c, {&r, 1}, ok, what, deadline);
  if (!ok()) timed_out({r}, what);
}

void Segment::wait_all_at(uint32_t target, const What& what, Deadline deadline) {
  auto all = [&] {
    for (int r = 0; r < n_; ++r)
      if (r != me_ && !reached(progress(r).value.load(std::memory_order_acquire), target))
        return false;
    return true;
  };
  wait_gate(target, all, what, deadline);  // looks at `all` first
  if (!all()) {
    std::vector<int> late;
    for (int q = 0; q < n_; ++q)
      if (q != me_ && !reached(progress(q).value.load(), target)) late.push_back(q);
    timed_out(late, what);
  }
}

void Segment::wait_all_ready(uint32_t seq, const What& what, Deadline deadline) {
  auto all = [&] {
    for (int r = 0; r < n_; ++r)
      if (r != me_ && desc(r, seq).ready.load(std::memory_order_acquire) != seq) return false;
    return true;
  };
  // Each rank moves its counter after its line is ready, so the gate moves
  // (and wakes sleepers) once every line is.
  wait_gate(phase_, all, what, deadline);  // looks at `all` first
  if (!all()) wait_all(what, deadline);    // names the late ranks
}

void Segment::wait_bell(uint32_t seen, const std::vector<int>& peers, const What& what,
                        Deadline deadline) {
  Counter& b = bell(me_);
  auto moved = [&] { return b.value.load(std::memory_order_acquire) != seen; };
  wait_on(b, peers, moved, what, deadline);
  if (!moved()) timed_out(peers, what);
}

void Segment::abort(const Error& e) noexcept {
  if (!base_) return;
  // The message and code go first, then the word (seq_cst): a rank that sees
  // the word sees the message. A rank that loses the race has written its
  // own slot, which no one reads.
  if (abort_word_->load(std::memory_order_seq_cst) == 0) {
    RankInfo& i = info(me_);
    std::string msg = e.what();
    std::memset(i.err_msg, 0, sizeof i.err_msg);
    std::memcpy(i.err_msg, msg.data(), std::min(msg.size(), sizeof i.err_msg - 1));
    i.err_code.store(static_cast<int32_t>(e.code()), std::memory_order_seq_cst);
    uint32_t expected = 0;
    abort_word_->compare_exchange_strong(expected, static_cast<uint32_t>(me_ + 1));
  }
  wake_all();
  drain_writers();
}

void Segment::begin_writes() {
  // seq_cst both ways, as abort()'s word and drain_writers' loads: either
  // this load sees the abort, or the aborting rank sees this rank writing.
  // (Operations, not fences: ThreadSanitizer refuses fences.)
  info(me_).writing.store(1, std::memory_order_seq_cst);
  (void)abort_word_->load(std::memory_order_seq_cst);
  try {
    check();
  } catch (...) {
    end_writes();
    throw;
  }
}

void Segment::end_writes() noexcept {
  info(me_).writing.store(0, std::memory_order_release);
}

void Segment::drain_writers() noexcept {
  // This rank's op is failing: a peer still pushing its slices may be
  // writing into this rank's buffers. It stops at its next piece, having
  // seen the abort (or finishes); wait for that before the op returns.
  (void)abort_word_->load(std::memory_order_seq_cst);  // after the word, in seq_cst's order
  const auto until = std::chrono::steady_clock::now() + kWriterGrace;
  for (;;) {
    std::vector<int> writing;
    for (int q = 0; q < n_; ++q)
      if (q != me_ && info(q).writing.load(std::memory_order_seq_cst) &&
          !info(q).closed.load(std::memory_order_acquire) && !dead(q))
        writing.push_back(q);
    if (writing.empty()) return;
    if (std::chrono::steady_clock::now() >= until) {
      log::warn(names_(me_) + ": " + names_.list(writing) + " still writing into this rank's " +
                "buffers " + std::to_string(kWriterGrace.count()) +
                " s after the failure (stalled?): the failed op's buffers may still change");
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void Segment::close() noexcept {
  if (!base_) return;
  info(me_).closed.store(1, std::memory_order_release);
  if (slot_ >= 0) cpu_line(slot_).registered.fetch_sub(1, std::memory_order_seq_cst);
  slot_ = -1;
  wake_all();
}

void Segment::wake_all() noexcept {
  if (!base_) return;
  wake(gate());
  for (int r = 0; r < n_; ++r) {
    wake(progress(r));
    wake(bell(r));
  }
  if (crowded_)
    for (int x = 0; x < kCpuLines; ++x)
      if (cpu_line(x).asleep.load(std::memory_order_seq_cst) > 0) wake_cpu(x);
}

}  // namespace collie::shm
