// comm/store/tcp_store.cc: the TCP key-value store ranks rendezvous through.
//
// The server is one thread with a poll() loop over the listening socket,
// every client and a wake-up pipe: no thread per client, no spinning. A
// request that must wait (get, wait) is parked on its client and answered
// when a later set, add or compare_set makes its keys exist; the client
// enforces the deadline. Every message is a length-prefixed record with hard
// caps, and a client must present the job secret in its first message,
// within a few seconds, or it is dropped: garbage or silence on the port
// costs the server one socket for a moment, and nothing else.
//
// Wire format, both ways: u32 length (little-endian), then the record.
// Request record: u8 op, then fields, each u32 length + bytes.
// Reply record: u8 status (0 ok, 1 error, 2 refused), then fields.
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "collie/store.h"
#include "comm/tcp/socket.h"

namespace collie {

namespace {

using net::Deadline;

enum Op : uint8_t { kHello = 1, kSet, kGet, kAdd, kWait, kCompareSet, kDelete, kCheck };
enum Status : uint8_t { kOk = 0, kFailed = 1, kRefused = 2 };

constexpr const char* kMagic = "collie-store-1";
constexpr size_t kMaxKey = 4096;
constexpr size_t kMaxRecord = (64u << 20) + 64 * 1024;  // a 64 MiB value plus keys
constexpr size_t kMaxHello = 1024;                      // before the secret is shown
constexpr auto kHandshakeTime = std::chrono::seconds(10);

void put_u32(std::string& s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint32_t get_u32(const uint8_t* p) {
  return p[0] | (p[1] << 8) | (p[2] << 16) | (static_cast<uint32_t>(p[3]) << 24);
}
void put_field(std::string& s, std::string_view f) {
  put_u32(s, static_cast<uint32_t>(f.size()));
  s.append(f);
}

// Reads the fields of a record after its op/status byte.
bool parse_fields(std::string_view rec, std::vector<std::string>& out) {
  out.clear();
  size_t at = 1;
  while (at < rec.size()) {
    if (rec.size() - at < 4) return false;
    uint32_t len = get_u32(reinterpret_cast<const uint8_t*>(rec.data()) + at);
    at += 4;
    if (len > rec.size() - at) return false;
    out.emplace_back(rec.substr(at, len));
    at += len;
  }
  return true;
}

std::string framed(std::string rec) {
  std::string msg;
  put_u32(msg, static_cast<uint32_t>(rec.size()));
  return msg + rec;
}

std::string reply(Status st, std::initializer_list<std::string_view> fields) {
  std::string rec(1, static_cast<char>(st));
  for (auto f : fields) put_field(rec, f);
  return framed(std::move(rec));
}

class Server final : public TcpStoreServer {
 public:
  Server(net::Fd listener, std::string secret)
      : listener_(std::move(listener)), secret_(std::move(secret)) {
    port_ = net::local_port(listener_.get());
    net::set_nonblocking(listener_.get(), true);
    int p[2];
    if (::pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0)
      throw system_error(ErrorCode::internal, "store: pipe", errno);
    wake_r_.reset(p[0]);
    wake_w_.reset(p[1]);
    thread_ = std::thread([this] { loop(); });
  }

  ~Server() override {
    stop_ = true;
    [[maybe_unused]] ssize_t n = ::write(wake_w_.get(), "x", 1);
    thread_.join();
  }

  int port() const override { return port_; }

 private:
  struct Client {
    net::Fd fd;
    std::string in, out;
    bool authed = false;
    bool closing = false;  // close once `out` is flushed
    Deadline hello_deadline;
    std::vector<std::string> parked;  // keys a parked get/wait needs
    uint8_t parked_op = 0;
  };

  void loop() {
    std::vector<pollfd> pfds;
    while (!stop_) {
      pfds.clear();
      pfds.push_back({listener_.get(), POLLIN, 0});
      pfds.push_back({wake_r_.get(), POLLIN, 0});
      Deadline wake = net::Clock::now() + std::chrono::seconds(60);
      for (auto& c : clients_) {
        short ev = c.closing ? 0 : POLLIN;
        if (!c.out.empty()) ev |= POLLOUT;
        pfds.push_back({c.fd.get(), ev, 0});
        if (!c.authed) wake = std::min(wake, c.hello_deadline);
      }
      int n = ::poll(pfds.data(), pfds.size(), net::poll_timeout_ms(wake));
      if (n < 0 && errno != EINTR) return;
      if (pfds[0].revents & POLLIN) accept_all();
      auto now = net::Clock::now();
      for (size_t i = 0; i < clients_.size() && i + 2 < pfds.size(); ++i) {
        Client& c = clients_[i];
        short re = pfds[i + 2].revents;
        if (!c.authed && now >= c.hello_deadline) c.fd.reset();
        if (c.fd.valid() && (re & (POLLIN | POLLHUP | POLLERR)) && !c.closing) read_from(c);
        if (c.fd.valid() && !c.out.empty()) flush(c);
        if (c.fd.valid() && c.closing && c.out.empty()) c.fd.reset();
      }
      std::erase_if(clients_, [](const Client& c) { return !c.fd.valid(); });
    }
  }

  void accept_all() {
    for (;;) {
      int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) return;
      net::set_nodelay(fd);
      Client c;
      c.fd.reset(fd);
      c.hello_deadline = net::Clock::now() + kHandshakeTime;
      clients_.push_back(std::move(c));
    }
  }

  void read_from(Client& c) {
    char buf[65536];
    for (;;) {
      ssize_t n = ::recv(c.fd.get(), buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0) {
        c.in.append(buf, static_cast<size_t>(n));
        if (!handle_records(c)) return;
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (n < 0 && errno == EINTR) continue;
      c.fd.reset();  // closed or broken: forget the client and its parked request
      return;
    }
  }

  // Handles every complete record in c.in; false when the client was dropped.
  bool handle_records(Client& c) {
    for (;;) {
      if (c.in.size() < 4) return true;
      uint32_t len = get_u32(reinterpret_cast<const uint8_t*>(c.in.data()));
      size_t cap = c.authed ? kMaxRecord : kMaxHello;
      if (len == 0 || len > cap) {
        c.fd.reset();
        return false;
      }
      if (c.in.size() < 4 + static_cast<size_t>(len)) return true;
      std::string rec = c.in.substr(4, len);
      c.in.erase(0, 4 + static_cast<size_t>(len));
      if (!handle(c, rec)) return false;
    }
  }

  bool handle(Client& c, const std::string& rec) {
    std::vector<std::string> f;
    uint8_t op = static_cast<uint8_t>(rec[0]);
    if (!parse_fields(rec, f)) {
      c.fd.reset();
      return false;
    }
    if (!c.authed) {
      if (op != kHello || f.size() != 2 || f[0] != kMagic) {
        c.fd.reset();  // not a collie client: drop it without a word
        return false;
      }
      if (!net::equal_secret(f[1], secret_)) {
        c.out += reply(kRefused, {"the job secret does not match"});
        c.closing = true;
        return false;
      }
      c.authed = true;
      c.out += reply(kOk, {});
      return true;
    }
    if (c.parked_op != 0) {  // one request at a time per client
      c.fd.reset();
      return false;
    }
    for (size_t i = 0; i < f.size() && op != kSet && op != kCompareSet; ++i)
      if (f[i].size() > kMaxKey) return fail(c, "key longer than 4096 bytes");
    switch (op) {
      case kSet:
        if (f.size() != 2 || f[0].size() > kMaxKey) return fail(c, "malformed set");
        data_[f[0]] = f[1];
        c.out += reply(kOk, {});
        wake_parked();
        return true;
      case kGet:
      case kWait:
        if (f.empty() || (op == kGet && f.size() != 1)) return fail(c, "malformed get/wait");
        c.parked = std::move(f);
        c.parked_op = op;
        answer_if_ready(c);
        return true;
      case kAdd: {
        if (f.size() != 2) return fail(c, "malformed add");
        int64_t cur = 0, delta = 0;
        if (!parse_i64(f[1], delta)) return fail(c, "add: delta is not an integer");
        auto it = data_.find(f[0]);
        if (it != data_.end() && !parse_i64(it->second, cur))
          return fail(c, "add: the value under '" + f[0] + "' is not an integer");
        std::string v = std::to_string(cur + delta);
        data_[f[0]] = v;
        c.out += reply(kOk, {v});
        wake_parked();
        return true;
      }
      case kCompareSet: {
        if (f.size() != 3 || f[0].size() > kMaxKey) return fail(c, "malformed compare_set");
        auto it = data_.find(f[0]);
        bool match = it == data_.end() ? f[1].empty() : it->second == f[1];
        if (match) data_[f[0]] = f[2];
        c.out += reply(kOk, {data_.count(f[0]) ? data_[f[0]] : std::string()});
        if (match) wake_parked();
        return true;
      }
      case kDelete: {
        if (f.size() != 1) return fail(c, "malformed delete");
        bool existed = data_.erase(f[0]) > 0;
        c.out += reply(kOk, {existed ? "1" : "0"});
        return true;
      }
      case kCheck: {
        bool all = true;
        for (auto& k : f) all = all && data_.count(k);
        c.out += reply(kOk, {all ? "1" : "0"});
        return true;
      }
      default:
        return fail(c, "unknown request " + std::to_string(op));
    }
  }

  bool fail(Client& c, const std::string& msg) {
    c.out += reply(kFailed, {msg});
    return true;
  }

  static bool parse_i64(const std::string& s, int64_t& v) {
    if (s.empty()) return false;
    char* end = nullptr;
    errno = 0;
    long long x = std::strtoll(s.c_str(), &end, 10);
    if (*end != '\0' || errno == ERANGE) return false;
    v = x;
    return true;
  }

  void answer_if_ready(Client& c) {
    for (auto& k : c.parked)
      if (!data_.count(k)) return;
    c.out += c.parked_op == kGet ? reply(kOk, {data_[c.parked[0]]}) : reply(kOk, {});
    c.parked.clear();
    c.parked_op = 0;
  }

  void wake_parked() {
    for (auto& c : clients_)
      if (c.fd.valid() && c.parked_op) answer_if_ready(c);
  }

  void flush(Client& c) {
    while (!c.out.empty()) {
      ssize_t n = ::send(c.fd.get(), c.out.data(), c.out.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n > 0) {
        c.out.erase(0, static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
      c.fd.reset();
      return;
    }
  }

  net::Fd listener_;
  std::string secret_;
  int port_ = 0;
  net::Fd wake_r_, wake_w_;
  std::atomic<bool> stop_{false};
  std::vector<Client> clients_;
  std::map<std::string, std::string> data_;
  std::thread thread_;
};

class Client final : public TcpStore {
 public:
  Client(std::string host, int port, std::string secret, Millis timeout, std::string who)
      : TcpStore(timeout),
        ep_{std::move(host), port},
        secret_(std::move(secret)),
        who_(std::move(who)) {
    std::lock_guard lk(mu_);
    ensure_connected(net::deadline_after(timeout));
  }

  std::string local_address() const override { return local_; }

  void set(const std::string& key, const Bytes& value) override {
    call(kSet, {key, as_view(value)}, timeout_, {key});
  }
  Bytes get(const std::string& key) override { return get(key, timeout_); }
  Bytes get(const std::string& key, Millis timeout) override {
    auto f = call(kGet, {key}, timeout, {key});
    return to_bytes(f.at(0));
  }
  int64_t add(const std::string& key, int64_t delta) override {
    auto f = call(kAdd, {key, std::to_string(delta)}, timeout_, {key});
    return std::stoll(f.at(0));
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, Millis timeout) override {
    if (keys.empty()) return;
    std::vector<std::string_view> v(keys.begin(), keys.end());
    call(kWait, v, timeout, keys);
  }
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override {
    auto f = call(kCompareSet, {key, as_view(expected), as_view(desired)}, timeout_, {key});
    return to_bytes(f.at(0));
  }
  bool remove(const std::string& key) override {
    return call(kDelete, {key}, timeout_, {key}).at(0) == "1";
  }
  bool check(const std::vector<std::string>& keys) override {
    std::vector<std::string_view> v(keys.begin(), keys.end());
    return call(kCheck, v, timeout_, keys).at(0) == "1";
  }

 private:
  static std::string_view as_view(const Bytes& b) {
    return {reinterpret_cast<const char*>(b.data()), b.size()};
  }

  std::string where() const { return "the store at " + ep_.str(); }

  void ensure_connected(Deadline deadline) {
    if (fd_.valid()) return;
    std::string what = who_ + ": connecting to " + where();
    net::Fd fd = net::connect_tcp(ep_, deadline, what);
    std::string rec(1, static_cast<char>(kHello));
    put_field(rec, kMagic);
    put_field(rec, secret_);
    net::write_full(fd.get(), framed(rec).data(), framed(rec).size(), deadline, what);
    std::string r;
    try {
      r = read_record(fd.get(), deadline, what);
    } catch (const Error& e) {
      if (e.code() != ErrorCode::peer_lost) throw;
      throw Error(ErrorCode::invalid_argument,
                  who_ + ": " + where() + " closed the connection during the handshake: is it a "
                         "collie store (MASTER_ADDR/MASTER_PORT)?");
    }
    if (r[0] == kRefused)
      throw Error(ErrorCode::invalid_argument,
                  who_ + ": " + where() + " refused this client: COLLIE_JOB_SECRET differs from "
                         "rank 0's (every rank of a job must share one secret)");
    local_ = net::local_host(fd.get());
    fd_ = std::move(fd);
  }

  static std::string read_record(int fd, Deadline deadline, const std::string& what) {
    std::string r = net::read_blob(fd, kMaxRecord, deadline, what);
    if (r.empty()) throw Error(ErrorCode::internal, what + ": empty reply from the store");
    return r;
  }

  std::vector<std::string> call(Op op, std::vector<std::string_view> fields, Millis timeout,
                                const std::vector<std::string>& keys) {
    std::lock_guard lk(mu_);
    Deadline deadline = net::deadline_after(timeout);
    std::string what = who_ + ": " + where();
    ensure_connected(deadline);
    std::string rec(1, static_cast<char>(op));
    for (auto f : fields) put_field(rec, f);
    std::string msg = framed(std::move(rec));
    std::string r;
    try {
      net::write_full(fd_.get(), msg.data(), msg.size(), deadline, what);
      r = read_record(fd_.get(), deadline, what);
    } catch (const Error& e) {
      // A request that timed out may still be answered later: drop the
      // connection so that the answer cannot be taken for the next one.
      fd_.reset();
      if (e.code() == ErrorCode::timeout) {
        std::string list;
        for (size_t i = 0; i < keys.size() && i < 8; ++i) list += (i ? ", " : "") + keys[i];
        if (keys.size() > 8) list += ", ...";
        throw Error(ErrorCode::timeout, who_ + ": timed out after " +
                                            std::to_string(timeout.count()) + " ms waiting on " +
                                            where() + " for key(s) " + list);
      }
      throw Error(ErrorCode::peer_lost, who_ + ": lost the connection to " + where() +
                                            " (rank 0 serves it: did it exit?): " + e.what());
    }
    std::vector<std::string> out;
    if (!parse_fields(r, out)) throw Error(ErrorCode::internal, what + ": malformed reply");
    if (r[0] != kOk)
      throw Error(ErrorCode::invalid_argument,
                  what + " refused the request: " + (out.empty() ? "" : out[0]));
    return out;
  }

  std::mutex mu_;
  net::Endpoint ep_;
  std::string secret_;
  std::string who_;
  std::string local_;
  net::Fd fd_;
};

}  // namespace

std::unique_ptr<TcpStoreServer> TcpStoreServer::start(int port, const std::string& secret,
                                                      int listen_fd) {
  net::Fd fd;
  if (listen_fd >= 0) {
    int listening = 0;
    socklen_t len = sizeof listening;
    if (::getsockopt(listen_fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening)
      throw Error(ErrorCode::invalid_argument,
                  "rank 0: COLLIE_STORE_FD=" + std::to_string(listen_fd) +
                      " is not a listening socket; unset it unless collie-run set it");
    fd.reset(listen_fd);
  } else {
    fd = net::listen_tcp("", port, "rank 0: serving the store");
  }
  net::set_cloexec(fd.get(), true);
  return std::make_unique<Server>(std::move(fd), secret);
}

std::unique_ptr<TcpStore> TcpStore::connect(const std::string& host, int port,
                                            const std::string& secret, Millis timeout,
                                            const std::string& who) {
  return std::make_unique<Client>(host, port, secret, timeout, who);
}

}  // namespace collie
