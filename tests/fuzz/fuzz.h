// tests/fuzz/fuzz.h: what every fuzz target shares: how an input's outcome is
// judged.
//
// A target feeds bytes from outside (a frame header, a checkpoint, a hook
// spec, an environment) to the code that parses them. Two outcomes are
// expected: the input is accepted, and then the target checks what came of
// it against the code's contract (a reference computation, a round trip);
// or the library refuses it with its own clear error, a collie::Error of an
// expected code with a message. Anything else is a finding: another
// exception, a broken contract (FUZZ_CHECK), a crash, a hang (libFuzzer's
// -timeout), a leak or a sanitizer report. A finding aborts, so that
// libFuzzer keeps the input, and the replay driver's test fails.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <initializer_list>
#include <string>
#include <typeinfo>
#include <vector>

#include "collie/error.h"

namespace collie::fuzz {

[[noreturn]] inline void finding(const std::string& what) {
  std::fprintf(stderr, "fuzz finding: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

#define FUZZ_CHECK(cond, what)                                                         \
  do {                                                                                 \
    if (!(cond))                                                                       \
      ::collie::fuzz::finding(std::string(__FILE__) + ":" + std::to_string(__LINE__) + \
                              ": " #cond ": " + std::string(what));                    \
  } while (0)

// Runs `f`. Returns true when it returns, false when it throws a clear error:
// a collie::Error whose code is one of `expected`, with a message. Any other
// exception is a finding.
template <typename F>
bool accepted(F&& f, std::initializer_list<ErrorCode> expected = {ErrorCode::invalid_argument}) {
  try {
    f();
    return true;
  } catch (const Error& e) {
    bool known = false;
    for (ErrorCode c : expected) known = known || c == e.code();
    if (!known)
      finding("an error of code " + std::string(to_string(e.code())) +
              ", which this input should not get: " + e.what());
    if (std::string(e.what()).empty()) finding("an error without a message");
    return false;
  } catch (const std::exception& e) {
    finding(std::string("an exception that is not collie::Error (") + typeid(e).name() +
            "): " + e.what());
  } catch (...) {
    finding("an exception that is not a std::exception");
  }
}

// Reads the input piece by piece; past the end, every read gives zeros.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t byte() { return at_ < size_ ? data_[at_++] : 0; }
  // The next line (up to '\n', which is dropped), or the rest.
  std::string line() {
    std::string s;
    while (at_ < size_ && data_[at_] != '\n') s += static_cast<char>(data_[at_++]);
    if (at_ < size_) ++at_;
    return s;
  }
  std::vector<uint8_t> rest() {
    std::vector<uint8_t> v(data_ + at_, data_ + size_);
    at_ = size_;
    return v;
  }
  bool empty() const { return at_ >= size_; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
};

}  // namespace collie::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
