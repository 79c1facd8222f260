// comm/launch/process.h: collie-run's small process helpers: a fresh job
// secret, writes that survive EINTR, and how a rank ended, in words and as
// an exit code.
#pragma once

#include <string>

namespace collie::launch {

// 128 random bits as 32 hex digits (getrandom).
std::string random_secret();
// Writes all of `s` to `fd`, retrying on EINTR; gives up quietly when the
// reader is gone (our own output: the job goes on).
void write_all(int fd, const std::string& s);
// "SIGTERM", or the number when the signal has no name.
std::string signal_name(int sig);
// A wait status in words: "exited with status 3", "was killed by signal SIGKILL".
std::string describe(int status);
// A wait status as a shell's exit code (128 + the signal when killed).
int exit_code(int status);

}  // namespace collie::launch
