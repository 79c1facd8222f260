// base/log.h: collie's one logging facility. COLLIE_DEBUG=INFO or DEBUG
// turns it up; warnings always print. Lines go to stderr with the rank.
#pragma once

#include <chrono>
#include <cstdio>
#include <string>

namespace collie::log {

enum class Level { warn = 0, info = 1, debug = 2 };

bool enabled(Level l);
void write(Level l, const std::string& msg);
inline void warn(const std::string& m) {
  write(Level::warn, m);
}
inline void info(const std::string& m) {
  if (enabled(Level::info)) write(Level::info, m);
}
inline void debug(const std::string& m) {
  if (enabled(Level::debug)) write(Level::debug, m);
}

// A deadline as messages give it: "300 s", "0.3 s".
inline std::string seconds(std::chrono::milliseconds t) {
  char s[32];
  std::snprintf(s, sizeof s, "%g s", static_cast<double>(t.count()) / 1000.0);
  return s;
}

}  // namespace collie::log
