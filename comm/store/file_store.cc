// comm/store/file_store.cc: a store kept in one file on a file system every
// rank can see (NFS, Lustre, a local disk for one host), for clusters where
// rank 0's port cannot be reached first or is not known in advance.
//
// The file is an append-only log of records (set key value / delete key).
// Every operation takes an exclusive flock on the file, replays the log and
// appends at most one record, so add and compare_set are atomic across
// processes. get and wait re-read the file with a short, growing sleep until
// the keys appear or the deadline passes.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <thread>

#include "collie/store.h"

namespace collie {

namespace {

class FileStore final : public Store {
 public:
  FileStore(std::string path, Millis timeout) : Store(timeout), path_(std::move(path)) {
    Locked l(*this);  // creates the file, or says why it cannot
  }

  void set(const std::string& key, const Bytes& value) override {
    Locked l(*this);
    l.append('s', key, value);
  }
  Bytes get(const std::string& key) override { return get(key, timeout_); }
  Bytes get(const std::string& key, Millis timeout) override {
    Bytes out;
    poll_until(timeout, {key}, [&](const Map& m) {
      auto it = m.find(key);
      if (it == m.end()) return false;
      out = it->second;
      return true;
    });
    return out;
  }
  int64_t add(const std::string& key, int64_t delta) override {
    Locked l(*this);
    int64_t cur = 0;
    if (auto it = l.map.find(key); it != l.map.end()) {
      std::string s = to_string(it->second);
      char* end = nullptr;
      cur = std::strtoll(s.c_str(), &end, 10);
      if (s.empty() || *end != '\0')
        throw Error(ErrorCode::invalid_argument,
                    "file store " + path_ + ": add: the value under '" + key + "' is not an integer");
    }
    cur += delta;
    l.append('s', key, to_bytes(std::to_string(cur)));
    return cur;
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, Millis timeout) override {
    poll_until(timeout, keys, [&](const Map& m) {
      return std::all_of(keys.begin(), keys.end(), [&](const auto& k) { return m.count(k) > 0; });
    });
  }
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override {
    Locked l(*this);
    auto it = l.map.find(key);
    bool match = it == l.map.end() ? expected.empty() : it->second == expected;
    if (match) {
      l.append('s', key, desired);
      return desired;
    }
    return it == l.map.end() ? Bytes{} : it->second;
  }
  bool remove(const std::string& key) override {
    Locked l(*this);
    if (!l.map.count(key)) return false;
    l.append('d', key, {});
    return true;
  }
  bool check(const std::vector<std::string>& keys) override {
    Locked l(*this);
    return std::all_of(keys.begin(), keys.end(), [&](const auto& k) { return l.map.count(k) > 0; });
  }

 private:
  using Map = std::map<std::string, Bytes>;

  // The file opened, locked and replayed; unlocked and closed on scope exit.
  struct Locked {
    explicit Locked(FileStore& s) : store(s) {
      fd = ::open(s.path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
      if (fd < 0)
        throw system_error(ErrorCode::invalid_argument, "file store: cannot open " + s.path_, errno);
      while (::flock(fd, LOCK_EX) != 0)
        if (errno != EINTR) {
          ::close(fd);
          throw system_error(ErrorCode::internal, "file store: flock " + s.path_, errno);
        }
      replay();
    }
    ~Locked() {
      ::flock(fd, LOCK_UN);
      ::close(fd);
    }

    void replay() {
      std::string data;
      char buf[65536];
      ssize_t n;
      while ((n = ::read(fd, buf, sizeof buf)) > 0) data.append(buf, static_cast<size_t>(n));
      size_t at = 0;
      auto u32 = [&](uint32_t& v) {
        if (data.size() - at < 4) return false;
        v = static_cast<uint8_t>(data[at]) | (static_cast<uint8_t>(data[at + 1]) << 8) |
            (static_cast<uint8_t>(data[at + 2]) << 16) |
            (static_cast<uint32_t>(static_cast<uint8_t>(data[at + 3])) << 24);
        at += 4;
        return true;
      };
      while (at < data.size()) {
        char kind = data[at++];
        uint32_t kl = 0, vl = 0;
        if (!u32(kl) || data.size() - at < kl) break;
        std::string key = data.substr(at, kl);
        at += kl;
        if (!u32(vl) || data.size() - at < vl) break;  // a torn last record: ignore it
        if (kind == 's') map[key] = Bytes(data.begin() + at, data.begin() + at + vl);
        else map.erase(key);
        at += vl;
      }
    }

    void append(char kind, const std::string& key, const Bytes& value) {
      std::string rec(1, kind);
      auto u32 = [&](uint32_t v) {
        for (int i = 0; i < 4; ++i) rec.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
      };
      u32(static_cast<uint32_t>(key.size()));
      rec += key;
      u32(static_cast<uint32_t>(value.size()));
      rec.append(value.begin(), value.end());
      ::lseek(fd, 0, SEEK_END);
      size_t done = 0;
      while (done < rec.size()) {
        ssize_t n = ::write(fd, rec.data() + done, rec.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) throw system_error(ErrorCode::internal, "file store: write " + store.path_, errno);
        done += static_cast<size_t>(n);
      }
      if (kind == 's') map[key] = value;
      else map.erase(key);
    }

    FileStore& store;
    int fd = -1;
    Map map;
  };

  template <typename Ready>
  void poll_until(Millis timeout, const std::vector<std::string>& keys, Ready ready) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    auto pause = std::chrono::microseconds(200);
    for (;;) {
      {
        Locked l(*this);
        if (ready(l.map)) return;
        if (std::chrono::steady_clock::now() >= deadline) {
          std::string missing;
          for (const auto& k : keys)
            if (!l.map.count(k)) missing += (missing.empty() ? "" : ", ") + k;
          throw Error(ErrorCode::timeout, "file store " + path_ + ": timed out after " +
                                              std::to_string(timeout.count()) +
                                              " ms waiting for key(s) " + missing);
        }
      }
      std::this_thread::sleep_for(pause);
      pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(10));
    }
  }

  std::string path_;
};

}  // namespace

std::unique_ptr<Store> make_file_store(const std::string& path, Millis timeout) {
  return std::make_unique<FileStore>(path, timeout);
}

}  // namespace collie
