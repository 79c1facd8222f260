// comm/store/tcp_store.cc: the client of the TCP key-value store ranks
// rendezvous through (its server: comm/store/tcp_store_server.cc).
//
// Wire format, both ways: u32 length (little-endian), then the record.
// Request record: u8 op, then fields, each u32 length + bytes.
// Reply record: u8 status (0 ok, 1 failed, 2 refused), then fields.
//   HELLO magic job nonce       -> ok(server nonce, server MAC) | refused(reason)
//   PROOF client MAC            -> ok | refused(reason)
//   SET key value               -> ok
//   GET key                     -> ok(value), once the key exists
//   ADD key delta               -> ok(new value), both decimal int64
//   WAIT key...                 -> ok, once every key exists
//   COMPARE_SET key exp desired -> ok(value now stored)
//   DELETE key                  -> ok("1" existed | "0")
//   CHECK key...                -> ok(the keys that are missing, none if all exist)
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "collie/store.h"
#include "comm/net/auth.h"
#include "comm/net/socket.h"
#include "comm/store/parse_int.h"
#include "comm/store/store_protocol.h"

namespace collie {

namespace {

using net::Deadline;

using namespace store_detail;

using store_detail::parse_i64;

std::vector<std::string_view> views(const std::vector<std::string>& v) {
  return {v.begin(), v.end()};
}

// The right to use a client's connection, taken by one request at a time and
// waited for no longer than the request's deadline (a request parked on the
// server may hold it for long). A flag under a condition variable rather
// than std::timed_mutex: ThreadSanitizer in GCC 12 does not intercept the
// steady-clock lock that timed_mutex uses, and reports false errors.
class Turn {
 public:
  // Holds the turn from construction, if it came before the deadline, to
  // destruction.
  class Hold {
   public:
    Hold(Turn& turn, Deadline deadline) : turn_(turn), held_(turn.take(deadline)) {}
    ~Hold() {
      if (held_) turn_.give_back();
    }
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;
    explicit operator bool() const { return held_; }

   private:
    Turn& turn_;
    const bool held_;
  };

 private:
  bool take(Deadline deadline) {
    std::unique_lock lk(mu_);
    if (!cv_.wait_until(lk, deadline, [&] { return !taken_; })) return false;
    taken_ = true;
    return true;
  }
  void give_back() {
    {
      std::lock_guard lk(mu_);
      taken_ = false;
    }
    cv_.notify_one();
  }

  std::mutex mu_;
  std::condition_variable cv_;
  bool taken_ = false;
};

// How long a client may take to reconnect after a timed-out request. The
// store was there a moment ago, so a reconnect that fails this long means it
// is gone, whatever the deadline of the request that needs it.
constexpr auto kReconnectTime = std::chrono::seconds(3);

class TcpStoreClient final : public TcpStore {
 public:
  TcpStoreClient(std::string host, int port, StoreAuth auth, Millis timeout, std::string who,
                 std::string served_by)
      : TcpStore(timeout),
        ep_{std::move(host), port},
        auth_(std::move(auth)),
        who_(std::move(who)),
        served_by_(std::move(served_by)) {
    std::string what = who_ + ": connecting to " + where();
    Deadline deadline = net::deadline_after(timeout);
    fd_ = net::connect_tcp(ep_, deadline, what);
    try {
      hello(deadline);
    } catch (const Error& e) {
      if (e.code() != ErrorCode::peer_lost) throw;
      // Something listens there, but it hung up on a collie hello.
      throw Error(ErrorCode::invalid_argument,
                  what +
                      ": it closed the connection during the handshake: is it a collie store "
                      "of this version (MASTER_ADDR/MASTER_PORT)?");
    }
    local_ = net::local_host(fd_.get());
  }

  std::string local_address() const override { return local_; }

  std::unique_ptr<Store> connect_again() override {
    return std::make_unique<TcpStoreClient>(ep_.host, ep_.port, auth_, timeout_, who_, served_by_);
  }

  void set(const std::string& key, const Bytes& value) override { set(key, value, timeout_); }
  void set(const std::string& key, const Bytes& value, Millis timeout) override {
    check_value(key, value);
    call(kSet, {key, view(value)}, timeout, {key});
  }
  Bytes get(const std::string& key) override { return get(key, timeout_); }
  Bytes get(const std::string& key, Millis timeout) override {
    return to_bytes(one_field(call(kGet, {key}, timeout, {key})));
  }
  int64_t add(const std::string& key, int64_t delta) override {
    int64_t v = 0;
    if (!parse_i64(one_field(call(kAdd, {key, std::to_string(delta)}, timeout_, {key})), v))
      throw Error(ErrorCode::internal, who_ + ": " + where() + " sent a malformed add reply");
    return v;
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, Millis timeout) override {
    if (keys.empty()) return;
    call(kWait, views(keys), timeout, keys);
  }
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override {
    check_value(key, expected);
    check_value(key, desired);
    return to_bytes(
        one_field(call(kCompareSet, {key, view(expected), view(desired)}, timeout_, {key})));
  }
  bool remove(const std::string& key) override {
    return one_field(call(kDelete, {key}, timeout_, {key})) == "1";
  }
  bool check(const std::vector<std::string>& keys) override {
    if (keys.empty()) return true;
    return call(kCheck, views(keys), timeout_, keys).empty();
  }

