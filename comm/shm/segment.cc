// comm/shm/segment.cc: creating and sharing the segment; waiting in it.
#include "comm/shm/segment.h"

#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <cstring>
#include <fstream>
#include <span>
#include <sstream>

#include "comm/core/log.h"
#include "comm/core/shared_file.h"
#include "comm/core/topology.h"

namespace collie::shm {

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kMagic = 0x434c5348;  // "CLSH"
constexpr uint32_t kVersion = 4;
// How often a sleeping waiter looks at the peer's process and its deadline.
constexpr auto kSlice = std::chrono::milliseconds(5);

struct alignas(kLine) Header {
  uint32_t magic;
  uint32_t version;
  uint32_t n;
  uint32_t pad;
  uint64_t total;
  std::atomic<uint32_t> abort_word;  // 0, or 1 + the rank that aborted first
};

size_t round_up(size_t v, size_t a) {
  return (v + a - 1) / a * a;
}

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

Layout Layout::make(int n, size_t chunk, size_t small) {
  Layout l;
  l.n = n;
  l.chunk = round_up(std::max<size_t>(chunk, 4096), kLine);
  l.small = round_up(std::max<size_t>(small, 64), kLine);
  l.p2p_slot = 64 * 1024;
  l.p2p_slots = 4;
  size_t off = round_up(sizeof(Header), kLine);
  l.off_gate = off;
  off += sizeof(Counter);
  l.off_counters = off;
  off += n * sizeof(Counter);
  l.off_desc = off;
  off += 2 * n * sizeof(DescSlot);
  l.off_info = off;
  off += n * sizeof(RankInfo);
  l.off_bell = off;
  off += n * sizeof(Counter);
  l.off_mail = off;
  off += static_cast<size_t>(n) * n * (2 * kLine + l.p2p_slots * (kLine + l.p2p_slot));
  off = round_up(off, 4096);
  l.off_small = off;
  off += 2 * n * l.small;
  off = round_up(off, 4096);
  l.off_big = off;
  off += 2 * n * l.chunk;
  l.total = round_up(off, 4096);
  return l;
}

Segment::Segment(const BackendContext& ctx, const Layout& layout, SpinBudget spin)
    : me_(ctx.launch.rank),
      n_(ctx.launch.world_size),
      names_(ctx.names),
      lay_(layout),
      spin_(spin),
      timeout_(ctx.launch.timeout),
      failure_(ctx.failure) {
  const std::string who = names_(me_);
  const std::string key = ctx.key + "/shm";
  int fd = -1;  // rank 0's, open until every rank has mapped the segment
  if (me_ == 0) {
    shared_file::Made made =
        shared_file::create("collie-shm", lay_.total, who, "the shared segment");
    fd = made.fd;
    base_ = static_cast<uint8_t*>(made.base);
    std::string where = std::to_string(getpid()) + " " + std::to_string(fd) + " " +
                        std::to_string(lay_.total) + " " + topology::boot_id();
    if (n_ > 1) ctx.store->set(key, to_bytes(where));
  } else {
    std::vector<std::string> from_rank0(n_);
    from_rank0[0] = key;
    wait_for_ranks(*ctx.store, from_rank0, Clock::now() + timeout_, timeout_, who, names_);
    std::istringstream in(collie::to_string(ctx.store->get(key)));
    long pid = 0, rfd = 0;
    size_t total = 0;
    std::string boot;
    in >> pid >> rfd >> total >> boot;
    if (total != lay_.total)
      throw Error(ErrorCode::mismatch,
                  who + ": rank 0 made a shared segment of " + std::to_string(total) +
                      " bytes, this rank expects " + std::to_string(lay_.total) +
                      " (different COLLIE_SHM_CHUNK or COLLIE_SHM_SMALL on different ranks?)");
    if (!boot.empty() && boot != topology::boot_id())
      throw Error(ErrorCode::unavailable,
                  who +
                      " is not on rank 0's host (another kernel): the shm backend needs every "
                      "rank on one host; use tcp, or auto");
    base_ = static_cast<uint8_t*>(shared_file::open(
        pid, static_cast<int>(rfd), lay_.total, who, "rank 0's shared segment",
        " (ranks in different PID namespaces or containers cannot share memory this way; use "
        "tcp)"));
  }
  auto& h = at<Header>(0);
  abort_word_ = &h.abort_word;
  if (me_ == 0) {
    h.magic = kMagic;
    h.version = kVersion;
    h.n = static_cast<uint32_t>(n_);
    h.total = lay_.total;
  }
  info(me_).pid = static_cast<int32_t>(getpid());
  // Everyone has mapped it (and rank 0's header is written) before anyone
  // uses it. A communicator of one rank has no store and nobody to wait for.
  if (n_ > 1) ctx.store->set(key + "/up/" + std::to_string(me_), to_bytes("1"));
  std::vector<std::string> up;
  for (int q = 0; q < n_; ++q) up.push_back(key + "/up/" + std::to_string(q));
  try {
    if (n_ > 1) wait_for_ranks(*ctx.store, up, Clock::now() + timeout_, timeout_, who, names_);
  } catch (...) {
    if (fd >= 0) ::close(fd);
    munmap(base_, lay_.total);
    base_ = nullptr;
    throw;
  }
  if (fd >= 0) ::close(fd);  // the mappings keep the memory; nothing has a name
  if (h.magic != kMagic || h.version != kVersion || h.n != static_cast<uint32_t>(n_)) {
    munmap(base_, lay_.total);
    base_ = nullptr;
    throw Error(ErrorCode::mismatch, who +
                                         ": the shared segment is not collie's or has another "
                                         "world size");
  }
  pidfds_.assign(n_, -1);
  pids_.assign(n_, 0);
  for (int q = 0; q < n_; ++q)
    if (q != me_) others_.push_back(q);
  for (int q = 0; q < n_; ++q) {
    pids_[q] = info(q).pid;
    if (q != me_) pidfds_[q] = static_cast<int>(syscall(SYS_pidfd_open, pids_[q], 0));
  }
}

Segment::~Segment() {
  for (int fd : pidfds_)
    if (fd >= 0) ::close(fd);
  if (base_) munmap(base_, lay_.total);
}

void Segment::publish(Counter& c, uint32_t v) {
  c.value.store(v, std::memory_order_seq_cst);
  if (c.sleepers.load(std::memory_order_seq_cst) != 0)
    futex(&c.value, FUTEX_WAKE, INT_MAX, nullptr);
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
      futex(&g.value, FUTEX_WAKE, INT_MAX, nullptr);
      return;
    }
}

