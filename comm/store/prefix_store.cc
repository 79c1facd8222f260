// comm/store/prefix_store.cc: PrefixStore (one store shared by several
// communicators, each under its own key prefix) and the byte helpers.
#include "collie/store.h"

namespace collie {

Bytes to_bytes(std::string_view s) {
  return Bytes(s.begin(), s.end());
}
std::string to_string(const Bytes& b) {
  return std::string(b.begin(), b.end());
}

PrefixStore::PrefixStore(std::shared_ptr<Store> base, std::string prefix)
    : Store(base->timeout()), base_(std::move(base)), prefix_(std::move(prefix)) {}

std::vector<std::string> PrefixStore::prefixed(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(prefix_ + k);
  return out;
}

void PrefixStore::set(const std::string& key, const Bytes& value) {
  base_->set(prefix_ + key, value);
}
void PrefixStore::set(const std::string& key, const Bytes& value, Millis t) {
  base_->set(prefix_ + key, value, t);
}
Bytes PrefixStore::get(const std::string& key) {
  return base_->get(prefix_ + key, timeout_);
}
Bytes PrefixStore::get(const std::string& key, Millis t) {
  return base_->get(prefix_ + key, t);
}
int64_t PrefixStore::add(const std::string& key, int64_t delta) {
  return base_->add(prefix_ + key, delta);
}
void PrefixStore::wait(const std::vector<std::string>& keys) {
  base_->wait(prefixed(keys), timeout_);
}
void PrefixStore::wait(const std::vector<std::string>& keys, Millis t) {
  base_->wait(prefixed(keys), t);
}
Bytes PrefixStore::compare_set(const std::string& key, const Bytes& expected,
                               const Bytes& desired) {
  return base_->compare_set(prefix_ + key, expected, desired);
}
bool PrefixStore::remove(const std::string& key) {
  return base_->remove(prefix_ + key);
}
bool PrefixStore::check(const std::vector<std::string>& keys) {
  return base_->check(prefixed(keys));
}
std::unique_ptr<Store> PrefixStore::connect_again() {
  std::shared_ptr<Store> again = base_->connect_again();
  if (!again) return nullptr;
  return std::make_unique<PrefixStore>(std::move(again), prefix_);
}

}  // namespace collie
