// comm/store/file_store.cc: a store kept in one file on a file system every
// rank can see (NFS, Lustre, a local disk for one host), for clusters where
// rank 0's port cannot be reached first or is not known in advance.
//
// The file is a header, then an append-only log of records (set key value /
// delete key), the design of PyTorch's FileStore. Every operation takes a
// flock on the file (exclusive to write, shared to read), reads the records
// appended since this process last looked, and appends at most one, so add
// and compare_set are atomic across processes. get and wait re-read the file
// with a short, growing sleep until the keys appear or the deadline passes.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>

#include "collie/store.h"
#include "comm/net/socket.h"
#include "comm/store/parse_int.h"

namespace collie {

namespace {

// Marks the file as a collie store, so that a path pointing at some other
// file is refused rather than misread (and its tail cut off as torn).
constexpr std::string_view kHeader = "collie-file-store-1\n";

class FileStore final : public Store {
 public:
  FileStore(std::string path, Millis timeout) : Store(timeout), path_(std::move(path)) {
    Locked l(*this, LOCK_EX);  // creates the file and its header, or says why it cannot
  }

  std::unique_ptr<Store> connect_again() override {
    return std::make_unique<FileStore>(path_, timeout_);
  }

  void set(const std::string& key, const Bytes& value) override {
    Locked l(*this, LOCK_EX);
    l.append('s', key, value);
  }
  Bytes get(const std::string& key) override { return get(key, timeout_); }
  Bytes get(const std::string& key, Millis timeout) override {
    Bytes out;
    poll_until(timeout, {key}, [&] {
      auto it = map_.find(key);
      if (it == map_.end()) return false;
      out = it->second;
      return true;
    });
    return out;
  }
  int64_t add(const std::string& key, int64_t delta) override {
    Locked l(*this, LOCK_EX);
    int64_t cur = 0, sum = 0;
    if (auto it = map_.find(key);
        it != map_.end() && !store_detail::parse_i64(to_string(it->second), cur))
      throw Error(ErrorCode::invalid_argument,
                  "file store " + path_ + ": add: the value under '" + key + "' is not an integer");
    if (__builtin_add_overflow(cur, delta, &sum))
      throw Error(ErrorCode::invalid_argument,
                  "file store " + path_ + ": add: the value under '" + key + "' would overflow");
    l.append('s', key, to_bytes(std::to_string(sum)));
    return sum;
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, Millis timeout) override {
    poll_until(timeout, keys, [&] { return missing(keys).empty(); });
  }
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override {
    Locked l(*this, LOCK_EX);
    auto it = map_.find(key);
    bool match = it == map_.end() ? expected.empty() : it->second == expected;
    if (!match) return it == map_.end() ? Bytes{} : it->second;
    l.append('s', key, desired);
    return desired;
  }
  bool remove(const std::string& key) override {
    Locked l(*this, LOCK_EX);
    if (!map_.count(key)) return false;
    l.append('d', key, {});
    return true;
  }
  bool check(const std::vector<std::string>& keys) override {
    Locked l(*this, LOCK_SH);
    return missing(keys).empty();
  }