void Segment::ring(int r) {
  Counter& b = bell(r);
  b.value.fetch_add(1, std::memory_order_seq_cst);
  if (b.sleepers.load(std::memory_order_seq_cst) != 0)
    futex(&b.value, FUTEX_WAKE, INT_MAX, nullptr);
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

template <class Pred>
void Segment::wait_on(Counter& c, std::span<const int> peers, Pred pred, const What& what,
                      Deadline deadline) {
  if (pred()) return;
  const auto spin = spin_.get();
  if (spin.count() > 0) {
    // The clock is read after the first 64 polls: most small waits end
    // sooner, and a clock read cost an 8 B all-reduce a tenth of its time.
    Clock::time_point spin_end{};
    for (;;) {
      for (int i = 0; i < 64; ++i) {
        if (pred()) return;
        cpu_relax();
      }
      if (abort_word_->load(std::memory_order_relaxed) != 0 || failure_->failed()) check();
      auto now = Clock::now();
      if (spin_end == Clock::time_point{})
        spin_end = now + spin;
      else if (now >= spin_end)
        break;
    }
  }
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
    c.sleepers.fetch_add(1, std::memory_order_seq_cst);
    uint32_t v = c.value.load(std::memory_order_seq_cst);
    if (!pred()) futex(&c.value, FUTEX_WAIT, v, &ts);
    c.sleepers.fetch_sub(1, std::memory_order_seq_cst);
    if (pred()) return answered();
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
  if (all()) return;
  wait_on(gate(), others_, all, what, deadline);
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
  if (all()) return;
  // Each rank moves its counter after its line is ready, so the gate moves
  // (and wakes sleepers) once every line is.
  wait_on(gate(), others_, all, what, deadline);
  if (!all()) wait_all(what, deadline);  // names the late ranks
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
  if (abort_word_->load(std::memory_order_acquire) == 0) {
    RankInfo& i = info(me_);
    std::string msg = e.what();
    std::memset(i.err_msg, 0, sizeof i.err_msg);
    std::memcpy(i.err_msg, msg.data(), std::min(msg.size(), sizeof i.err_msg - 1));
    i.err_code.store(static_cast<int32_t>(e.code()), std::memory_order_seq_cst);
    uint32_t expected = 0;
    abort_word_->compare_exchange_strong(expected, static_cast<uint32_t>(me_ + 1));
  }
  wake_all();
}

void Segment::close() noexcept {
  if (!base_) return;
  info(me_).closed.store(1, std::memory_order_release);
  wake_all();
}

void Segment::wake_all() noexcept {
  if (!base_) return;
  futex(&gate().value, FUTEX_WAKE, INT_MAX, nullptr);
  for (int r = 0; r < n_; ++r) {
    futex(&progress(r).value, FUTEX_WAKE, INT_MAX, nullptr);
    futex(&bell(r).value, FUTEX_WAKE, INT_MAX, nullptr);
  }
}

}  // namespace collie::shm
