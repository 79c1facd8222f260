// collie/store.h: the key-value store ranks rendezvous through.
//
// A Store holds byte-string values under string keys. Rank 0 serves a
// TcpStore (TcpStoreServer) and every rank, rank 0 included, talks to it
// through a TcpStore client; FileStore does the same through a file on a
// shared file system. Every call has a deadline: the store's default, or the
// one passed. A deadline that passes throws Error{timeout} naming the keys
// still missing.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "collie/error.h"

namespace collie {

using Bytes = std::vector<uint8_t>;
using Millis = std::chrono::milliseconds;

Bytes to_bytes(std::string_view s);
std::string to_string(const Bytes& b);

class Store {
 public:
  virtual ~Store() = default;

  virtual void set(const std::string& key, const Bytes& value) = 0;
  // The same within `timeout`: for a write that must not wait the store's
  // whole deadline for a store that cannot be reached (the stall
  // inspector's question to the other ranks, its goodbye). A store that
  // cannot bound a write keeps its own deadline.
  virtual void set(const std::string& key, const Bytes& value, Millis timeout) {
    (void)timeout;
    set(key, value);
  }
  // Waits until `key` exists, then returns its value.
  virtual Bytes get(const std::string& key) = 0;
  virtual Bytes get(const std::string& key, Millis timeout) = 0;
  // Adds `delta` to the integer stored under `key` (missing counts as 0) and
  // returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Waits until every key exists. Throws Error{timeout} listing the missing.
  virtual void wait(const std::vector<std::string>& keys) = 0;
  virtual void wait(const std::vector<std::string>& keys, Millis timeout) = 0;
  // Sets `key` to `desired` if its value equals `expected` (an empty
  // `expected` matches a missing key). Returns the value now stored.
  virtual Bytes compare_set(const std::string& key, const Bytes& expected,
                            const Bytes& desired) = 0;
  // Deletes `key`; returns whether it existed.
  virtual bool remove(const std::string& key) = 0;
  // Whether every key exists now (no waiting).
  virtual bool check(const std::vector<std::string>& keys) = 0;

  Millis timeout() const { return timeout_; }
  void set_timeout(Millis t) { timeout_ = t; }
  // A second connection to the same store, for a thread that parks a long
  // wait on it (the stall inspector's watcher) without holding up this one;
  // nullptr where the store cannot make one (the default).
  virtual std::unique_ptr<Store> connect_again() { return nullptr; }

 protected:
  explicit Store(Millis timeout) : timeout_(timeout) {}
  Millis timeout_;
};

// Who may use a TCP store: clients of the same job (compared in clear, so
// that a rank of another job is told so) that know the same secret (never
// sent: each side proves it by HMAC-SHA256 over both sides' nonces). A
// plain string is a secret with no job name.
struct StoreAuth {
  StoreAuth(std::string secret_ = "", std::string job_ = "")
      : secret(std::move(secret_)), job(std::move(job_)) {}
  StoreAuth(const char* secret_) : secret(secret_) {}
  std::string secret;
  std::string job;
};

// The server half of the TCP store: a thread that answers clients. A client
// must pass the handshake before any request; a connection that sends
// anything else, or nothing within the handshake deadline, is dropped and the
// server goes on serving the others.
class TcpStoreServer {
 public:
  // Listens on `port` (0: any free port) on all interfaces, or adopts
  // `listen_fd` when it is >= 0 (a socket collie-run bound and passed down,
  // so that no other process can take the port between choosing and binding).
  static std::unique_ptr<TcpStoreServer> start(int port, const StoreAuth& auth, int listen_fd = -1);
  virtual ~TcpStoreServer() = default;
  virtual int port() const = 0;
};

class TcpStore : public Store {
 public:
  // Connects to host:port, retrying until `timeout` passes (the server may
  // not be up yet). `who` names this client in messages ("rank 3"), and
  // `served_by` the process that serves the store ("rank 0", "collie-run").
  static std::unique_ptr<TcpStore> connect(const std::string& host, int port, const StoreAuth& auth,
                                           Millis timeout, const std::string& who,
                                           const std::string& served_by = "rank 0");
  // The local address of the connection to the server: the interface this
  // host uses to reach rank 0, which is the one its peers can reach it on.
  virtual std::string local_address() const = 0;

 protected:
  explicit TcpStore(Millis timeout) : Store(timeout) {}
};

// A store kept in one file on a file system every rank sees. Operations take
// an exclusive lock on the file, so add and compare_set are atomic across
// processes.
std::unique_ptr<Store> make_file_store(const std::string& path, Millis timeout);

// A store in this process's memory (PyTorch's HashStore): for ranks that are
// threads of one process, as the `fake` backend's are. Thread-safe.
std::unique_ptr<Store> make_memory_store(Millis timeout);

// Keys under a prefix: PrefixStore(s, "comm3/") maps "x" to "comm3/x".
class PrefixStore : public Store {
 public:
  PrefixStore(std::shared_ptr<Store> base, std::string prefix);
  void set(const std::string& key, const Bytes& value) override;
  void set(const std::string& key, const Bytes& value, Millis timeout) override;
  Bytes get(const std::string& key) override;
  Bytes get(const std::string& key, Millis timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool remove(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  std::unique_ptr<Store> connect_again() override;

 private:
  std::vector<std::string> prefixed(const std::vector<std::string>& keys) const;
  std::shared_ptr<Store> base_;
  std::string prefix_;
};

}  // namespace collie
