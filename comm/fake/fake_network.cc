// comm/fake/fake_network.cc: the in-process network: queues of posted
// sends and receives per pair of ranks, matched in posting order under one
// lock, completions handed back to each rank's own thread.
#include "comm/fake/fake_network.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <random>

#include "collie/error.h"

namespace collie::fake {

namespace {

struct Item {
  int owner = -1;
  int peer = -1;
  bool is_send = false;
  OpDesc desc;
  const void* src = nullptr;
  void* dst = nullptr;
  size_t bytes = 0;
  Transport::Callback cb;
};
using ItemPtr = std::shared_ptr<Item>;

std::string rank_str(int r) {
  return "rank " + std::to_string(r);
}

// A copy of `e` that shares nothing with it. std::runtime_error's copies
// share one reference-counted message, counted inside libstdc++ where
// ThreadSanitizer cannot see it; errors that pass between the ranks'
// threads are copied this way, under the network's lock.
Error deep(const Error& e) {
  return Error(e.code(), std::string(e.what()));
}

}  // namespace

struct FakeNetwork::State {
  State(int n, FakeOptions o)
      : cv(n),
        n(n),
        opt(o),
        sends(n, std::vector<std::deque<ItemPtr>>(n)),
        recvs(n, std::vector<std::deque<ItemPtr>>(n)),
        ready(n),
        pending(n, 0),
        posts(n, 0),
        dead(n, false),
        closed(n, false),
        woken(n, false),
        failed(n),
        aborted(n) {
    for (int r = 0; r < n; ++r) rng.emplace_back(o.seed * 7919 + r);
  }

  std::mutex mu;
  std::vector<std::condition_variable> cv;  // [rank]: something for that rank changed
  const int n;
  const FakeOptions opt;
  std::vector<std::vector<std::deque<ItemPtr>>> sends;  // [src][dst], not yet matched
  std::vector<std::vector<std::deque<ItemPtr>>> recvs;  // [dst][src], not yet matched
  std::vector<std::vector<ItemPtr>> ready;              // [rank] completed, callback not run
  std::vector<size_t> pending;                          // [rank] posted, callback not run
  std::vector<size_t> posts;
  std::vector<bool> dead;
  std::vector<bool> closed;                  // said goodbye (FakeNetwork::close)
  std::vector<bool> woken;                   // FakeNetwork::wake since the rank last looked
  std::vector<std::optional<Error>> failed;  // set by a peer: this rank's next run() throws it
  std::vector<std::optional<Error>>
      aborted;  // what a rank threw (its peers are told, as TCP's abort frames tell them)
  std::vector<std::mt19937_64> rng;

  // Matches queued sends from src to dst with dst's receives, in order.
  void match(int src, int dst) {
    auto& sq = sends[src][dst];
    auto& rq = recvs[dst][src];
    while (!sq.empty() && !rq.empty()) {
      ItemPtr s = sq.front(), r = rq.front();
      const bool same_op = s->desc.describe() == r->desc.describe();
      if (!same_op || s->bytes != r->bytes) {
        const std::string mine = r->desc.describe() + " on " + rank_str(dst);
        Error e = same_op
                      ? Error(ErrorCode::mismatch, mine + ": " + rank_str(src) + " sent " +
                                                       std::to_string(s->bytes) + " bytes where " +
                                                       std::to_string(r->bytes) + " were expected")
                      : collective_mismatch(mine, rank_str(src), s->desc);
        const std::string what = e.what();
        if (!failed[dst]) failed[dst] = deep(e);
        if (!failed[src])
          failed[src] = Error(ErrorCode::mismatch, rank_str(dst) + " aborted: " + what);
        wake_all();
        return;
      }
      sq.pop_front();
      rq.pop_front();
      if (s->bytes) std::memcpy(r->dst, s->src, s->bytes);
      ready[src].push_back(s);
      ready[dst].push_back(r);
      cv[src].notify_one();
      cv[dst].notify_one();
    }
  }

  // Drops everything `rank` posted that is still unmatched or unreported.
  void purge(int rank) {
    for (int q = 0; q < n; ++q) {
      sends[rank][q].clear();
      recvs[rank][q].clear();
    }
    ready[rank].clear();
    pending[rank] = 0;
  }

  void vanish(int rank) {
    dead[rank] = true;
    purge(rank);
    wake_all();
  }

  void wake_all() {
    for (auto& c : cv) c.notify_one();
  }
};

namespace {

class FakeTransport final : public Transport {
 public:
  FakeTransport(std::shared_ptr<FakeNetwork::State> s, int rank) : s_(std::move(s)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return s_->n; }

  void post_send(const OpDesc& d, int peer, const void* data, size_t bytes,
                 Callback on_done) override {
    post(true, d, peer, const_cast<void*>(data), bytes, std::move(on_done));
  }
  void post_recv(const OpDesc& d, int peer, void* data, size_t bytes, Callback on_done) override {
    post(false, d, peer, data, bytes, std::move(on_done));
  }

