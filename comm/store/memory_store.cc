// comm/store/memory_store.cc: a store in this process's memory (PyTorch's
// HashStore), for ranks that are threads of one process: the fake backend's
// tests, a notebook. A map under one mutex; waits sleep on a condition
// variable that every write signals. connect_again gives another handle on
// the same map (the stall inspector's watcher parks its waits on one).
#include <condition_variable>
#include <map>
#include <mutex>

#include "collie/store.h"
#include "comm/store/parse_int.h"

namespace collie {

namespace {

// What every handle on one memory store shares.
struct Shared {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, Bytes> map;
};

class MemoryStore final : public Store {
 public:
  explicit MemoryStore(Millis timeout) : Store(timeout), s_(std::make_shared<Shared>()) {}
  MemoryStore(Millis timeout, std::shared_ptr<Shared> s) : Store(timeout), s_(std::move(s)) {}

  std::unique_ptr<Store> connect_again() override {
    return std::make_unique<MemoryStore>(timeout_, s_);
  }

  void set(const std::string& key, const Bytes& value) override {
    {
      std::lock_guard lk(mu_);
      map_[key] = value;
    }
    cv_.notify_all();
  }
  Bytes get(const std::string& key) override { return get(key, timeout_); }
  Bytes get(const std::string& key, Millis timeout) override {
    std::unique_lock lk(mu_);
    wait_locked(lk, {key}, timeout);
    return map_.at(key);
  }
  int64_t add(const std::string& key, int64_t delta) override {
    int64_t cur = 0, sum = 0;
    {
      std::lock_guard lk(mu_);
      if (auto it = map_.find(key);
          it != map_.end() && !store_detail::parse_i64(to_string(it->second), cur))
        throw Error(ErrorCode::invalid_argument,
                    "memory store: add: the value under '" + key + "' is not an integer");
      if (__builtin_add_overflow(cur, delta, &sum))
        throw Error(ErrorCode::invalid_argument,
                    "memory store: add: the value under '" + key + "' would overflow");
      map_[key] = to_bytes(std::to_string(sum));
    }
    cv_.notify_all();
    return sum;
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, Millis timeout) override {
    std::unique_lock lk(mu_);
    wait_locked(lk, keys, timeout);
  }
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override {
    Bytes now;
    {
      std::lock_guard lk(mu_);
      auto it = map_.find(key);
      if ((it == map_.end() && expected.empty()) || (it != map_.end() && it->second == expected))
        now = map_[key] = desired;
      else
        now = it == map_.end() ? Bytes{} : it->second;
    }
    cv_.notify_all();
    return now;
  }
  bool remove(const std::string& key) override {
    std::lock_guard lk(mu_);
    return map_.erase(key) > 0;
  }
  bool check(const std::vector<std::string>& keys) override {
    std::lock_guard lk(mu_);
    return missing(keys).empty();
  }

 private:
  std::vector<std::string> missing(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    for (const auto& k : keys)
      if (!map_.count(k)) out.push_back(k);
    return out;
  }

  void wait_locked(std::unique_lock<std::mutex>& lk, const std::vector<std::string>& keys,
                   Millis timeout) {
    if (cv_.wait_for(lk, timeout, [&] { return missing(keys).empty(); })) return;
    std::string list;
    for (const auto& k : missing(keys)) list += (list.empty() ? "" : ", ") + k;
    throw Error(ErrorCode::timeout, "memory store: timed out after " +
                                        std::to_string(timeout.count()) +
                                        " ms waiting for key(s) still missing: " + list);
  }

  std::shared_ptr<Shared> s_;
  std::mutex& mu_ = s_->mu;
  std::condition_variable& cv_ = s_->cv;
  std::map<std::string, Bytes>& map_ = s_->map;
};

}  // namespace

std::unique_ptr<Store> make_memory_store(Millis timeout) {
  return std::make_unique<MemoryStore>(timeout);
}

}  // namespace collie
