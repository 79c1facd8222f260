// comm/core/log.h: collie's one logging facility. COLLIE_DEBUG=INFO or DEBUG
// turns it up; warnings always print. Lines go to stderr with the rank.
#pragma once

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

}  // namespace collie::log
