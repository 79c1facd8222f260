// comm/shm/segment.cc: creating and sharing the segment; waiting in it.
#include "comm/shm/segment.h"

#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <span>
#include <sstream>
#include <thread>

#include "base/log.h"
#include "base/shared_file.h"
#include "base/topology.h"

namespace collie::shm {

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kMagic = 0x434c5348;  // "CLSH"
// 6: DescSlot's first line holds the call, the ready word and the input.
// 7: RankInfo::base_addr, DescSlot's direct-read fields.
// 8: DescSlot is four lines; the inline input up to 224 bytes.
constexpr uint32_t kVersion = 8;
// The first word of rank 0's description of the segment in the store.
constexpr const char* kDescribe = "collie-shm/8";
// How long rank 0 waits for the others to read a refusal.
constexpr std::chrono::milliseconds kAckWait{5000};
// How often a sleeping waiter looks at the peer's process and its deadline.
constexpr auto kSlice = std::chrono::milliseconds(5);

struct alignas(kLine) Header {
  uint32_t magic;
  uint32_t version;
  uint32_t n;
  uint32_t pad;
  uint64_t total;
  std::atomic<uint32_t> abort_word;            // 0, or 1 + the rank that aborted first
  alignas(kLine) std::atomic<int32_t> asleep;  // ranks asleep in a wait (see core_free)
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

// A rank that cannot share the segment says why ("!<code> <rank>
// <message>") where the others look: under rank 0's description when rank 0
// cannot make it, else under <key>/refused (one key, so that each rank looks
// once). Best effort: with the store gone too, the others time out as before.
void post_refusal(Store& store, const std::string& key, int rank, const Error& e) {
  try {
    store.set(key, to_bytes("!" + std::to_string(static_cast<int>(e.code())) + " " +
                            std::to_string(rank) + " " + e.what()));
  } catch (const Error&) {
  }
}

// Throws the refusal in `value`, if that is what it is.
void check_refusal(const std::string& value, const std::string& who, const RankNames& names) {
  if (value.empty() || value[0] != '!') return;
  // "!<code> <rank> <message>"; the message may hold anything.
  const size_t a = value.find(' '), b = a == std::string::npos ? a : value.find(' ', a + 1);
  int code = std::atoi(value.c_str() + 1), rank = 0;
  std::string msg = value;
  if (b != std::string::npos) {
    rank = std::atoi(value.c_str() + a + 1);
    msg = value.substr(b + 1);
  }
  if (code < 1 || code > kNumErrorCodes) code = static_cast<int>(ErrorCode::internal);
  throw Error(static_cast<ErrorCode>(code),
              who + ": " + names(rank) + " could not share the segment: " + msg);
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
  l.off_cpu = off;
  off += kCpuLines * sizeof(CpuLine);
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

Segment::Segment(const BackendContext& ctx, const config::ShmTuning& wanted, SpinBudget spin)
    : me_(ctx.launch.rank),
      n_(ctx.launch.world_size),
      names_(ctx.names),
      settings_(wanted),
      spin_(spin),
      timeout_(ctx.launch.timeout),
      failure_(ctx.failure) {
  const std::string who = names_(me_);
  const std::string key = ctx.key + "/shm";
  const std::string refused = key + "/refused", acks = key + "/acks";
  int fd = -1;  // rank 0's, open until every rank has mapped the segment
  const std::string my_up = key + "/up/" + std::to_string(me_);
  // After a refusal, rank 0 (whose process may serve the store) stays until
  // every other rank has read it, or for 5 s at most; the others say so.
  auto acknowledge = [&] {
    try {
      ctx.store->add(acks, 1);
    } catch (const Error&) {
    }
  };
  auto await_acks = [&] {
    const auto until = Clock::now() + std::min<std::chrono::milliseconds>(timeout_, kAckWait);
    try {
      while (ctx.store->add(acks, 0) < n_ - 1 && Clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    } catch (const Error&) {
    }
  };
  if (me_ == 0) {
    if (!settings_.chunk_set)
      settings_.chunk_bytes = config::shm_auto_chunk(topology::l2_per_core(), n_);
    lay_ = Layout::make(n_, settings_.chunk_bytes, settings_.small_bytes);
    try {
      shared_file::Made made =
          shared_file::create("collie-shm", lay_.total, who, "the shared segment");
      fd = made.fd;
      base_ = static_cast<uint8_t*>(made.base);
    } catch (const Error& e) {
      if (n_ > 1) {
        post_refusal(*ctx.store, key, 0, e);
        await_acks();
      }
      throw;
    }
    // The format's version first, so that a later build's rank refuses an
    // older description by name instead of misreading it.
    std::string where = std::string(kDescribe) + " " + std::to_string(getpid()) + " " +
                        std::to_string(fd) + " " + std::to_string(lay_.total) + " " +
                        std::to_string(settings_.chunk_bytes) + " " +
                        std::to_string(settings_.small_bytes) + " " + topology::boot_id();
    if (n_ > 1) ctx.store->set(key, to_bytes(where));
  } else {
    std::vector<std::string> from_rank0(n_);
    from_rank0[0] = key;
    wait_for_ranks(*ctx.store, from_rank0, Clock::now() + timeout_, timeout_, who, names_);
    const std::string said = collie::to_string(ctx.store->get(key));
    try {
      check_refusal(said, who, names_);
    } catch (const Error&) {
      acknowledge();
      throw;
    }
    try {
      open_rank0s(said, wanted);
    } catch (const Error& e) {
      post_refusal(*ctx.store, refused, me_, e);
      ctx.store->set(my_up, to_bytes("!"));
      acknowledge();
      throw;
    }
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
  info(me_).base_addr = reinterpret_cast<uint64_t>(base_);
  if (sched_getaffinity(0, sizeof info(me_).cpus, &info(me_).cpus) != 0) {
    CPU_ZERO(&info(me_).cpus);
    CPU_SET(0, &info(me_).cpus);
  }
  // Everyone has mapped it (and rank 0's header is written) before anyone
  // uses it. A communicator of one rank has no store and nobody to wait for.
  if (n_ > 1) ctx.store->set(my_up, to_bytes("1"));
  std::vector<std::string> up;
  for (int q = 0; q < n_; ++q) up.push_back(key + "/up/" + std::to_string(q));
  try {
    if (n_ > 1) {
      wait_for_ranks(*ctx.store, up, Clock::now() + timeout_, timeout_, who, names_);
      if (ctx.store->check({refused})) {
        if (me_ == 0)
          await_acks();
        else
          acknowledge();
        check_refusal(collie::to_string(ctx.store->get(refused)), who, names_);
      }
    }
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
  asleep_ = &h.asleep;
  cpu_set_t all;
  CPU_ZERO(&all);
  for (int q = 0; q < n_; ++q) CPU_OR(&all, &all, &info(q).cpus);
  cpus_ = std::max(CPU_COUNT(&all), 1);
  crowded_ = n_ > cpus_;
  if (crowded_) here();
  pidfds_.assign(n_, -1);
  pids_.assign(n_, 0);
  for (int q = 0; q < n_; ++q)
    if (q != me_) others_.push_back(q);
  for (int q = 0; q < n_; ++q) {
    pids_[q] = info(q).pid;
    if (q != me_) pidfds_[q] = static_cast<int>(syscall(SYS_pidfd_open, pids_[q], 0));
  }
  read_peers_ = settings_.cma && n_ > 1;
  for (int q = 0; q < n_ && read_peers_; ++q) {
    if (q == me_) continue;
    int32_t seen = 0;
    const uint64_t at_pid =
        info(q).base_addr + lay_.off_info + q * sizeof(RankInfo) + offsetof(RankInfo, pid);
    iovec local{&seen, sizeof seen}, remote{reinterpret_cast<void*>(at_pid), sizeof seen};
    read_peers_ =
        process_vm_readv(pids_[q], &local, 1, &remote, 1, 0) == static_cast<ssize_t>(sizeof seen) &&
        seen == pids_[q];
  }
  info(me_).reads_peers.store(read_peers_ ? 1 : 2, std::memory_order_release);
}

bool Segment::pinnable(const void* a, size_t a_len, const void* b, size_t b_len) {
  const PinnedPair key{a, a_len, b, b_len};
  for (const PinnedPair& k : pinned_)
    if (k.a && k == key) return true;
  uint8_t sink[4];
  const auto* pa = static_cast<const uint8_t*>(a);
  const auto* pb = static_cast<const uint8_t*>(b);
  iovec local[4], remote[4];
  const uint8_t* at[4] = {pa, pa + a_len - 1, pb, pb + b_len - 1};
  for (int i = 0; i < 4; ++i) {
    local[i] = {&sink[i], 1};
    remote[i] = {const_cast<uint8_t*>(at[i]), 1};
  }
  if (process_vm_readv(pids_[me_], local, 4, remote, 4, 0) != 4) return false;
  pinned_[next_pinned_++ % pinned_.size()] = key;
  return true;
}

void Segment::read_peer(int r, void* local, uint64_t remote, size_t len, const What& what) {
  auto* to = static_cast<uint8_t*>(local);
  while (len > 0) {
    iovec l{to, len}, rem{reinterpret_cast<void*>(remote), len};
    const ssize_t got = process_vm_readv(pids_[r], &l, 1, &rem, 1, 0);
    if (got <= 0) {
      // A peer that died (ESRCH: its memory is gone) or gave up on the op
      // and aborted (its buffer may be gone) is the cause to report.
      const int err = got < 0 ? errno : EIO;
      check();
      if (std::string why = gone(r, what); !why.empty()) throw Error(ErrorCode::peer_lost, why);
      if (err == ESRCH)
        throw Error(ErrorCode::peer_lost, names_(me_) + ": " + names_(r) + " (pid " +
                                              std::to_string(pids_[r]) + ") died during " +
                                              what.str());
      throw Error(ErrorCode::internal, names_(me_) + ": reading " + names_(r) + "'s buffer of " +
                                           what.str() + " failed: " + std::strerror(err));
    }
    to += got;
    remote += static_cast<uint64_t>(got);
    len -= static_cast<size_t>(got);
  }
}

// Rank q > 0: checks rank 0's description of the segment (`said`) against
// this rank's settings, adopts rank 0's and maps the segment.
void Segment::open_rank0s(const std::string& said, const config::ShmTuning& wanted) {
  const std::string who = names_(me_);
  std::istringstream in(said);
  long pid = 0, rfd = 0;
  size_t total = 0, chunk = 0, small = 0;
  std::string format, boot;
  in >> format >> pid >> rfd >> total >> chunk >> small;
  if (format != kDescribe || !in)
    throw Error(ErrorCode::mismatch, who + ": rank 0 describes its shared segment as '" + said +
                                         "', not in this build's form (" + kDescribe +
                                         "): is rank 0 running another collie build?");
  in >> boot;  // "" when rank 0 could not read its boot id
  if (!boot.empty() && boot != topology::boot_id())
    throw Error(ErrorCode::unavailable,
                who +
                    " is not on rank 0's host (another kernel): the shm backend needs every "
                    "rank on one host; use tcp, or auto");
  auto agree = [&](const char* var, bool set, size_t& mine, size_t rank0) {
    if (set && mine != rank0)
      throw Error(ErrorCode::mismatch,
                  who + " has " + var + "=" + std::to_string(mine) + ", rank 0 has " +
                      std::to_string(rank0) +
                      ": every rank of a host must use rank 0's value (set it the same "
                      "everywhere, or only on rank 0)");
    mine = rank0;
  };
  agree("COLLIE_SHM_CHUNK", wanted.chunk_set, settings_.chunk_bytes, chunk);
  agree("COLLIE_SHM_SMALL", wanted.small_set, settings_.small_bytes, small);
  lay_ = Layout::make(n_, settings_.chunk_bytes, settings_.small_bytes);
  if (total != lay_.total)
    throw Error(ErrorCode::mismatch, who + ": rank 0 made a shared segment of " +
                                         std::to_string(total) + " bytes, this rank expects " +
                                         std::to_string(lay_.total) +
                                         " (a different collie build on rank 0?)");
  base_ = static_cast<uint8_t*>(shared_file::open(
      pid, static_cast<int>(rfd), lay_.total, who, "rank 0's shared segment",
      " (ranks in different PID namespaces or containers cannot share memory this way; use "
      "tcp)"));
}

Segment::~Segment() {
  for (int fd : pidfds_)
    if (fd >= 0) ::close(fd);
  if (base_) munmap(base_, lay_.total);
}

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
