// hooks/post_local_sgd.cc: the post_local_sgd comm hook (see post_local_sgd.h).
#include "hooks/post_local_sgd.h"

#include <atomic>
#include <charconv>
#include <limits>

#include "base/fingerprint.h"
#include "hooks/model_averager.h"

namespace collie {

namespace {

constexpr const char* kName = "post_local_sgd";

Error bad_param(const std::string& msg) {
  return Error(ErrorCode::invalid_argument, std::string("comm hook: ") + kName + ": " + msg);
}

// Where gradients go once local SGD has started.
struct Subgroup {
  enum class Kind { host, none, ranks } kind = Kind::host;
  int ranks = 0;  // group size, for Kind::ranks

  std::string text() const {
    switch (kind) {
      case Kind::host:
        return "host";
      case Kind::none:
        return "none";
      case Kind::ranks:
        return std::to_string(ranks);
    }
    return "";
  }
};

Subgroup parse_subgroup(const HookParams& p) {
  Subgroup s;
  auto it = p.find("subgroup");
  if (it == p.end() || it->second == "host") return s;
  const std::string& v = it->second;
  if (v == "none") {
    s.kind = Subgroup::Kind::none;
    return s;
  }
  int k = 0;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), k);
  if (v.empty() || ec != std::errc() || end != v.data() + v.size() || k < 1)
    throw bad_param("subgroup='" + v +
                    "' is not accepted; write subgroup=host (the ranks of each host, the "
                    "default), subgroup=none (no gradient communication after start_iter) or "
                    "subgroup=K (consecutive groups of K ranks, K >= 1 dividing the world size)");
  s.kind = Subgroup::Kind::ranks;
  s.ranks = k;
  return s;
}

class PostLocalSgdHook final : public CommHook {
 public:
  PostLocalSgdHook(uint64_t start_iter, Subgroup subgroup)
      : start_iter_(start_iter), subgroup_(subgroup) {}

  std::string name() const override {
    return std::string(kName) + ":start_iter=" + std::to_string(start_iter_) +
           ",subgroup=" + subgroup_.text();
  }

  Work run(Communicator& comm, GradBucket& b) override {
    // Every rank's first run() is bucket 0 of its first iteration, the same
    // point in every rank's sequence of collectives: the place to split.
    if (!parent_) {
      make_subgroup(comm);
      parent_ = &comm;
    }
    if (&comm != parent_)
      throw Error(ErrorCode::invalid_argument,
                  "comm hook " + name() + " on rank " + std::to_string(comm.rank()) +
                      ": run over another communicator than the one its subgroup was split "
                      "from; give each reducer its own hook");
    // Decided before counting, so that every bucket of one iteration goes the
    // same way (PyTorch's PostLocalSGDState.maybe_increase_iter). Unlike
    // PyTorch the count goes on past start_iter: the saved state then says
    // how far the job got, and the decision is the same.
    const bool global = iter_.load() < start_iter_;
    if (b.is_last) iter_.fetch_add(1);
    if (global) {
      count_bytes(b.buffer.nbytes());
      return comm.allreduce(b.buffer, ReduceOp::avg);
    }
    // subgroup=none, or a group of this rank alone: the bucket already holds
    // the average over the group.
    if (!group_) return Work();
    count_bytes(b.buffer.nbytes());
    return group_->allreduce(b.buffer, ReduceOp::avg);
  }

  Bytes save_state() const override { return counter_state(iter_.load()); }
  void load_state(const Bytes& state) override {
    iter_.store(counter_from_state(state, "comm hook " + name()));
  }

 private:
  void make_subgroup(Communicator& comm) {
    const int n = comm.size(), r = comm.rank();
    const std::string who = "comm hook " + name() + " on rank " + std::to_string(r);
    // Checked before any collective: every rank sees the same world size and
    // so fails here together instead of waiting for the others.
    if (subgroup_.kind == Subgroup::Kind::ranks && (subgroup_.ranks > n || n % subgroup_.ranks))
      throw bad_param("subgroup=" + subgroup_.text() + " must divide the world size " +
                      std::to_string(n) + " (on rank " + std::to_string(r) +
                      "); use a divisor of it, host or none");
    if (n == 1) {
      group_ = &comm;
      return;
    }

    // Ranks with other settings would switch at other iterations or split
    // into groups that do not match: a silent divergence. Name the rank.
    std::string mine = name();
    if (int q = first_rank_differing(comm, fnv1a(kFnvBasis, mine.data(), mine.size())); q >= 0)
      throw Error(ErrorCode::mismatch, who + ": rank " + std::to_string(q) +
                                           " runs post_local_sgd with other parameters than "
                                           "rank 0; every rank must use the same hook spec");

    if (subgroup_.kind == Subgroup::Kind::none) return;
    std::vector<int> colors(static_cast<size_t>(n));
    if (subgroup_.kind == Subgroup::Kind::host) {
      colors = host_colors(comm);
    } else {
      for (int q = 0; q < n; ++q) colors[static_cast<size_t>(q)] = q / subgroup_.ranks;
    }
    const int color = colors[static_cast<size_t>(r)];
    int members = 0;
    bool one_group = true;
    for (int c : colors) {
      members += c == color;
      one_group = one_group && c == colors[0];
    }
    // One group of everyone: the communicator itself, no second mesh. Every
    // rank reaches the same answer, so either all split or none does.
    if (one_group) {
      group_ = &comm;
      return;
    }
    // A rank alone in its group joins no communicator (color -1).
    owned_ = comm.split(members > 1 ? color : -1, r);
    group_ = owned_.get();
  }

  const uint64_t start_iter_;
  const Subgroup subgroup_;
  std::atomic<uint64_t> iter_{0};
  Communicator* parent_ = nullptr;       // what run() was first called with
  Communicator* group_ = nullptr;        // where gradients go after start_iter
  std::unique_ptr<Communicator> owned_;  // the split-off group, when there is one
};

}  // namespace

std::unique_ptr<CommHook> make_post_local_sgd_hook(const HookParams& params) {
  // PyTorch's PostLocalSGDState requires start_localSGD_iter; 100 here, so
  // that a spec without it still warms up with global averaging.
  int64_t start =
      hook_param_int(params, kName, "start_iter", 100, 0, std::numeric_limits<int64_t>::max());
  return std::make_unique<PostLocalSgdHook>(static_cast<uint64_t>(start), parse_subgroup(params));
}

}  // namespace collie
