// tests/mp_test.h: what the GoogleTest suites that run under collie-run
// share: the process's communicator (connected once, from the launcher's
// variables) and the message of the collie::Error a call throws.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "collie/comm.h"
#include "hooks/comm_hook.h"

namespace collie::testing {

inline Communicator& world() {
  static std::unique_ptr<Communicator> c = connect();
  return *c;
}

// The message of the collie::Error that fn throws, or "no error".
inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

// Whether this build has PowerSGD (it needs BLAS); tests skip it otherwise.
inline bool have_powersgd() {
  try {
    make_comm_hook("powersgd:start_iter=2");
    return true;
  } catch (const Error& e) {
    if (e.code() == ErrorCode::unavailable) return false;
    throw;
  }
}

}  // namespace collie::testing
