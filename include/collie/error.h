// collie/error.h: the one error type collie throws.
//
// Every failure a user can see is a collie::Error with a code (what kind of
// failure, for programs) and a message (what happened, which rank, what to
// change, for people). The C ABI maps the code to a status and keeps the
// message for collie_last_error().
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace collie {

enum class ErrorCode : int {
  timeout = 1,           // a deadline passed (op, rendezvous, store call)
  peer_lost = 2,         // a peer closed its connection or died
  invalid_argument = 3,  // the caller passed something unusable
  mismatch = 4,          // ranks disagree (count, dtype, op, collective)
  unavailable = 5,       // a backend or feature that was not built / not reachable
  internal = 6,          // a bug in collie or a system call that should not fail
  aborted = 7,           // the program aborted the communicator (Communicator::abort)
};
inline constexpr int kNumErrorCodes = 7;

std::string_view to_string(ErrorCode code);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

// Builds an Error whose message is "<what>: <strerror(errnum)>".
Error system_error(ErrorCode code, const std::string& what, int errnum);

}  // namespace collie
