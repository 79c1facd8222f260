#include "comm/tcp/tcp_backend.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "comm/core/log.h"
#include "comm/core/reduce.h"
#include "comm/core/topology.h"
#include "comm/core/validate.h"
#include "comm/net/socket.h"
#include "comm/tcp/algorithm.h"
#include "comm/tcp/collectives.h"
#include "comm/tcp/tcp_mesh.h"

namespace collie::tcp {

namespace {

using std::chrono::milliseconds;

// The first bytes on every mesh connection: who is calling, for which
// communicator, with which secret. Fixed size so that a stray client's
// garbage is read in one bounded piece and refused.
struct Hello {
  uint32_t magic;
  uint32_t version;
  int32_t from;
  int32_t to;
  char key[112];
  char secret[128];
};
static_assert(sizeof(Hello) == 256);
constexpr uint32_t kHelloMagic = 0x434c4c48;  // "CLLH"
constexpr uint32_t kVersion = 1;
constexpr char kAck[4] = {'c', 'o', 'k', '1'};

Hello make_hello(int from, int to, const std::string& key, const std::string& secret) {
  Hello h{};
  h.magic = kHelloMagic;
  h.version = kVersion;
  h.from = from;
  h.to = to;
  std::strncpy(h.key, key.c_str(), sizeof h.key - 1);
  std::strncpy(h.secret, secret.c_str(), sizeof h.secret - 1);
  return h;
}

std::string rank_str(int r) {
  return "rank " + std::to_string(r);
}

std::string seconds(milliseconds ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", ms.count() / 1000.0);
  return buf;
}

std::string join_ranks(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}

// Builds the full mesh: connect to lower ranks, accept higher ones.
std::vector<net::Fd> build_mesh(const Setup& s) {
  const int rank = s.launch.rank, n = s.launch.world_size;
  auto deadline = net::deadline_after(s.launch.timeout);
  std::string who = rank_str(rank);
  std::vector<net::Fd> peers(n);

  net::Fd listener = net::listen_tcp(s.listen_host, 0, who + ": mesh listener");
  std::string addr = net::Endpoint{s.listen_host.empty() ? "127.0.0.1" : s.listen_host,
                                   net::local_port(listener.get())}
                         .str();
  s.store->set(s.key + "/addr/" + std::to_string(rank), to_bytes(addr));

  // Wait until every rank has published its address. The wait goes in
  // slices, noting who has arrived after each, so that a timeout can name the
  // missing ranks without asking the store again: by then rank 0, timing out
  // too, may have taken the store down with it.
  std::vector<std::string> keys;
  for (int q = 0; q < n; ++q) keys.push_back(s.key + "/addr/" + std::to_string(q));
  std::vector<bool> seen(n, false);
  seen[rank] = true;
  auto missing_ranks = [&] {
    std::vector<int> missing;
    for (int q = 0; q < n; ++q)
      if (!seen[q]) missing.push_back(q);
    return (missing.size() > 1 ? "ranks " : "rank ") + join_ranks(missing) + " of " +
           std::to_string(n) + " never joined";
  };
  for (;;) {
    std::vector<std::string> missing_keys;
    for (int q = 0; q < n; ++q)
      if (!seen[q]) missing_keys.push_back(keys[q]);
    if (missing_keys.empty()) break;
    auto left = std::chrono::duration_cast<milliseconds>(deadline - net::Clock::now());
    if (left.count() <= 0)
      throw Error(ErrorCode::timeout,
                  "rendezvous timed out on " + who + " after " + seconds(s.launch.timeout) + ": " +
                      missing_ranks() +
                      " (not started, crashed before connecting, or pointed at another "
                      "MASTER_ADDR/MASTER_PORT)");
    try {
      s.store->wait(missing_keys, std::min(left, milliseconds(1000)));
      for (int q = 0; q < n; ++q) seen[q] = true;
    } catch (const Error& e) {
      if (e.code() == ErrorCode::peer_lost)
        throw Error(ErrorCode::peer_lost, "rendezvous on " + who +
                                              " lost the store that rank 0 serves (rank 0 exited, "
                                              "perhaps at its own deadline) while " +
                                              missing_ranks() + ": " + e.what());
      if (e.code() != ErrorCode::timeout) throw;
      try {
        for (int q = 0; q < n; ++q)
          if (!seen[q]) seen[q] = s.store->check({keys[q]});
      } catch (const Error&) {
        // The store went away: the next round reports the timeout or the loss.
      }
    }
  }

  for (int q = 0; q < rank; ++q) {
    auto ep =
        net::parse_endpoint(collie::to_string(s.store->get(keys[q])), "address of " + rank_str(q));
    std::string what = who + ": connecting to " + rank_str(q) + " at " + ep.str();
    net::Fd fd = net::connect_tcp(ep, deadline, what);
    Hello h = make_hello(rank, q, s.key, s.launch.secret);
    net::write_full(fd.get(), &h, sizeof h, deadline, what);
    char ack[4];
    try {
      net::read_full(fd.get(), ack, 4, deadline, what);
    } catch (const Error& e) {
      if (e.code() != ErrorCode::peer_lost) throw;
      throw Error(ErrorCode::invalid_argument,
                  what +
                      ": it refused the connection (its COLLIE_JOB_SECRET differs, or another "
                      "job is listening at that address)");
    }
    if (std::memcmp(ack, kAck, 4) != 0)
      throw Error(ErrorCode::mismatch, what + ": it answered with something that is not collie");
    peers[q] = std::move(fd);
  }

  // Accept the higher ranks. Connections are read without blocking, each
  // with its own short handshake deadline, so a stray client that sends
  // nothing or garbage is dropped without holding up the real peers.
  struct Pending {
    net::Fd fd;
    Hello hello{};
    size_t got = 0;
    net::Deadline deadline;
  };
  std::vector<Pending> pending;
  int waiting_for = n - 1 - rank;
  net::set_nonblocking(listener.get(), true);
  while (waiting_for > 0) {
    std::vector<pollfd> pfds{{listener.get(), POLLIN, 0}};
    for (auto& p : pending) pfds.push_back({p.fd.get(), POLLIN, 0});
    net::Deadline wake = deadline;
    for (auto& p : pending) wake = std::min(wake, p.deadline);
    int r = ::poll(pfds.data(), pfds.size(), net::poll_timeout_ms(wake));
    if (r < 0 && errno != EINTR) throw system_error(ErrorCode::internal, who + ": poll", errno);
    auto now = net::Clock::now();
    if (now >= deadline) {
      std::vector<int> missing;
      for (int q = rank + 1; q < n; ++q)
        if (!peers[q].valid()) missing.push_back(q);
      throw Error(ErrorCode::timeout, who + ": rendezvous timed out waiting for rank" +
                                          (missing.size() > 1 ? "s " : " ") + join_ranks(missing) +
                                          " to connect");
    }
    if (pfds[0].revents & POLLIN) {
      int fd = ::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd >= 0)
        pending.push_back({net::Fd(fd), {}, 0, std::min(deadline, now + std::chrono::seconds(10))});
    }
    for (size_t i = 0; i < pending.size();) {
      Pending& p = pending[i];
      bool drop = now >= p.deadline;
      if (!drop && (pfds.size() > i + 1 && pfds[i + 1].revents)) {
        ssize_t got = ::recv(p.fd.get(), reinterpret_cast<char*>(&p.hello) + p.got,
                             sizeof(Hello) - p.got, MSG_DONTWAIT);
        if (got > 0)
          p.got += static_cast<size_t>(got);
        else if (got == 0 || (errno != EAGAIN && errno != EINTR))
          drop = true;
      }
      if (!drop && p.got == sizeof(Hello)) {
        const Hello& h = p.hello;
        bool ok = h.magic == kHelloMagic && h.version == kVersion && h.to == rank &&
                  h.from > rank && h.from < n && !peers[h.from].valid() &&
                  std::string(h.key, strnlen(h.key, sizeof h.key)) == s.key &&
                  net::equal_secret(std::string(h.secret, strnlen(h.secret, sizeof h.secret)),
                                    s.launch.secret.substr(0, sizeof h.secret - 1));
        if (ok) {
          net::set_nonblocking(p.fd.get(), false);
          net::write_full(p.fd.get(), kAck, 4, deadline, who + ": answering " + rank_str(h.from));
          net::set_nodelay(p.fd.get());
          peers[h.from] = std::move(p.fd);
          --waiting_for;
        } else {
          log::warn(who + ": refused a connection from " + net::peer_host(p.fd.get()) +
                    " that did not present this job's secret and communicator");
        }
        drop = true;
      }
      if (drop) {
        pending.erase(pending.begin() + static_cast<long>(i));
        pfds.erase(pfds.begin() + static_cast<long>(i) + 1);
      } else {
        ++i;
      }
    }
  }
  return peers;
}

struct Task {
  Work work;
  OpDesc desc;
  std::function<void(const OpDesc&, net::Deadline)> run;  // collectives
  bool p2p = false;
  bool is_send = false;
  TensorView buf{};
  int peer = -1;
};

class TcpCommunicator;

// Everything an operation touches, shared with the Work handles' inline
// runners through a weak pointer so that a handle outliving its
// communicator is harmless.
class Engine : public std::enable_shared_from_this<Engine> {
 public:
  Engine(Setup s, std::vector<net::Fd> peers, bool spin_allowed)
      : setup(std::move(s)),
        mesh(setup.launch.rank, setup.launch.world_size, std::move(peers), setup.tuning,
             spin_allowed),
        send_seq(static_cast<size_t>(setup.launch.world_size), 0),
        recv_seq(static_cast<size_t>(setup.launch.world_size), 0),
        wake_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    mesh.set_wake_fd(wake_.get());
  }

