// comm/store/parse_int.h: the integer format both stores keep counters in
// (add): a decimal int64 and nothing else.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace collie::store_detail {

inline bool parse_i64(const std::string& s, int64_t& v) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  long long x = std::strtoll(s.c_str(), &end, 10);
  if (*end != '\0' || errno == ERANGE) return false;
  v = x;
  return true;
}

}  // namespace collie::store_detail
