// comm/store/parse_int.h: the integer format both stores keep counters in
// (add): a decimal int64 and nothing else.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace collie::store_detail {

inline bool parse_i64(const std::string& s, int64_t& v) {
  // strtoll alone would also take leading blanks and a plus sign.
  if (s.empty() || !(s[0] == '-' || (s[0] >= '0' && s[0] <= '9'))) return false;
  char* end = nullptr;
  errno = 0;
  long long x = std::strtoll(s.c_str(), &end, 10);
  // (The end, not a NUL inside: "7\0x" is not a number.)
  if (end != s.c_str() + s.size() || errno == ERANGE) return false;
  v = x;
  return true;
}

}  // namespace collie::store_detail
