// tests/fake_env.h: a made-up environment for base/config.h's readers, and
// the error a call throws, as "<code>: <message>": what the configuration
// and topology tests share.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "base/config.h"
#include "collie/error.h"

namespace collie::testing {

inline config::Env fake(std::map<std::string, std::string> vars) {
  auto shared = std::make_shared<std::map<std::string, std::string>>(std::move(vars));
  return [shared](const char* name) -> const char* {
    auto it = shared->find(name);
    return it == shared->end() ? nullptr : it->second.c_str();
  };
}

inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return std::string(to_string(e.code())) + ": " + e.what();
  }
  return "no error";
}

}  // namespace collie::testing