 private:
  // The file opened, locked and caught up with; closing it drops the flock.
  class Locked {
   public:
    Locked(FileStore& s, int mode) : store_(s), guard_(s.mu_) {
      fd_.reset(::open(s.path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
      if (!fd_.valid())
        throw system_error(ErrorCode::invalid_argument, "file store: cannot open " + s.path_,
                           errno);
      while (::flock(fd_.get(), mode) != 0)
        if (errno != EINTR)
          throw system_error(ErrorCode::internal, "file store: flock " + s.path_, errno);
      s.catch_up(fd_.get(), mode == LOCK_EX);
    }

    // Appends one record; the caller holds the lock exclusively.
    void append(char kind, const std::string& key, const Bytes& value) {
      std::string rec(1, kind);
      put_u32(rec, static_cast<uint32_t>(key.size()));
      rec += key;
      put_u32(rec, static_cast<uint32_t>(value.size()));
      rec.append(value.begin(), value.end());
      store_.write_at(fd_.get(), rec, store_.offset_);
      store_.offset_ += static_cast<off_t>(rec.size());
      if (kind == 's')
        store_.map_[key] = value;
      else
        store_.map_.erase(key);
    }

   private:
    FileStore& store_;
    // Threads of this process take turns too: they share the cached map.
    // Declared before fd_ so that the file is closed (unlocked) first.
    std::lock_guard<std::mutex> guard_;
    net::Fd fd_;
  };

  static void put_u32(std::string& s, uint32_t v) {
    for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }

  std::vector<std::string> missing(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    for (const auto& k : keys)
      if (!map_.count(k)) out.push_back(k);
    return out;
  }

  void write_at(int fd, std::string_view data, off_t at) {
    size_t done = 0;
    while (done < data.size()) {
      ssize_t n =
          ::pwrite(fd, data.data() + done, data.size() - done, at + static_cast<off_t>(done));
      if (n < 0 && errno == EINTR) continue;
      // A record cut short here is cut off by the next writer (catch_up).
      if (n < 0) throw system_error(ErrorCode::internal, "file store: write " + path_, errno);
      done += static_cast<size_t>(n);
    }
  }

  // Brings map_ up to date with the file, reading only what was appended
  // since the last look unless the file was replaced or truncated.
  void catch_up(int fd, bool exclusive) {
    struct stat st {};
    if (::fstat(fd, &st) != 0)
      throw system_error(ErrorCode::internal, "file store: stat " + path_, errno);
    if (st.st_dev != dev_ || st.st_ino != ino_ || st.st_size < offset_) {
      dev_ = st.st_dev;
      ino_ = st.st_ino;
      offset_ = 0;
      map_.clear();
    }
    if (offset_ == 0) {
      if (st.st_size == 0) {
        if (!exclusive) return;  // nothing written yet
        write_at(fd, kHeader, 0);
      } else {
        std::string head = read_from(fd, 0, kHeader.size());
        if (head != kHeader)
          throw Error(ErrorCode::invalid_argument,
                      "file store: " + path_ +
                          " is not a collie store file; point the store "
                          "at a new path");
      }
      offset_ = static_cast<off_t>(kHeader.size());
    }
    std::string data = read_from(fd, offset_, SIZE_MAX);
    size_t at = 0;
    auto u32 = [&](size_t from, uint32_t& v) {
      if (data.size() - from < 4) return false;
      const auto* p = reinterpret_cast<const uint8_t*>(data.data() + from);
      v = p[0] | (p[1] << 8) | (p[2] << 16) | (static_cast<uint32_t>(p[3]) << 24);
      return true;
    };
    for (;;) {
      // A record: kind, key length, key, value length, value.
      uint32_t kl = 0, vl = 0;
      size_t key_at = at + 5;
      if (data.size() - at < 1 || !u32(at + 1, kl) || data.size() - key_at < kl) break;
      size_t value_at = key_at + kl + 4;
      if (!u32(key_at + kl, vl) || data.size() - value_at < vl) break;
      std::string key = data.substr(key_at, kl);
      if (data[at] == 's') {
        map_[key] = Bytes(data.begin() + static_cast<ptrdiff_t>(value_at),
                          data.begin() + static_cast<ptrdiff_t>(value_at + vl));
      } else {
        map_.erase(key);
      }
      at = value_at + vl;
    }
    offset_ += static_cast<off_t>(at);
    // Bytes after the last whole record are a writer that died mid-record
    // (writers hold the lock until their record is whole). Readers skip
    // them; a writer cuts them off so that its record is read after the
    // last whole one.
    if (exclusive && at < data.size() && ::ftruncate(fd, offset_) != 0)
      throw system_error(ErrorCode::internal, "file store: truncate " + path_, errno);
  }

  std::string read_from(int fd, off_t from, size_t max) {
    std::string out;
    char buf[65536];
    while (out.size() < max) {
      ssize_t n = ::pread(fd, buf, std::min(sizeof buf, max - out.size()),
                          from + static_cast<off_t>(out.size()));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw system_error(ErrorCode::internal, "file store: read " + path_, errno);
      if (n == 0) break;
      out.append(buf, static_cast<size_t>(n));
    }
    return out;
  }

  // Re-reads the file until ready() or the deadline; the sleep between looks
  // grows to 10 ms, so a key set a moment later is seen at once and a long
  // wait costs little.
  template <typename Ready>
  void poll_until(Millis timeout, const std::vector<std::string>& keys, Ready ready) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    auto pause = std::chrono::microseconds(200);
    for (;;) {
      {
        Locked l(*this, LOCK_SH);
        if (ready()) return;
        if (std::chrono::steady_clock::now() >= deadline) {
          std::string list;
          for (const auto& k : missing(keys)) list += (list.empty() ? "" : ", ") + k;
          throw Error(ErrorCode::timeout, "file store " + path_ + ": timed out after " +
                                              std::to_string(timeout.count()) +
                                              " ms waiting for key(s) still missing: " + list);
        }
      }
      std::this_thread::sleep_for(pause);
      pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(10));
    }
  }

  const std::string path_;
  // What this process has read of the file so far, guarded by mu_.
  std::mutex mu_;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
  off_t offset_ = 0;
  std::map<std::string, Bytes> map_;
};

}  // namespace

std::unique_ptr<Store> make_file_store(const std::string& path, Millis timeout) {
  return std::make_unique<FileStore>(path, timeout);
}

}  // namespace collie
