// hooks/model_averager.cc: parameter averaging for post-local and
// hierarchical SGD (see model_averager.h), and grouping ranks by host.
#include "hooks/model_averager.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>

#include "base/config.h"
#include "base/fingerprint.h"
#include "base/state_bytes.h"
#include "base/topology.h"

namespace collie {

namespace {

std::string rank_of(Communicator& comm) {
  return "rank " + std::to_string(comm.rank());
}

Error invalid(const std::string& msg) {
  return Error(ErrorCode::invalid_argument, msg);
}

// Every rank's 64-bit `value`, in rank order.
std::vector<int64_t> allgather_one(Communicator& comm, uint64_t value) {
  int64_t mine = static_cast<int64_t>(value);
  std::vector<int64_t> all(static_cast<size_t>(comm.size()));
  comm.allgather(view_of(&mine, 1), view_of(all.data(), all.size())).wait();
  return all;
}

}  // namespace

// --- shared pieces --------------------------------------------------------------

void average_parameters(Communicator& comm, const std::vector<TensorView>& params,
                        std::vector<std::vector<uint8_t>>& scratch) {
  std::array<std::vector<size_t>, kNumDTypes> by_dtype;
  for (size_t i = 0; i < params.size(); ++i) {
    const TensorView& p = params[i];
    std::string what =
        "average_parameters on " + rank_of(comm) + ": parameter " + std::to_string(i) + " ";
    // Integer tensors cannot be averaged without truncating; skipping them
    // silently would leave the replicas different, so they are refused.
    if (!is_floating(p.dtype))
      throw invalid(what + "is " + std::string(to_string(p.dtype)) +
                    "; only floating-point parameters can be averaged");
    if (!p.device.is_cpu())
      throw Error(ErrorCode::unavailable,
                  what + "is on " + to_string(p.device) + "; model averaging handles CPU memory");
    if (p.numel > 0 && !p.data) throw invalid(what + "has no data");
    by_dtype[static_cast<size_t>(p.dtype)].push_back(i);
  }
  scratch.resize(kNumDTypes);

  // One all-reduce per dtype, in dtype order (the same on every rank), all
  // started before any is waited for so that they overlap.
  struct Flight {
    size_t dtype;
    Work work;
  };
  std::vector<Flight> flights;
  for (size_t t = 0; t < by_dtype.size(); ++t) {
    const auto& idx = by_dtype[t];
    size_t total = 0;
    for (size_t i : idx) total += params[i].numel;
    if (total == 0) continue;
    if (idx.size() == 1) {  // already contiguous: reduce in place, no copies
      flights.push_back({t, comm.allreduce(params[idx[0]], ReduceOp::avg)});
      continue;
    }
    const DType dt = static_cast<DType>(t);
    auto& buf = scratch[t];
    buf.resize(total * dtype_size(dt));
    size_t at = 0;
    for (size_t i : idx) {
      if (params[i].numel) std::memcpy(buf.data() + at, params[i].data, params[i].nbytes());
      at += params[i].nbytes();
    }
    flights.push_back(
        {t, comm.allreduce(TensorView{buf.data(), dt, total, Device::cpu()}, ReduceOp::avg)});
  }

  // Waits for all of them even after a failure: the ones still running write
  // into `scratch` and the parameters.
  std::vector<Work> works;
  for (const auto& f : flights) works.push_back(f.work);
  wait_all(works);

  for (const auto& f : flights) {
    const auto& idx = by_dtype[f.dtype];
    if (idx.size() == 1) continue;
    const auto& buf = scratch[f.dtype];
    size_t at = 0;
    for (size_t i : idx) {
      if (params[i].numel) std::memcpy(params[i].data, buf.data() + at, params[i].nbytes());
      at += params[i].nbytes();
    }
  }
}

std::vector<int> host_colors(Communicator& comm) {
  std::string host = topology::host_identity(config::hostname_override(config::process_env()));
  auto all = allgather_one(comm, fnv1a(kFnvBasis, host.data(), host.size()));
  std::vector<int> colors(all.size());
  for (size_t r = 0; r < all.size(); ++r) {
    size_t first = 0;
    while (all[first] != all[r]) ++first;
    colors[r] = static_cast<int>(first);
  }
  return colors;
}

int host_color(Communicator& comm) {
  return host_colors(comm)[static_cast<size_t>(comm.rank())];
}

Bytes counter_state(uint64_t count) {
  Bytes b;
  put_u64(b, count);
  return b;
}

uint64_t counter_from_state(const Bytes& state, const std::string& who) {
  if (state.size() != 8)
    throw invalid(who + ": a saved state is 8 bytes (the step count), but was given " +
                  std::to_string(state.size()));
  return StateReader(state, who + ": truncated state").u64();
}

// --- PeriodicModelAverager ---------------------------------------------------

PeriodicModelAverager::PeriodicModelAverager(Communicator& comm, uint64_t period,
                                             uint64_t warmup_steps)
    : comm_(comm), period_(period), warmup_steps_(warmup_steps) {
  if (period == 0)
    throw invalid("PeriodicModelAverager on " + rank_of(comm) +
                  ": period must be at least 1 (the number of steps between averagings), got 0");
}

void PeriodicModelAverager::average_parameters(const std::vector<TensorView>& params) {
  if (step_ >= warmup_steps_ && (step_ - warmup_steps_) % period_ == 0)
    collie::average_parameters(comm_, params, scratch_);
  ++step_;
}

Bytes PeriodicModelAverager::save_state() const {
  return counter_state(step_);
}

void PeriodicModelAverager::load_state(const Bytes& state) {
  step_ = counter_from_state(state, "PeriodicModelAverager on " + rank_of(comm_));
}

// --- HierarchicalModelAverager -------------------------------------------------

HierarchicalModelAverager::HierarchicalModelAverager(Communicator& comm,
                                                     std::vector<AveragingLevel> levels,
                                                     uint64_t warmup_steps)
    : comm_(comm), warmup_steps_(warmup_steps) {
  const int n = comm.size();
  const std::string who = "HierarchicalModelAverager on " + rank_of(comm);
  // Checked before any collective, so that every rank given the same levels
  // fails the same way instead of waiting for the others.
  if (levels.empty())
    throw invalid(who +
                  ": no levels given; pass {period, group_size} pairs, the last with "
                  "group_size = the world size (" +
                  std::to_string(n) + ")");
  for (size_t i = 0; i < levels.size(); ++i) {
    const AveragingLevel& l = levels[i];
    std::string at = who + ": level " + std::to_string(i) + " {period " + std::to_string(l.period) +
                     ", group_size " + std::to_string(l.group_size) + "}";
    if (l.period == 0) throw invalid(at + ": period must be at least 1");
    if (i > 0 && l.period <= levels[i - 1].period)
      throw invalid(at + ": periods must be strictly ascending (the previous level's is " +
                    std::to_string(levels[i - 1].period) + ")");
    if (l.group_size < 0 || l.group_size > n || (l.group_size > 0 && n % l.group_size != 0))
      throw invalid(at + ": group_size must divide the world size " + std::to_string(n) +
                    " (or be 0: the ranks of one host)");
  }
  if (levels.back().group_size != n)
    throw invalid(who +
                  ": the last level (the longest period) must average over every rank: "
                  "its group_size must be the world size " +
                  std::to_string(n) + ", not " + std::to_string(levels.back().group_size));

  // Ranks given different levels would split into groups that do not match;
  // catch that here, naming the rank.
  uint64_t h = fnv1a(kFnvBasis, &warmup_steps, sizeof warmup_steps);
  for (const AveragingLevel& l : levels) {
    h = fnv1a(h, &l.period, sizeof l.period);
    h = fnv1a(h, &l.group_size, sizeof l.group_size);
  }
  if (int q = first_rank_differing(comm, h); q >= 0)
    throw Error(ErrorCode::mismatch, who + ": rank " + std::to_string(q) +
                                         " was given other levels or warmup_steps than rank 0; "
                                         "every rank must build the same hierarchy");

  std::vector<int> hosts;
  for (const AveragingLevel& l : levels)
    if (l.group_size == 0 && hosts.empty()) hosts = host_colors(comm);

  // Every rank splits for every level below the top, in level order, so the
  // splits (collectives) match up across ranks.
  for (const AveragingLevel& l : levels) {
    Level lv{l.period, nullptr, nullptr};
    if (l.group_size == n) {
      lv.comm = &comm;
    } else {
      std::vector<int> colors(static_cast<size_t>(n));
      for (int q = 0; q < n; ++q)
        colors[static_cast<size_t>(q)] =
            l.group_size == 0 ? hosts[static_cast<size_t>(q)] : q / l.group_size;
      const int mine = colors[static_cast<size_t>(comm.rank())];
      int members = 0;
      for (int c : colors) members += c == mine;
      // A rank alone in its group joins no communicator: averaging over one
      // rank is the identity.
      lv.owned = comm.split(members > 1 ? mine : -1, comm.rank());
      lv.comm = lv.owned.get();
    }
    levels_.push_back(std::move(lv));
  }
}

HierarchicalModelAverager::~HierarchicalModelAverager() = default;

int HierarchicalModelAverager::group_size(size_t level) const {
  if (level >= levels_.size())
    throw invalid("HierarchicalModelAverager: no level " + std::to_string(level) + " (there are " +
                  std::to_string(levels_.size()) + ")");
  return levels_[level].comm ? levels_[level].comm->size() : 1;
}

void HierarchicalModelAverager::average_parameters(const std::vector<TensorView>& params) {
  if (step_ >= warmup_steps_) {
    for (size_t i = levels_.size(); i-- > 0;) {
      if (step_ % levels_[i].period != 0) continue;
      if (levels_[i].comm) collie::average_parameters(*levels_[i].comm, params, scratch_);
      break;
    }
  }
  ++step_;
}

Bytes HierarchicalModelAverager::save_state() const {
  return counter_state(step_);
}

void HierarchicalModelAverager::load_state(const Bytes& state) {
  step_ = counter_from_state(state, "HierarchicalModelAverager on " + rank_of(comm_));
}

}  // namespace collie
