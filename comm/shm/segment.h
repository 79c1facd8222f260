// comm/shm/segment.h: the memory the ranks of one host share, and how they
// wait for each other in it.
//
// One segment per communicator: an anonymous memfd that rank 0 creates and
// the others open through /proc/<pid>/fd/<fd>, so it never has a name in
// /dev/shm and nothing is left behind however the job ends (the memory goes
// when the last rank unmaps it, crash or not).
//
// Each rank owns a line (two cache lines, so the adjacent-line prefetcher
// does not couple neighbours) with its phase counter: every rank counts the
// phases of the collectives it runs in the same way, so "rank k has finished
// phase p" is "k's counter has reached p". A waiter spins a few
// microseconds, then sleeps on the counter with a futex; a rank that moves
// its counter wakes only when someone sleeps on it (one shared load
// otherwise).
//
// While it sleeps a waiter wakes every few milliseconds to see whether the
// rank it waits for has died (a pidfd), shut down, or aborted the
// communicator, and whether its own deadline has passed.
//
// A waiter spins only while the ranks that are awake (running, or woken and
// waiting for a CPU) fit the CPUs they may run on: with more ranks than
// CPUs, a spinner would hold the CPU a peer needs to arrive. Every sleeper
// says which word it sleeps on, and a waker counts it awake again before it
// wakes the word, so the count is right the moment the wakees are runnable.
//
// With more ranks than CPUs ("crowded"), a collective's waits go further.
// On this kind of VM a futex wake-up of a rank on another CPU costs the
// waker about 16 us (the interrupt) and the wakee 40 if its CPU had halted;
// one on the waker's own CPU about 1.5 us. So each rank notes the CPU it
// waits on (sched_getcpu) and sleeps on that CPU's line, not the shared
// gate, and wake-ups stay on their CPU:
//  - a waiter that needs a rank asleep on its own CPU (one that has not
//    arrived yet) wakes it and sleeps: a hand-off on one CPU;
//  - a waiter that is the only awake rank of its CPU spins, so the CPU does
//    not halt; when its wait ends it wakes the ranks asleep on its CPU whose
//    waits that phase ended;
//  - the rank that completes a phase wakes those of its own CPU, and of
//    another only where no rank is awake in (or just past) a wait for that
//    phase, which would wake them itself.
// In the steady state of small collectives no wake-up crosses CPUs.
#pragma once

#include <sched.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "base/config.h"
#include "base/spin.h"
#include "comm/backend.h"
#include "comm/transport.h"

