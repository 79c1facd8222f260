#include "base/log.h"

#include <cstdio>

#include "base/config.h"

namespace collie::log {

namespace {
int level() {
  static const int v = config::log_level(config::process_env());
  return v;
}
}  // namespace

bool enabled(Level l) {
  return static_cast<int>(l) <= level();
}

void write(Level l, const std::string& msg) {
  static constexpr const char* kNames[] = {"WARN", "INFO", "DEBUG"};
  std::fprintf(stderr, "collie %s: %s\n", kNames[static_cast<int>(l)], msg.c_str());
}

}  // namespace collie::log