 private:
  static std::string_view view(const Bytes& b) {
    return {reinterpret_cast<const char*>(b.data()), b.size()};
  }

  std::string where() const { return "the store at " + ep_.str(); }

  void check_value(const std::string& key, const Bytes& value) const {
    if (value.size() > kMaxValue)
      throw Error(ErrorCode::invalid_argument,
                  who_ + ": the value for store key '" + key.substr(0, 200) + "' is " +
                      std::to_string(value.size()) + " bytes; the store holds at most " +
                      std::to_string(kMaxValue));
  }

  void check_keys(const std::vector<std::string>& keys, size_t record) const {
    for (auto& k : keys)
      if (k.size() > kMaxKey)
        throw Error(ErrorCode::invalid_argument, who_ + ": store key '" + k.substr(0, 200) +
                                                     "...' is " + std::to_string(k.size()) +
                                                     " bytes; keys are at most " +
                                                     std::to_string(kMaxKey));
    if (record > kMaxRecord)
      throw Error(ErrorCode::invalid_argument,
                  who_ + ": a store request of " + std::to_string(record) +
                      " bytes exceeds the limit of " + std::to_string(kMaxRecord) +
                      " (too many keys at once?)");
  }

  std::string one_field(const std::vector<std::string>& f) const {
    if (f.size() != 1)
      throw Error(ErrorCode::internal, who_ + ": " + where() + " sent a malformed reply");
    return f[0];
  }

  // The handshake on the fresh connection fd_ (comm/net/auth.h): names the
  // job, checks that the server knows the secret, proves that this client
  // does. A refusal throws invalid_argument; a connection that closes
  // instead, peer_lost.
  void hello(Deadline deadline) {
    std::string what = who_ + ": connecting to " + where();
    const auth::Nonce nonce = auth::fresh_nonce();
    std::vector<std::string> f;
    auto exchange = [&](const std::string& msg) {
      std::string r;
      try {
        net::write_full(fd_.get(), msg.data(), msg.size(), deadline, what);
        r = net::read_blob(fd_.get(), kMaxHello, deadline, what);
      } catch (const Error&) {
        fd_.reset();
        throw;
      }
      if (!r.empty() && r[0] == kRefused && parse_fields(r, f) && f.size() == 1) {
        fd_.reset();
        throw Error(ErrorCode::invalid_argument,
                    who_ + ": " + where() + " refused this client: " + f[0] +
                        (f[0].find("secret") != std::string::npos
                             ? " (COLLIE_JOB_SECRET differs from rank 0's: every rank of a job "
                               "must share one secret)"
                             : ""));
      }
      if (r.empty() || r[0] != kOk || !parse_fields(r, f)) {
        fd_.reset();
        throw Error(ErrorCode::internal, what + ": malformed handshake reply");
      }
    };
    exchange(message(kHello, {kMagic, auth_.job, auth::view(nonce)}));
    if (f.size() != 2 || f[0].size() != auth::kNonceBytes) {
      fd_.reset();
      throw Error(ErrorCode::internal, what + ": malformed handshake reply");
    }
    const std::string proof =
        std::string(mac_view(client_mac(auth_.secret, auth_.job, auth::view(nonce), f[0])));
    if (!auth::same(server_mac(auth_.secret, auth_.job, auth::view(nonce), f[0]), f[1])) {
      // Still show the proof, so that the server logs the refusal with
      // this client's address: both ends of the job hear of it.
      try {
        std::string msg = message(kProof, {proof});
        net::write_full(fd_.get(), msg.data(), msg.size(), deadline, what);
      } catch (const Error&) {
      }
      fd_.reset();
      throw Error(ErrorCode::invalid_argument,
                  what +
                      ": it could not prove that it knows this job's secret (COLLIE_JOB_SECRET "
                      "differs from rank 0's, or something else listens at that address)");
    }
    exchange(message(kProof, {proof}));
  }

