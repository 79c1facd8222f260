// tests/mp_test.h: what the GoogleTest suites that run under collie-run
// share: the process's communicator (connected once, from the launcher's
// variables) and the message of the collie::Error a call throws.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "collie/comm.h"

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

}  // namespace collie::testing