namespace collie::shm {

constexpr size_t kLine = 128;

// A counter others wait on, alone in its line.
struct alignas(kLine) Counter {
  std::atomic<uint32_t> value;     // the futex word
  std::atomic<uint32_t> sleepers;  // ranks asleep on value
};

// What a rank says about the collective it is in (checked by every rank
// before any data moves, so that different calls are a mismatch error).
// Two 128-byte pairs of lines (a core's prefetcher fetches a line's pair
// with it).
struct alignas(kLine) DescSlot {
  // The first 64-byte line: the call, its check, and (small all-reduces)
  // the input's first bytes and its flag, so that a peer finds them in one
  // miss and the writer takes one line from the reader, not two.
  uint32_t seq;
  uint8_t op, dtype, redop;
  // 1 if this rank reads its peers' buffers directly (process_vm_readv) in
  // this op: every rank must say 1 for that path. Not compared by the check.
  uint8_t direct;
  int32_t tag;
  // An all-reduce of at most sizeof inline_data bytes carries its input
  // from inline_data on, and says `ready` = its seq once it is written
  // (after the data: x86 makes stores visible in order, and the release
  // store orders them elsewhere).
  std::atomic<uint32_t> ready;
  uint64_t count;
  // An all-reduce in place over memory from allocate_region: where peers
  // find it (its id 0 otherwise). Not compared by the check: ranks may
  // differ here, and then every rank copies.
  uint64_t reg_id;
  union {
    // The input of a small all-reduce: the first line's last 32 bytes and
    // the three lines after it.
    uint8_t inline_data[224];
    // A large op's: the rest of the region's address, and, with `direct`,
    // where this rank's input and output are, in its own address space
    // (written only then: a small op touches the lines of its input only).
    struct {
      uint8_t first_line_rest[32];
      uint64_t reg_bytes;
      uint64_t reg_offset;
      int32_t reg_fd;
      uint64_t in_addr, out_addr;
    } large;
  };
};
static_assert(sizeof(DescSlot) == 2 * kLine);
static_assert(offsetof(DescSlot, inline_data) == 32);

// What the ranks waiting on one CPU share (crowded segments only).
struct alignas(kLine) CpuLine {
  Counter line;                     // sleepers of this CPU sleep on line.value
  std::atomic<int32_t> registered;  // ranks last seen on this CPU (in a line of their own)
  std::atomic<int32_t> asleep;      // of those, asleep on line
  std::atomic<int32_t> watchers;    // of those, awake in a collective's wait
};
static_assert(sizeof(CpuLine) == 2 * kLine);
constexpr int kCpuLines = 64;  // CPU c uses line c % kCpuLines

struct alignas(kLine) RankInfo {
  int32_t pid;
  std::atomic<uint32_t> closed;  // 1: shut down cleanly
  std::atomic<int32_t> err_code;
  char err_msg[400];
  // The futex word this rank sleeps on (its offset + 1), 0 while awake; a
  // waker that wakes the word takes it back to 0 and counts the rank awake.
  alignas(kLine) std::atomic<uint64_t> asleep_on;
  // Crowded segments: the CPU line this rank waits on, and the phase its
  // last collective's wait was for (wake_gate_sleepers reads them).
  std::atomic<int32_t> slot;
  std::atomic<uint32_t> gate_target;
  cpu_set_t cpus;  // the CPUs this rank may run on (its affinity mask)
  // Where this rank mapped the segment, in its own address space: a peer
  // reads `pid` there with process_vm_readv to learn whether it may read
  // this rank's memory directly (see Segment::can_read_peers).
  uint64_t base_addr;
  // Whether this rank may read every peer's memory (its probe, and
  // COLLIE_SHM_CMA): 0 not known yet, 1 yes, 2 no. A sender hands a large
  // message to a receiver that may by its address instead of through slots.
  std::atomic<uint32_t> reads_peers;
  // 1 while this rank writes into its peers' buffers (the all-reduces that
  // push their reduced slices: Segment::begin_writes).
  std::atomic<uint32_t> writing;
};

// One direction of a point-to-point channel: a ring of slots.
struct SlotHeader {
  uint32_t seq;  // the message's per-pair number
  int32_t tag;
  uint64_t total;   // bytes of the whole message
  uint64_t offset;  // where this piece goes
  uint32_t len;
  // 1: no piece follows; the slot holds the sender's buffer address, and
  // the receiver reads the whole message from it (process_vm_readv) before
  // it frees the slot, which tells the sender its buffer is free again.
  uint32_t direct;
};

struct Layout {
  int n = 1;
  size_t chunk = 0;  // bytes per rank per round (large collectives)
  size_t small = 0;  // bytes per rank per small slot
  size_t p2p_slot = 0, p2p_slots = 0;
  size_t off_cpu = 0, off_gate = 0, off_counters = 0, off_desc = 0, off_info = 0, off_bell = 0,
         off_mail = 0, off_small = 0, off_big = 0, total = 0;
  static Layout make(int n, size_t chunk, size_t small);
};

// What a wait is part of, for its errors: an operation (formatted only when
// an error needs it: formatting every op cost a small all-reduce a tenth of
// its time) or a text.
class What {
 public:
  What(const OpDesc& d) : desc_(&d) {}                // NOLINT: implicit on purpose
  What(std::string text) : text_(std::move(text)) {}  // NOLINT
  std::string str() const { return desc_ ? desc_->describe() : text_; }

