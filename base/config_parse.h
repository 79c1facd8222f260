// base/config_parse.h: how base/config.cc and base/tuning.cc read a
// variable's value: integers, sizes with K, M or G, numbers, each refused
// with the variable's name and what to set it to. Only those two include it.
#pragma once

#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "collie/error.h"

namespace collie::config::detail {

inline Error bad(const std::string& msg) {
  return Error(ErrorCode::invalid_argument, msg);
}

// The most ranks (and ranks on one host) a job may have.
inline constexpr long long kMaxRanks = 1 << 20;

inline std::optional<long long> parse_int(const char* name, const char* value) {
  if (!value) return std::nullopt;
  std::string_view v(value);
  if (v.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  long long x = std::strtoll(value, &end, 10);
  if (*end != '\0' || errno == ERANGE)
    throw bad(std::string(name) + "='" + value + "' is not an integer; set it to a whole number");
  return x;
}

// A size in bytes: a whole number with an optional K, M or G (1K = 1024),
// as collie-bench's sizes are written: 262144 or 256K.
inline std::optional<long long> parse_bytes(const char* name, const char* value) {
  if (!value || !*value) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  long long x = std::strtoll(value, &end, 10);
  int shift = 0;
  if (end != value) {
    switch (*end) {
      case 'K':
      case 'k':
        shift = 10;
        break;
      case 'M':
      case 'm':
        shift = 20;
        break;
      case 'G':
      case 'g':
        shift = 30;
        break;
      default:
        break;
    }
    if (shift) ++end;
  }
  if (end == value || *end != '\0' || errno == ERANGE ||
      (shift && (x < 0 || x > (LLONG_MAX >> shift))))
    throw bad(std::string(name) + "='" + value +
              "' is not a size; set it to a whole number of bytes, with an optional K, M or G "
              "(262144 or 256K)");
  return x << shift;
}

inline std::optional<double> parse_double(const char* name, const char* value) {
  if (!value || !*value) return std::nullopt;
  char* end = nullptr;
  double x = std::strtod(value, &end);
  if (*end != '\0' || !std::isfinite(x))
    throw bad(std::string(name) + "='" + value + "' is not a number");
  return x;
}

}  // namespace collie::config::detail