  void run(Deadline deadline, const std::function<bool()>& idle) override {
    FakeNetwork::State& s = *s_;
    std::unique_lock lk(s.mu);
    // Whatever ends this rank's run in error also tells the others.
    auto fail = [&](const Error& e) {
      s.aborted[rank_] = deep(e);
      s.purge(rank_);
      s.wake_all();
      throw e;
    };
    for (;;) {
      if (s.dead[rank_]) throw Vanished();
      if (s.failed[rank_]) fail(deep(*s.failed[rank_]));
      auto& rd = s.ready[rank_];
      if (!rd.empty()) {
        size_t pick = 0;
        if (s.opt.shuffle) {
          // Any completion may come first; sends tend to be reported late.
          pick = s.rng[rank_]() % rd.size();
          if (rd[pick]->is_send && s.rng[rank_]() % 4 != 0) {
            for (size_t i = 0; i < rd.size(); ++i)
              if (!rd[i]->is_send) pick = i;
          }
        }
        ItemPtr it = rd[pick];
        rd.erase(rd.begin() + static_cast<long>(pick));
        --s.pending[rank_];
        lk.unlock();
        if (it->cb) it->cb();
        lk.lock();
        continue;
      }
      s.woken[rank_] = false;
      if (idle) {
        lk.unlock();
        bool more = idle();
        lk.lock();
        if (more) continue;
      }
      if (s.pending[rank_] == 0) return;
      // A vanished rank fails every waiter (as a killed process's closed
      // sockets do); an abort comes next (a rank that aborted and then
      // closed is known by its abort, which TCP's abort frame tells before
      // the socket closes); one that said goodbye fails only those it owes.
      auto lost = [&](int q, const char* how) {
        fail(Error(ErrorCode::peer_lost, current_.describe() + " on " + rank_str(rank_) +
                                             ": lost " + rank_str(q) + " (" + how + ")"));
      };
      for (int q = 0; q < s.n; ++q)
        if (s.dead[q]) lost(q, "it vanished");
      for (int q = 0; q < s.n; ++q)
        if (q != rank_ && s.aborted[q])
          fail(Error(s.aborted[q]->code(),
                     rank_str(q) + " aborted the communicator: " + s.aborted[q]->what()));
      auto owes = [&](int q) { return !s.sends[rank_][q].empty() || !s.recvs[rank_][q].empty(); };
      for (int q = 0; q < s.n; ++q)
        if (s.closed[q] && owes(q)) lost(q, "it closed its communicator");
      // idle() ran without the lock: what completed meanwhile is in ready,
      // and its notification came while nobody waited.
      if (s.woken[rank_] || !s.ready[rank_].empty()) continue;
      if (s.cv[rank_].wait_until(lk, deadline) == std::cv_status::timeout &&
          s.ready[rank_].empty() && !s.failed[rank_]) {
        std::string who;
        for (int q = 0; q < s.n && who.empty(); ++q)
          if (!s.recvs[rank_][q].empty()) who = "waiting for " + rank_str(q) + " to send";
        for (int q = 0; q < s.n && who.empty(); ++q)
          if (!s.sends[rank_][q].empty()) who = "waiting for " + rank_str(q) + " to receive";
        fail(Error(ErrorCode::timeout,
                   current_.describe() + " on " + rank_str(rank_) + " timed out " + who));
      }
    }
  }

 private:
  void post(bool is_send, const OpDesc& d, int peer, void* data, size_t bytes, Callback cb) {
    FakeNetwork::State& s = *s_;
    std::lock_guard lk(s.mu);
    if (s.dead[rank_]) throw Vanished();
    if (peer < 0 || peer >= s.n || peer == rank_)
      throw Error(ErrorCode::internal, "fake transport: bad peer " + std::to_string(peer));
    if (++s.posts[rank_] == s.opt.vanish_after_posts && rank_ == s.opt.vanish_rank) {
      s.vanish(rank_);
      throw Vanished();
    }
    current_ = d;
    auto it = std::make_shared<Item>();
    it->owner = rank_;
    it->peer = peer;
    it->is_send = is_send;
    it->desc = d;
    it->bytes = bytes;
    it->cb = std::move(cb);
    ++s.pending[rank_];
    if (is_send) {
      it->src = data;
      s.sends[rank_][peer].push_back(std::move(it));
      s.match(rank_, peer);
    } else {
      it->dst = data;
      s.recvs[rank_][peer].push_back(std::move(it));
      s.match(peer, rank_);
    }
  }

  std::shared_ptr<FakeNetwork::State> s_;
  const int rank_;
  OpDesc current_;
};

}  // namespace

FakeNetwork::FakeNetwork(int n, FakeOptions options) : s_(std::make_shared<State>(n, options)) {
  for (int r = 0; r < n; ++r) endpoints_.push_back(std::make_unique<FakeTransport>(s_, r));
}

FakeNetwork::~FakeNetwork() = default;

int FakeNetwork::size() const {
  return s_->n;
}

Transport& FakeNetwork::endpoint(int rank) {
  return *endpoints_.at(rank);
}

void FakeNetwork::abort(int rank, const Error& e) {
  std::lock_guard lk(s_->mu);
  if (!s_->failed[rank]) s_->failed[rank] = deep(e);
  if (!s_->aborted[rank]) s_->aborted[rank] = deep(e);
  s_->purge(rank);
  s_->wake_all();
}

void FakeNetwork::wake(int rank) {
  std::lock_guard lk(s_->mu);
  s_->woken[rank] = true;
  s_->cv[rank].notify_one();
}

std::vector<int> FakeNetwork::gone() const {
  std::lock_guard lk(s_->mu);
  std::vector<int> out;
  for (int q = 0; q < s_->n; ++q)
    if (s_->dead[q] || s_->closed[q]) out.push_back(q);
  return out;
}

void FakeNetwork::close(int rank) {
  std::lock_guard lk(s_->mu);
  s_->closed[rank] = true;
  s_->purge(rank);
  s_->wake_all();
}

}  // namespace collie::fake