 private:
  const OpDesc* desc_ = nullptr;
  std::string text_;
};

class Segment {
 public:
  // Collective over the ranks of ctx: rank 0 creates, the others open.
  // Rank 0 settles the round and small sizes (`wanted`'s, or the round from
  // its L2 when not set); a rank that set either to another value throws
  // ErrorCode::mismatch naming the variable.
  Segment(const BackendContext& ctx, const config::ShmTuning& wanted, SpinBudget spin);
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  int rank() const { return me_; }
  int size() const { return n_; }
  const Layout& layout() const { return lay_; }
  // The settings every rank of this segment runs with (rank 0's).
  const config::ShmTuning& settings() const { return settings_; }
  // Whether this rank may read every peer's memory with process_vm_readv
  // (tried once, on the segment's pid fields: the kernel's ptrace checks,
  // Yama or a container's seccomp profile may forbid it), and
  // COLLIE_SHM_CMA allows it.
  bool can_read_peers() const { return read_peers_; }
  // More ranks than CPUs, or the caller says the host is crowded
  // (BackendContext::crowded); the same answer on every rank.
  bool crowded() const { return crowded_; }
  // Whether a waiter may spin now: the awake ranks fit their CPUs, beside
  // the threads busy beside them (BackendContext::beside_per_rank: hier's
  // part inside a host, each rank's stage across hosts).
  bool core_free() const { return awake() + beside_ <= cpus_; }
  // Whether rank r may read this rank's memory (its own probe's answer; no
  // while it has not answered yet).
  bool reads_peers(int r) { return info(r).reads_peers.load(std::memory_order_acquire) == 1; }
  // Whether peers could read these buffers of this rank directly: a buffer
  // in memory the kernel cannot pin (a device mapping, VM_IO or VM_PFNMAP)
  // is readable here but not through process_vm_readv. Checks the first
  // and last byte of each, and remembers the last 16 pairs found pinnable:
  // the check is two syscalls that pin four pages, 1.4 us of a 4.1 us
  // 32 KiB all-to-all, and a job's buffers come back op after op. (A
  // buffer freed and mapped again at the same place and size as a device
  // mapping is then offered for direct reads: the peers' reads fail, and
  // the op with an error naming the rank, not with wrong numbers.)
  bool pinnable(const void* a, size_t a_len, const void* b, size_t b_len);
  // Reads `len` bytes at `remote` in rank r's address space into `local`;
  // throws naming r and `what` when it cannot (r died: peer_lost).
  void read_peer(int r, void* local, uint64_t remote, size_t len, const What& what);
  // Writes `len` bytes from `local` at `remote` in rank r's address space
  // (process_vm_writev, allowed wherever the reads are); throws as
  // read_peer does.
  void write_peer(int r, uint64_t remote, const void* local, size_t len, const What& what);
  // Rank r's registered region that its descriptor `s` names, mapped here
  // (opened through /proc on the first op that names it, then kept until
  // the segment goes; at most kMaxMapped, the least recently used dropped).
  uint8_t* peer_buffer(int r, const DescSlot& s, const What& what);

  // Where waiters for every rank sleep: its value is the lowest phase all
  // ranks have reached, as last seen by a rank that moved it.
  Counter& gate() { return at<Counter>(lay_.off_gate); }
  Counter& progress(int r) { return at<Counter>(lay_.off_counters + r * sizeof(Counter)); }
  DescSlot& desc(int r, uint32_t seq) {
    return at<DescSlot>(lay_.off_desc + (r * 2 + (seq & 1)) * sizeof(DescSlot));
  }
  RankInfo& info(int r) { return at<RankInfo>(lay_.off_info + r * sizeof(RankInfo)); }
  // Rank r's doorbell: rung when a point-to-point channel into or out of r moves.
  Counter& bell(int r) { return at<Counter>(lay_.off_bell + r * sizeof(Counter)); }
  uint8_t* small_slot(int r, uint32_t seq) {
    return base_ + lay_.off_small + (r * 2 + (seq & 1)) * lay_.small;
  }
  uint8_t* big(int r, int b) { return base_ + lay_.off_big + (r * 2 + b) * lay_.chunk; }
  // The channel from `from` to `to`: head (pieces written), tail (pieces read), slots.
  Counter& mail_head(int from, int to) { return at<Counter>(mail_base(from, to)); }
  Counter& mail_tail(int from, int to) { return at<Counter>(mail_base(from, to) + kLine); }
  SlotHeader& mail_header(int from, int to, uint32_t i) {
    return at<SlotHeader>(mail_base(from, to) + 2 * kLine + (i % lay_.p2p_slots) * slot_stride());
  }
  uint8_t* mail_data(int from, int to, uint32_t i) {
    return base_ + mail_base(from, to) + 2 * kLine + (i % lay_.p2p_slots) * slot_stride() + kLine;
  }

