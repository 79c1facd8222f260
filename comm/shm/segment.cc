// comm/shm/segment.cc: creating and sharing the segment, and reading a
// peer's memory directly; the waiting in it is segment_wait.cc's.
#include "comm/shm/segment.h"

#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
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
  crowded_ = n_ > cpus_ || ctx.crowded;
  // Threads busy beside the ranks on their CPUs: hier's part inside a host
  // runs beside each rank's stage across hosts (comm/hier/hier_backend.cc).
  // A waiter spins only where they all fit: 2 hosts x 2 ranks sharing 2
  // cores spun 0.4-1.7 ms per 8 B all-reduce, against 0.09-0.13 asleep
  // (bench/RESULTS.md, "Two hosts on a shaped link"). (Not the launch's
  // other local ranks: after a split they may be bound to other CPUs.)
  beside_ = n_ * std::max(ctx.beside_per_rank, 0);
  if (crowded_) here();
  // Crowded: a waiter hands its CPU over between looks before it sleeps
  // (bench/RESULTS.md, "More ranks than CPUs: the CPU handed over").
  if (crowded_)
    yield_ = std::chrono::microseconds(wanted.yield_us < 0 ? config::kYieldUs : wanted.yield_us);
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

// One copy between this process and rank r's, `len` bytes: a read
// (process_vm_readv) or a write (process_vm_writev). A write goes in pieces
// of kWritePiece, each after a look for an abort: a peer that failed must
// not find its buffer changing after its op returned (begin_writes).
void Segment::copy_with_peer(int r, void* local, uint64_t remote, size_t len, bool write,
                             const What& what) {
  auto* at = static_cast<uint8_t*>(local);
  while (len > 0) {
    if (write) check();
    const size_t part = write ? std::min(len, kWritePiece) : len;
    iovec l{at, part}, rem{reinterpret_cast<void*>(remote), part};
    const ssize_t got = write ? process_vm_writev(pids_[r], &l, 1, &rem, 1, 0)
                              : process_vm_readv(pids_[r], &l, 1, &rem, 1, 0);
    if (got <= 0) {
      // A peer that died (ESRCH: its memory is gone) or gave up on the op
      // and aborted (its buffer may be gone) is the cause to report.
      const int err = got < 0 ? errno : EIO;
      blame_peer(r, what);
      if (err == ESRCH)
        throw Error(ErrorCode::peer_lost, names_(me_) + ": " + names_(r) + " (pid " +
                                              std::to_string(pids_[r]) + ") died during " +
                                              what.str());
      throw Error(ErrorCode::internal, names_(me_) + (write ? ": writing " : ": reading ") +
                                           names_(r) + "'s buffer of " + what.str() +
                                           " failed: " + std::strerror(err));
    }
    at += got;
    remote += static_cast<uint64_t>(got);
    len -= static_cast<size_t>(got);
  }
}

void Segment::read_peer(int r, void* local, uint64_t remote, size_t len, const What& what) {
  copy_with_peer(r, local, remote, len, false, what);
}

void Segment::write_peer(int r, uint64_t remote, const void* local, size_t len, const What& what) {
  copy_with_peer(r, const_cast<void*>(local), remote, len, true, what);
}

Segment::Mapping::~Mapping() {
  if (base) munmap(base, bytes);
}

uint8_t* Segment::peer_buffer(int r, const DescSlot& s, const What& what) {
  Mapping& m = mapped_[{r, s.reg_id}];
  m.used = ++uses_;
  if (!m.base) {
    // A peer's freed region stays alive while it is mapped here: keep at
    // most kMaxMapped, dropping the one used longest ago (reopened if it
    // comes back).
    if (mapped_.size() > kMaxMapped) {
      auto old = mapped_.begin();
      for (auto it = mapped_.begin(); it != mapped_.end(); ++it)
        if (it->second.used < old->second.used) old = it;
      mapped_.erase(old);
    }
    try {
      m.base = static_cast<uint8_t*>(
          shared_file::open(info(r).pid, s.large.reg_fd, s.large.reg_bytes, names_(me_),
                            names_(r) + "'s shared buffer of " + what.str()));
    } catch (const Error&) {
      // A peer that died (its /proc entry is gone) or aborted is the cause
      // to report, as a lost peer, not the open that failed because of it.
      mapped_.erase({r, s.reg_id});
      blame_peer(r, what);
      throw;
    }
    m.bytes = s.large.reg_bytes;
  }
  return m.base + s.large.reg_offset;
}

void Segment::blame_peer(int peer, const What& what) {
  check();
  if (std::string why = gone(peer, what); !why.empty()) throw Error(ErrorCode::peer_lost, why);
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

}  // namespace collie::shm