  void start() {
    thread_ = std::thread([self = shared_from_this()] { self->loop(); });
  }

  Work submit(Task t) {
    Work w;
    {
      std::lock_guard lk(mu_);
      if (!t.p2p) t.desc.seq = ++coll_seq_;
      // A waiter gives up only after the op's own deadline (and that of one
      // op ahead of it) has passed, so the op's error, which says what it
      // was waiting for, arrives first.
      t.work = Work::pending(t.desc.describe() + " on " + rank_str(setup.launch.rank),
                             2 * setup.launch.timeout + std::chrono::seconds(1));
      w = t.work;
      queue_.push_back(std::move(t));
      // A running point-to-point batch takes in later sends and receives;
      // wake its loop if it is asleep in poll().
      if (busy_ && queue_.back().p2p) {
        uint64_t one = 1;
        [[maybe_unused]] ssize_t n = ::write(wake_.get(), &one, sizeof one);
      }
    }
    std::weak_ptr<Engine> weak = weak_from_this();
    w.set_inline_runner([weak, w] {
      auto self = weak.lock();
      return self && self->try_run_inline(w);
    });
    cv_.notify_all();
    return w;
  }

  void shutdown() {
    {
      std::unique_lock lk(mu_);
      stop_ = true;
      cv_.notify_all();
      cv_.wait(lk, [&] { return !busy_; });
    }
    if (thread_.joinable()) thread_.join();
    std::deque<Task> left;
    {
      std::lock_guard lk(mu_);
      left.swap(queue_);
    }
    for (auto& t : left)
      t.work.fail(
          Error(ErrorCode::unavailable, t.desc.describe() + " on " + rank_str(setup.launch.rank) +
                                            " never ran: its communicator was destroyed first"));
    mesh.close();
  }

