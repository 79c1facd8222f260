// reducer/reducer_state.cc: a reducer's state for a checkpoint (its step,
// its bucket layout, its hook's state), saved and loaded, with every rank
// made to load the same step.
#include <string>
#include <vector>

#include "base/fingerprint.h"
#include "base/log.h"
#include "base/state_bytes.h"
#include "reducer/reducer.h"

namespace collie {

namespace {
constexpr uint64_t kReducerMagic = 0x3154534552444352ull;  // "RCDREST1"
}  // namespace

Bytes Reducer::save_state() {
  std::lock_guard lk(mu_);
  if (in_backward_) throw misuse("save_state in the middle of a backward pass");
  Bytes out;
  put_u64(out, kReducerMagic);
  put_u64(out, params_.size());
  put_u64(out, iteration_);
  put_u64(out, rebuilt_);
  put_u64(out, bucket_order_.size());
  for (size_t p : bucket_order_) put_u64(out, p);
  Bytes hook = hook_->save_state();
  put_u64(out, hook.size());
  out.insert(out.end(), hook.begin(), hook.end());
  return out;
}

Bytes Reducer::handoff_state(Communicator& comm, Reducer* mine, int root) {
  const bool at_root = comm.rank() == root;
  if (at_root && !mine)
    throw Error(ErrorCode::invalid_argument,
                "handoff_state on rank " + std::to_string(root) +
                    ": the rank that hands its reducer's state to the others has no reducer");
  Bytes own = mine ? mine->save_state() : Bytes{};
  // Survivors that failed in different collectives (a rank that died in
  // the middle of one gave its part to some and not to others) may have
  // finished different iterations: then rank `root`'s state stands for
  // every rank, as its parameters do (the new reducer broadcasts them).
  const size_t n = static_cast<size_t>(comm.size());
  int64_t done = mine ? static_cast<int64_t>(mine->iterations()) : -1;
  std::vector<int64_t> all(n);
  comm.allgather(view_of(&done, 1), view_of(all.data(), n)).wait();
  bool agree = true;
  for (int64_t d : all) agree = agree && (d < 0 || d == all[static_cast<size_t>(root)]);
  int64_t bytes = at_root ? static_cast<int64_t>(own.size()) : 0;
  comm.broadcast(view_of(&bytes, 1), root).wait();
  Bytes theirs(at_root ? 0 : static_cast<size_t>(bytes));
  Bytes& moved = at_root ? own : theirs;
  comm.broadcast(view_of(moved.data(), moved.size()), root).wait();
  if (!agree && at_root)
    log::warn("handoff_state: the ranks had finished different iterations (" +
              [&] {
                std::string s;
                for (size_t q = 0; q < n; ++q)
                  if (all[q] >= 0)
                    s += (s.empty() ? "rank " : ", rank ") + std::to_string(q) + ": " +
                         std::to_string(all[q]);
                return s;
              }() +
              "): every rank goes on from rank " + std::to_string(root) + "'s");
  if (at_root) return own;
  return mine && agree ? own : theirs;
}

void Reducer::load_state(const Bytes& in) {
  std::lock_guard lk(mu_);
  if (in_backward_) throw misuse("load_state in the middle of a backward pass");
  StateReader r(in, misuse("the state to load is truncated").what());
  if (in.size() < 8 || r.u64() != kReducerMagic)
    throw misuse("the state to load is not a reducer's");
  uint64_t n = r.u64();
  if (n != params_.size())
    throw misuse("the state was saved by a reducer over " + std::to_string(n) +
                 " parameters; this one has " + std::to_string(params_.size()));
  uint64_t iteration = r.u64();
  bool rebuilt = r.u64() != 0;
  uint64_t count = r.u64();
  if (count != 0 && count != n)
    throw misuse("the saved bucket order does not cover the parameters");
  std::vector<size_t> order;
  std::vector<bool> seen(n, false);
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t p = r.u64();
    if (p >= n || seen[p])
      throw misuse("the saved bucket order is not a permutation of the parameters");
    seen[p] = true;
    order.push_back(p);
  }
  uint64_t hook_size = r.u64();
  if (hook_size != r.remaining()) throw misuse("the saved hook state is truncated");
  // Collective: every rank must resume from the same step with the same
  // layout, or their buckets (and the collectives) would not match.
  uint64_t h = fnv_mix(fnv_mix(kFnvBasis, iteration), rebuilt);
  for (size_t p : order) h = fnv_mix(h, p);
  if (int q = first_rank_differing(comm_, h); q >= 0)
    throw Error(ErrorCode::mismatch,
                "reducer on rank " + std::to_string(comm_.rank()) + ": rank " + std::to_string(q) +
                    " loads a state saved at another step or with another bucket layout than rank "
                    "0's: every rank must load the checkpoint it saved at the same step");
  hook_->load_state(r.rest());
  if (order != bucket_order_) apply_order(order);
  expected_.clear();  // the next iteration learns the arrivals again
  iteration_ = iteration;
  rebuilt_ = rebuilt;
}

}  // namespace collie