  // This rank's own counter: advance it one phase and wake its sleepers.
  uint32_t phase() const { return phase_; }
  void advance();
  // Rings r's doorbell (point-to-point progress that r may wait for).
  void ring(int r);
  void publish(Counter& c, uint32_t v);

  CpuLine& cpu_line(int slot) { return at<CpuLine>(lay_.off_cpu + slot * sizeof(CpuLine)); }

  // Waits until every other rank's counter has reached this rank's phase.
  // `what` names the operation for errors.
  void wait_all(const What& what, Deadline deadline) { wait_all_at(phase_, what, deadline); }
  void wait_all_at(uint32_t target, const What& what, Deadline deadline);
  // Waits until every other rank's descriptor for `seq` says ready (an
  // inline all-reduce), with the checks and errors of wait_all.
  void wait_all_ready(uint32_t seq, const What& what, Deadline deadline);
  // Waits until rank r's counter reaches `target`.
  void wait_rank(int r, uint32_t target, const What& what, Deadline deadline);
  // Waits until this rank's doorbell moves from `seen`, with the same checks
  // as the waits above; `peers` are the ranks whose death or shutdown would
  // end the wait.
  void wait_bell(uint32_t seen, const std::vector<int>& peers, const What& what, Deadline deadline);

  // Throws what a wait would: another rank's abort, or this communicator's
  // failure (another thread aborted it).
  void check();
  // This rank's writes into its peers' buffers, bracketed (the direct and
  // in-place all-reduces push their reduced slices). begin_writes says so
  // in the rank's RankInfo::writing and then throws as check() does if a
  // rank has aborted; end_writes clears it. A rank that fails an op waits
  // in abort() until no peer is inside the bracket, or kWriterGrace has
  // passed, so that no peer writes into its buffers after its op has
  // returned them to the caller; a writer looks for an abort before each
  // piece (write_peer) and each round. Either the writer sees the abort or
  // the aborting rank sees the writer (seq_cst stores and loads both sides).
  void begin_writes();
  void end_writes() noexcept;
  static constexpr std::chrono::seconds kWriterGrace{3};
  static constexpr size_t kWritePiece = size_t{1} << 20;
  // Whether some rank has aborted (one load: for ops about to start, which
  // may not wait at all when every other rank's part is there already).
  bool aborted() const { return abort_word_->load(std::memory_order_relaxed) != 0; }
  // Why `peer` will never move again (died, or shut down), or "".
  std::string gone(int peer, const What& what);
  // After something failed that touched `peer`'s memory (a read, opening
  // its buffer): throws the cause where there is one (another rank's abort,
  // this communicator's failure, `peer` gone: peer_lost); returns when
  // there is none, for the caller to report its own failure.
  void blame_peer(int peer, const What& what);
  void abort(const Error& e) noexcept;  // tell every rank
  void close() noexcept;                // goodbye
  void wake_all() noexcept;             // interrupt every sleeper (on this host)

