// base/shared_file.h: memory that processes of one host share without
// a name: an anonymous memfd that one process makes and the others open
// through /proc/<pid>/fd/<fd>. Nothing ever appears in /dev/shm, so nothing
// is left behind however a job ends: the pages go with the last mapping.
// The shm backend's segment and buffers and the mpi backend's check area
// are made this way.
#pragma once

#include <cstddef>
#include <string>

namespace collie::shared_file {

struct Made {
  int fd = -1;  // the caller closes it once no peer needs to open it any more
  void* base = nullptr;
};

// A memfd called `name` (as /proc/<pid>/fd shows it) of `bytes` bytes,
// mapped read-write and shared. Throws
// collie::Error (unavailable): "<who>: memfd_create", "<who>: sizing <what>
// to N bytes", "<who>: mapping <what>".
Made create(const char* name, size_t bytes, const std::string& who, const std::string& what);

// Maps `bytes` of process `pid`'s memfd `fd`, opened through /proc (closed
// again once mapped). Throws collie::Error (unavailable): "<who>: opening
// <what> at <path><hint>", "<who>: mapping <what>".
void* open(long pid, int fd, size_t bytes, const std::string& who, const std::string& what,
           const std::string& hint = "");

}  // namespace collie::shared_file
