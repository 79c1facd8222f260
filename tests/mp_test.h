// tests/mp_test.h: what the GoogleTest suites that run under collie-run
// share: the process's communicator (connected once, from the launcher's
// variables) and the message of the collie::Error a call throws.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>

#include "collie/comm.h"
#include "hooks/comm_hook.h"

namespace collie::testing {

// The job's communicator. With COLLIE_EXPECT_BACKEND set (the multi-host
// tests set it), a communicator on any other backend ends the test program:
// the test is about what `auto` picks, not only about the results.
inline Communicator& world() {
  static std::unique_ptr<Communicator> c = [] {
    auto made = connect();
    const char* want = std::getenv("COLLIE_EXPECT_BACKEND");
    if (want && *want && made->backend() != want) {
      std::fprintf(stderr, "rank %d: the communicator runs on '%s', the test expects '%s'\n",
                   made->rank(), made->backend().c_str(), want);
      std::exit(3);
    }
    return made;
  }();
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