  // Connects again after a timed-out request, within the request's own
  // deadline `limit` where that comes first: a store that does not answer
  // in time is a timeout of that request, as on the old connection. A store
  // that cannot be reached within kReconnectTime is lost for good, and
  // every later call says so.
  void reconnect(Deadline limit) {
    const Deadline own = net::deadline_after(kReconnectTime);
    const Deadline deadline = std::min(limit, own);
    try {
      fd_ = net::connect_tcp(ep_, deadline, who_ + ": reconnecting to " + where());
      hello(deadline);
    } catch (const Error& e) {
      fd_.reset();
      if (e.code() == ErrorCode::invalid_argument) throw;
      if (e.code() == ErrorCode::timeout && limit < own)
        throw Error(ErrorCode::timeout,
                    who_ + ": the request's deadline passed while reconnecting to " + where() +
                        ": " + e.what());
      throw lose(e.what());
    }
  }

  Error lose(const std::string& cause) {
    lost_ = who_ + ": lost the connection to " + where() + " (" + served_by_ +
            " serves it: did it exit?): " + cause;
    return Error(ErrorCode::peer_lost, lost_);
  }

  // One request and its reply. Holds the connection for the whole exchange:
  // requests from several threads go one at a time.
  std::vector<std::string> call(Request op, const std::vector<std::string_view>& fields,
                                Millis timeout, const std::vector<std::string>& keys) {
    const std::string msg = message(op, fields);
    check_keys(keys, msg.size() - 4);
    Deadline deadline = net::deadline_after(timeout);
    Turn::Hold hold(turn_, deadline);
    if (!hold)
      throw Error(ErrorCode::timeout,
                  who_ + ": timed out after " + std::to_string(timeout.count()) +
                      " ms waiting for another thread's request to " + where() +
                      " to finish, before asking for key(s) " + list_keys(keys));
    if (!lost_.empty()) throw Error(ErrorCode::peer_lost, lost_);
    if (!fd_.valid()) reconnect(deadline);
    const std::string what = who_ + ": " + where();
    std::string r;
    try {
      net::write_full(fd_.get(), msg.data(), msg.size(), deadline, what);
      r = net::read_blob(fd_.get(), kMaxRecord, deadline, what);
    } catch (const Error& e) {
      // A request that timed out may still be answered later: drop the
      // connection so that the answer cannot be taken for the next one.
      fd_.reset();
      if (e.code() == ErrorCode::timeout) throw timed_out(op, keys, timeout);
      throw lose(e.what());
    }
    std::vector<std::string> out;
    if (r.empty() || !parse_fields(r, out))
      throw Error(ErrorCode::internal, what + " sent a malformed reply");
    if (r[0] != kOk)
      throw Error(ErrorCode::invalid_argument,
                  what + " refused the request: " + (out.empty() ? "" : out[0]));
    return out;
  }

  // The error for a request whose deadline passed; for a wait on several
  // keys, asks the store (on a fresh connection) which are still missing.
  Error timed_out(Request op, const std::vector<std::string>& keys, Millis timeout) {
    const std::string after = " after " + std::to_string(timeout.count()) + " ms";
    if (op != kGet && op != kWait)
      return Error(ErrorCode::timeout, who_ + ": " + where() + " did not answer a request on '" +
                                           list_keys(keys) + "'" + after);
    std::vector<std::string> missing = keys;
    if (keys.size() > 1) {
      try {
        reconnect(net::deadline_after(kReconnectTime));
        const std::string what = who_ + ": " + where();
        Deadline d = net::deadline_after(kReconnectTime);
        std::string msg = message(kCheck, views(keys));
        net::write_full(fd_.get(), msg.data(), msg.size(), d, what);
        std::string r = net::read_blob(fd_.get(), kMaxRecord, d, what);
        std::vector<std::string> f;
        if (!r.empty() && r[0] == kOk && parse_fields(r, f) && !f.empty()) missing = std::move(f);
      } catch (const Error&) {
        fd_.reset();  // the next call reconnects, or reports the store lost
      }
    }
    return Error(ErrorCode::timeout, who_ + ": timed out" + after + " waiting on " + where() +
                                         " for key(s) still missing: " + list_keys(missing));
  }

  Turn turn_;
  const net::Endpoint ep_;
  const StoreAuth auth_;
  const std::string who_;
  const std::string served_by_;
  std::string local_;  // set once, by the constructor
  net::Fd fd_;         // invalid after a timed-out request, until the next call
  std::string lost_;   // why the store is gone, once it is
};

}  // namespace

std::unique_ptr<TcpStore> TcpStore::connect(const std::string& host, int port,
                                            const StoreAuth& auth, Millis timeout,
                                            const std::string& who, const std::string& served_by) {
  return std::make_unique<TcpStoreClient>(host, port, auth, timeout, who, served_by);
}

}  // namespace collie
