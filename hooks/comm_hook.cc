// hooks/comm_hook.cc: the hook registry (every hook by name, with its
// parameters), the spec parser ("fp16_wrap:powersgd:rank=2") and the
// reading of a hook's parameters. The hooks themselves are in their files:
// builtin_hooks.cc (allreduce, noop, fp16/bf16 and the wrappers),
// powersgd.cc, post_local_sgd.cc.
#include "hooks/comm_hook.h"

#include <mutex>
#include <vector>

#include "hooks/builtin_hooks.h"
#include "hooks/post_local_sgd.h"
#include "hooks/powersgd.h"

namespace collie {

void CommHook::load_state(const Bytes& state) {
  if (!state.empty())
    throw Error(ErrorCode::invalid_argument, "comm hook '" + name() +
                                                 "' has no state to load, but was given " +
                                                 std::to_string(state.size()) + " bytes");
}

namespace {

Error bad_spec(const std::string& msg) {
  return Error(ErrorCode::invalid_argument, "comm hook: " + msg);
}

// --- registry ---------------------------------------------------------------

struct Entry {
  std::vector<std::string> params;
  HookFactory factory;
};

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}

std::map<std::string, Entry>& registry() {
  static std::map<std::string, Entry> r = [] {
    std::map<std::string, Entry> m;
    m["allreduce"] = {{}, [](const HookParams&) { return make_allreduce_hook(); }};
    m["noop"] = {{}, [](const HookParams&) { return make_noop_hook(); }};
    m["fp16"] = {{}, [](const HookParams&) { return make_compress_hook(DType::f16, nullptr); }};
    m["bf16"] = {{}, [](const HookParams&) { return make_compress_hook(DType::bf16, nullptr); }};
    m["powersgd"] = {powersgd_param_names(),
                     [](const HookParams& p) { return make_powersgd_hook(p, false); }};
    m["batched_powersgd"] = {powersgd_param_names(),
                             [](const HookParams& p) { return make_powersgd_hook(p, true); }};
    m["post_local_sgd"] = {{"start_iter", "subgroup"}, make_post_local_sgd_hook};
    return m;
  }();
  return r;
}

std::string accepted_names() {
  std::string s;
  for (const auto& n : comm_hook_names()) s += (s.empty() ? "" : ", ") + n;
  return s + ", fp16_wrap:<hook>, bf16_wrap:<hook>";
}

}  // namespace

namespace {
// The shared part of reading a numeric parameter: absent gives `fallback`;
// `parse` must consume the whole value, which must lie in [lo, hi].
template <typename T, typename Parse>
T hook_param_number(const HookParams& p, const std::string& hook, const std::string& key,
                    T fallback, T lo, T hi, const char* kind, Parse parse) {
  auto it = p.find(key);
  if (it == p.end()) return fallback;
  const std::string& v = it->second;
  size_t used = 0;
  T x{};
  try {
    x = parse(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (v.empty() || used != v.size() || !(x >= lo && x <= hi))
    throw bad_spec("hook '" + hook + "': " + key + "='" + v + "' is not " + kind + " in [" +
                   std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return x;
}
}  // namespace

int64_t hook_param_int(const HookParams& p, const std::string& hook, const std::string& key,
                       int64_t fallback, int64_t lo, int64_t hi) {
  return hook_param_number<int64_t>(
      p, hook, key, fallback, lo, hi, "an integer",
      [](const std::string& v, size_t* used) { return std::stoll(v, used, 10); });
}

double hook_param_double(const HookParams& p, const std::string& hook, const std::string& key,
                         double fallback, double lo, double hi) {
  return hook_param_number<double>(
      p, hook, key, fallback, lo, hi, "a number",
      [](const std::string& v, size_t* used) { return std::stod(v, used); });
}

bool hook_param_bool(const HookParams& p, const std::string& hook, const std::string& key,
                     bool fallback) {
  auto it = p.find(key);
  if (it == p.end()) return fallback;
  const std::string& v = it->second;
  if (v == "1" || v == "true" || v == "on" || v == "yes") return true;
  if (v == "0" || v == "false" || v == "off" || v == "no") return false;
  throw bad_spec("hook '" + hook + "': " + key + "='" + v +
                 "' is not a boolean (1/0, true/false, on/off)");
}

void register_comm_hook(const std::string& name, std::vector<std::string> params,
                        HookFactory factory) {
  if (name.empty() || name.find_first_of(":,=") != std::string::npos)
    throw bad_spec("a hook name must be non-empty and free of ':', ',' and '=': '" + name + "'");
  std::lock_guard lk(registry_mutex());
  registry()[name] = {std::move(params), std::move(factory)};
}

std::vector<std::string> comm_hook_names() {
  std::lock_guard lk(registry_mutex());
  std::vector<std::string> v;
  for (const auto& [name, e] : registry()) v.push_back(name);
  return v;
}

std::unique_ptr<CommHook> make_comm_hook(const std::string& spec) {
  auto colon = spec.find(':');
  std::string name = spec.substr(0, colon);
  std::string rest = colon == std::string::npos ? "" : spec.substr(colon + 1);
  if (name == "fp16_wrap" || name == "bf16_wrap") {
    if (rest.empty())
      throw bad_spec("'" + name + "' wraps another hook: write " + name + ":<hook>, e.g. " + name +
                     ":allreduce");
    return make_compress_hook(name == "fp16_wrap" ? DType::f16 : DType::bf16, make_comm_hook(rest));
  }
  Entry entry;
  bool found = false;
  {
    std::lock_guard lk(registry_mutex());
    auto it = registry().find(name);
    if (it != registry().end()) {
      entry = it->second;
      found = true;
    }
  }
  // (accepted_names() takes the registry lock itself.)
  if (!found) throw bad_spec("unknown hook '" + name + "'; known: " + accepted_names());
  HookParams params;
  size_t at = 0;
  while (at < rest.size()) {
    size_t comma = rest.find(',', at);
    std::string kv = rest.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    at = comma == std::string::npos ? rest.size() : comma + 1;
    if (kv.empty()) continue;
    auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0)
      throw bad_spec("'" + kv + "' in '" + spec + "' is not key=value");
    std::string key = kv.substr(0, eq);
    bool known = false;
    for (const auto& p : entry.params) known = known || p == key;
    if (!known) {
      std::string list;
      for (const auto& p : entry.params) list += (list.empty() ? "" : ", ") + p;
      throw bad_spec("hook '" + name + "' has no parameter '" + key + "'; it takes " +
                     (list.empty() ? std::string("none") : list));
    }
    params[key] = kv.substr(eq + 1);
  }
  return entry.factory(params);
}

}  // namespace collie