  Setup setup;
  Mesh mesh;
  Scratch scratch;
  std::vector<uint32_t> send_seq, recv_seq;

 private:
  std::vector<Task> pop_batch() {
    std::vector<Task> batch;
    batch.push_back(std::move(queue_.front()));
    queue_.pop_front();
    // Point-to-point ops issued back to back progress together, so that an
    // exchange written as send-then-receive on both sides cannot deadlock.
    if (batch[0].p2p)
      while (!queue_.empty() && queue_.front().p2p) {
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
    return batch;
  }

  bool try_run_inline(const Work& w) {
    std::vector<Task> batch;
    {
      std::lock_guard lk(mu_);
      if (stop_ || busy_ || queue_.empty() || !(queue_.front().work == w)) return false;
      batch = pop_batch();
      busy_ = true;
    }
    execute_and_release(batch);
    return true;
  }

  void loop() {
    for (;;) {
      std::vector<Task> batch;
      {
        std::unique_lock lk(mu_);
        cv_.wait(lk, [&] { return stop_ || (!busy_ && !queue_.empty()); });
        if (stop_) return;
        batch = pop_batch();
        busy_ = true;
      }
      execute_and_release(batch);
    }
  }

  // Runs a batch taken with busy_ set, then lets the next executor in.
  void execute_and_release(std::vector<Task>& batch) {
    execute(batch);
    {
      std::lock_guard lk(mu_);
      busy_ = false;
    }
    cv_.notify_all();
  }

  void execute(std::vector<Task>& batch) {
    if (broken_) {
      for (auto& t : batch)
        t.work.fail(Error(broken_->code(),
                          t.desc.describe() + " on " + rank_str(setup.launch.rank) +
                              " cannot run: the communicator failed earlier: " + broken_->what()));
      return;
    }
    try {
      auto deadline = net::deadline_after(setup.launch.timeout);
      if (batch[0].p2p)
        run_p2p(batch, deadline);
      else
        batch[0].run(batch[0].desc, deadline);
    } catch (const Error& e) {
      broken_ = e;
      log::info(std::string("communicator failed: ") + e.what());
      mesh.abort(e);
      for (auto& t : batch) t.work.fail(e);
      return;
    } catch (const std::exception& e) {
      Error err(ErrorCode::internal, batch[0].desc.describe() + ": " + e.what());
      broken_ = err;
      mesh.abort(err);
      for (auto& t : batch) t.work.fail(err);
      return;
    }
    for (auto& t : batch) t.work.complete();
  }

  void run_p2p(std::vector<Task>& batch, net::Deadline deadline) {
    std::vector<SendItem> sends;
    std::vector<RecvItem> recvs;
    std::vector<OpDesc> sd, rd;
    auto add = [&](Task& t) {
      OpDesc d = t.desc;
      if (t.is_send) {
        d.seq = ++send_seq[t.peer];
        sends.push_back({t.peer, t.buf.data, t.buf.nbytes(), true});
        sd.push_back(d);
      } else {
        d.seq = ++recv_seq[t.peer];
        recvs.push_back({t.peer, t.buf.data, t.buf.nbytes(), nullptr});
        rd.push_back(d);
      }
    };
    for (auto& t : batch) add(t);
    // Sends and receives issued while this batch runs join it: the classic
    // exchange (send, then receive, on both sides) must not wait for the
    // send to finish before the receive starts.
    Mesh::Refill refill = [&] {
      std::lock_guard lk(mu_);
      while (!queue_.empty() && queue_.front().p2p) {
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
        add(batch.back());
      }
    };
    mesh.run_p2p(sends, sd, recvs, rd, deadline, refill);
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool busy_ = false;
  bool stop_ = false;
  uint32_t coll_seq_ = 0;
  std::optional<Error> broken_;  // touched only by whoever holds busy_
  net::Fd wake_;
  std::thread thread_;
};

class TcpCommunicator final : public Communicator {
 public:
  explicit TcpCommunicator(std::shared_ptr<Engine> e) : e_(std::move(e)) {}
  ~TcpCommunicator() override { e_->shutdown(); }

  int rank() const override { return e_->setup.launch.rank; }
  int size() const override { return e_->setup.launch.world_size; }
  std::string backend() const override { return "tcp"; }
  milliseconds timeout() const override { return e_->setup.launch.timeout; }

  Work allreduce(TensorView in, TensorView out, ReduceOp op) override {
    std::string what = "allreduce on " + rank_str(rank());
    validate::cpu_tensor(in, what, "input");
    validate::cpu_tensor(out, what, "output");
    validate::same_dtype(in, out, what);
    validate::op_on(op, in.dtype, what);
    validate::same_or_disjoint(in, out, what);
    if (in.numel != out.numel)
      throw Error(ErrorCode::invalid_argument, what + ": input has " + std::to_string(in.numel) +
                                                   " elements but output has " +
                                                   std::to_string(out.numel));
    Task t;
    t.desc = {OpKind::allreduce, in.dtype, op, 0, 0, in.numel};
    auto* e = e_.get();
    t.run = [e, in, out, op](const OpDesc& d, net::Deadline dl) {
      int n = e->mesh.size();
      if (n == 1 || in.numel == 0) {
        if (op == ReduceOp::avg)
          kernels::divide(in.dtype, out.data, in.data, in.numel, 1);
        else if (out.data != in.data)
          std::memmove(out.data, in.data, in.nbytes());
        return;
      }
      Ctx c{e->mesh, d, e->setup.tuning.chunk_bytes, e->scratch, dl};
      if (choose_allreduce(in.nbytes(), n, e->setup.tuning) == AllreduceAlgo::ring)
        ring_allreduce(c, in.data, out.data, in.numel, in.dtype, op);
      else
        rd_allreduce(c, in.data, out.data, in.numel, in.dtype, op);
    };
    return e_->submit(std::move(t));
  }

  Work broadcast(TensorView buf, int root) override {
    std::string what = "broadcast on " + rank_str(rank());
    validate::cpu_tensor(buf, what, "buffer");
    validate::rank_in(root, size(), what, "root");
    Task t;
    t.desc = {OpKind::broadcast, buf.dtype, ReduceOp::sum, 0, root, buf.numel};
    auto* e = e_.get();
    t.run = [e, buf, root](const OpDesc& d, net::Deadline dl) {
      int n = e->mesh.size();
      if (n == 1 || buf.numel == 0) return;
      Ctx c{e->mesh, d, e->setup.tuning.chunk_bytes, e->scratch, dl};
      if (choose_broadcast(buf.nbytes(), n, e->setup.tuning) == BroadcastAlgo::chain)
        chain_broadcast(c, buf.data, buf.nbytes(), root);
      else
        tree_broadcast(c, buf.data, buf.nbytes(), root);
    };
    return e_->submit(std::move(t));
  }

  Work allgather(TensorView in, TensorView out) override {
    std::string what = "allgather on " + rank_str(rank());
    validate::cpu_tensor(in, what, "input");
    validate::cpu_tensor(out, what, "output");
    validate::same_dtype(in, out, what);
    if (out.numel != in.numel * static_cast<size_t>(size()))
      throw Error(ErrorCode::invalid_argument,
                  what + ": output has " + std::to_string(out.numel) +
                      " elements; it must hold size() x input = " +
                      std::to_string(in.numel * static_cast<size_t>(size())));
    TensorView mine = out.slice(in.numel * static_cast<size_t>(rank()), in.numel);
    validate::same_or_disjoint(in, mine, what);
    if (in.data != mine.data) validate::same_or_disjoint(in, out, what);
    Task t;
    t.desc = {OpKind::allgather, in.dtype, ReduceOp::sum, 0, 0, in.numel};
    auto* e = e_.get();
    t.run = [e, in, out](const OpDesc& d, net::Deadline dl) {
      Ctx c{e->mesh, d, e->setup.tuning.chunk_bytes, e->scratch, dl};
      ring_allgather(c, in.data, out.data, in.nbytes());
    };
    return e_->submit(std::move(t));
  }

  Work reduce_scatter(TensorView in, TensorView out, ReduceOp op) override {
    std::string what = "reduce_scatter on " + rank_str(rank());
    validate::cpu_tensor(in, what, "input");
    validate::cpu_tensor(out, what, "output");
    validate::same_dtype(in, out, what);
    validate::op_on(op, in.dtype, what);
    if (in.numel != out.numel * static_cast<size_t>(size()))
      throw Error(ErrorCode::invalid_argument,
                  what + ": input has " + std::to_string(in.numel) +
                      " elements; it must hold size() x output = " +
                      std::to_string(out.numel * static_cast<size_t>(size())));
    validate::same_or_disjoint(in.slice(out.numel * static_cast<size_t>(rank()), out.numel), out,
                               what);
    Task t;
    t.desc = {OpKind::reduce_scatter, in.dtype, op, 0, 0, out.numel};
    auto* e = e_.get();
    t.run = [e, in, out, op](const OpDesc& d, net::Deadline dl) {
      Ctx c{e->mesh, d, e->setup.tuning.chunk_bytes, e->scratch, dl};
      ring_reduce_scatter(c, in.data, out.data, out.numel, in.dtype, op);
    };
    return e_->submit(std::move(t));
  }

  Work barrier() override {
    Task t;
    t.desc = {OpKind::barrier, DType::u8, ReduceOp::sum, 0, 0, 1};
    auto* e = e_.get();
    t.run = [e](const OpDesc& d, net::Deadline dl) {
      Ctx c{e->mesh, d, e->setup.tuning.chunk_bytes, e->scratch, dl};
      dissemination_barrier(c);
    };
    return e_->submit(std::move(t));
  }

  Work send(TensorView buf, int peer, int tag) override { return p2p(buf, peer, tag, true); }
  Work recv(TensorView buf, int peer, int tag) override { return p2p(buf, peer, tag, false); }

  std::unique_ptr<Communicator> split(int color, int key) override {
    int n = size();
    std::vector<int64_t> mine{color, key}, all(2 * static_cast<size_t>(n));
    allgather(view_of(mine.data(), 2), view_of(all.data(), all.size())).wait();
    int split_no = ++splits_;
    if (color < 0) return nullptr;
    std::vector<std::pair<int64_t, int>> members;
    for (int q = 0; q < n; ++q)
      if (all[2 * q] == color) members.push_back({all[2 * q + 1], q});
    std::sort(members.begin(), members.end());
    int new_rank = 0;
    for (size_t i = 0; i < members.size(); ++i)
      if (members[i].second == rank()) new_rank = static_cast<int>(i);
    Setup s = e_->setup;
    s.launch.rank = new_rank;
    s.launch.world_size = static_cast<int>(members.size());
    s.key = e_->setup.key + "/s" + std::to_string(split_no) + "c" + std::to_string(color);
    return make_tcp_communicator(std::move(s));
  }

 private:
  Work p2p(TensorView buf, int peer, int tag, bool is_send) {
    std::string what = std::string(is_send ? "send" : "recv") + " on " + rank_str(rank());
    validate::cpu_tensor(buf, what, "buffer");
    validate::rank_in(peer, size(), what, "peer");
    if (peer == rank())
      throw Error(ErrorCode::invalid_argument, what + ": peer is this rank itself");
    Task t;
    t.p2p = true;
    t.is_send = is_send;
    t.buf = buf;
    t.peer = peer;
    t.desc = {OpKind::p2p, buf.dtype, ReduceOp::sum, 0, tag, buf.numel};
    return e_->submit(std::move(t));
  }

  std::shared_ptr<Engine> e_;
  int splits_ = 0;
};

bool ranks_fit_cores(const config::Launch& l) {
  return l.local_world_size <= topology::usable_cpus();
}

}  // namespace

std::unique_ptr<Communicator> make_tcp_communicator(Setup setup) {
  std::vector<net::Fd> peers;
  if (setup.launch.world_size > 1)
    peers = build_mesh(setup);
  else
    peers.resize(1);
  bool spin = ranks_fit_cores(setup.launch);
  auto engine = std::make_shared<Engine>(std::move(setup), std::move(peers), spin);
  engine->start();
  return std::make_unique<TcpCommunicator>(std::move(engine));
}

}  // namespace collie::tcp