 private:
  template <class T>
  T& at(size_t off) {
    return *reinterpret_cast<T*>(base_ + off);
  }
  void open_rank0s(const std::string& said, const config::ShmTuning& wanted);
  size_t slot_stride() const { return kLine + lay_.p2p_slot; }
  size_t mail_base(int from, int to) const {
    return lay_.off_mail +
           (static_cast<size_t>(from) * n_ + to) * (2 * kLine + lay_.p2p_slots * slot_stride());
  }
  bool dead(int r);
  // abort()'s wait for the peers inside begin_writes' bracket.
  void drain_writers() noexcept;
  int awake() const;  // ranks of this segment not asleep in a wait
  // Wakes every sleeper on `c`, counting them awake first (in `local` too,
  // when given: the asleep count of the CPU line `c` belongs to); `bump`
  // moves the word itself (the callers of the other words moved it before).
  void wake(Counter& c, std::atomic<int32_t>* local = nullptr, bool bump = false) noexcept;
  // A CPU line's word moves only here.
  void wake_cpu(int slot) noexcept { wake(cpu_line(slot).line, &cpu_line(slot).asleep, true); }
  // Counts this rank asleep on `c` (and in `local`), and back awake unless
  // a waker did.
  void mark_asleep(Counter& c, std::atomic<int32_t>* local);
  void mark_awake(Counter& c, std::atomic<int32_t>* local);
  // Takes rank r's sleep on the word `tag` back (whoever succeeds counts it
  // awake, once): whether this call did.
  bool claim(int r, uint64_t tag, std::atomic<int32_t>* local);
  // Polls `pred` for at most the spin budget, while `may_spin()`; whether
  // `pred` came true.
  template <class Pred, class May>
  bool spin_for(Pred pred, May may_spin);
  // The CPU line of the CPU this rank runs on now; moves its registration.
  int here();
  // A collective's wait: every other rank has reached `target` when `pred`.
  template <class Pred>
  void wait_gate(uint32_t target, Pred pred, const What& what, Deadline deadline);
  template <class Pred>
  void wait_crowded(uint32_t target, Pred pred, const What& what, Deadline deadline);
  // Crowded hosts: polls `pred`, handing the CPU over (sched_yield) between
  // looks, for at most yield_ and not past `deadline` (Open MPI's
  // oversubscribed progress loop); false when it runs out. An abort is
  // seen at once; a dead peer, by the sleep that follows.
  template <class Pred>
  bool yield_for(Pred pred, Deadline deadline);
  // Sleeps in slices on `c` until `pred`, a peer's death or abort, or
  // `deadline`.
  template <class Pred>
  void sleep_until(Counter& c, std::atomic<int32_t>* local, std::span<const int> peers, Pred pred,
                   const What& what, Deadline deadline);
  // Phase `low` completed: wake the sleepers of collectives' waits.
  void wake_gate_sleepers(uint32_t low) noexcept;
  // Wakes the ranks asleep on CPU line `slot` that are at phase `upto` or
  // behind (their waits have ended); whether there were any.
  bool wake_done_here(int slot, uint32_t upto) noexcept;
  uint64_t word_tag(const Counter& c) const {
    return static_cast<uint64_t>(reinterpret_cast<const uint8_t*>(&c) - base_) + 1;
  }
  [[noreturn]] void timed_out(const std::vector<int>& late, const What& what);
  // Spins, then sleeps on `c` while `pred()` is false, until `deadline`;
  // throws when a rank aborts or one of `peers` is gone.
  template <class Pred>
  void wait_on(Counter& c, std::span<const int> peers, Pred pred, const What& what,
               Deadline deadline);

  const int me_, n_;
  const RankNames names_;  // for messages
  config::ShmTuning settings_;
  Layout lay_;
  bool read_peers_ = false;
  void copy_with_peer(int r, void* local, uint64_t remote, size_t len, bool write,
                      const What& what);
  SpinBudget spin_;
  const std::chrono::milliseconds timeout_;
  std::shared_ptr<FailureLatch> failure_;
  uint8_t* base_ = nullptr;
  std::vector<int> pidfds_;
  std::vector<int32_t> pids_;
  std::vector<int> others_;  // every rank but this one
  struct PinnedPair {
    const void* a = nullptr;
    size_t a_len = 0;
    const void* b = nullptr;
    size_t b_len = 0;
    bool operator==(const PinnedPair&) const = default;
  };
  std::array<PinnedPair, 16> pinned_{};  // pinnable()'s last yeses
  size_t next_pinned_ = 0;
  uint32_t phase_ = 0;
  std::atomic<uint32_t>* abort_word_ = nullptr;
  std::atomic<int32_t>* asleep_ = nullptr;  // ranks asleep in a wait
  int cpus_ = 1;                            // CPUs in the union of the ranks' masks
  int beside_ = 0;        // threads busy beside the ranks (hier: each one's stage across hosts)
  bool crowded_ = false;  // more ranks than those CPUs
  int slot_ = -1;         // the CPU line this rank is registered on
  std::chrono::microseconds yield_{0};  // crowded: yield_for's budget (0: sleep at once)
  // Peers' registered regions mapped here (peer_buffer).
  struct Mapping {
    uint8_t* base = nullptr;
    size_t bytes = 0;
    uint64_t used = 0;
    Mapping() = default;
    Mapping(const Mapping&) = delete;
    Mapping& operator=(const Mapping&) = delete;
    ~Mapping();
  };
  static constexpr size_t kMaxMapped = 64;
  std::map<std::pair<int, uint64_t>, Mapping> mapped_;  // (rank, region id)
  uint64_t uses_ = 0;
};

}  // namespace collie::shm
