#include "collie/error.h"

#include <cstring>

namespace collie {

std::string_view to_string(ErrorCode code) {
  switch (code) {
    case ErrorCode::timeout:
      return "timeout";
    case ErrorCode::peer_lost:
      return "peer_lost";
    case ErrorCode::invalid_argument:
      return "invalid_argument";
    case ErrorCode::mismatch:
      return "mismatch";
    case ErrorCode::unavailable:
      return "unavailable";
    case ErrorCode::internal:
      return "internal";
    case ErrorCode::aborted:
      return "aborted";
  }
  return "unknown";
}

Error system_error(ErrorCode code, const std::string& what, int errnum) {
  return Error(code, what + ": " + std::strerror(errnum));
}

}  // namespace collie
