// base/shared_file.cc: making, opening and mapping unnamed memfds.
#include "base/shared_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

#include "collie/error.h"

namespace collie::shared_file {

namespace {

void* map(int fd, size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return p == MAP_FAILED ? nullptr : p;
}

}  // namespace

Made create(const char* name, size_t bytes, const std::string& who, const std::string& what) {
  int fd = static_cast<int>(syscall(SYS_memfd_create, name, MFD_CLOEXEC));
  if (fd < 0) throw system_error(ErrorCode::unavailable, who + ": memfd_create", errno);
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    int err = errno;
    ::close(fd);
    throw system_error(ErrorCode::unavailable,
                       who + ": sizing " + what + " to " + std::to_string(bytes) + " bytes", err);
  }
  void* p = map(fd, bytes);
  if (!p) {
    int err = errno;
    ::close(fd);
    throw system_error(ErrorCode::unavailable, who + ": mapping " + what, err);
  }
  return {fd, p};
}

void* open(long pid, int fd, size_t bytes, const std::string& who, const std::string& what,
           const std::string& hint) {
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  int mine = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (mine < 0)
    throw system_error(ErrorCode::unavailable, who + ": opening " + what + " at " + path + hint,
                       errno);
  void* p = map(mine, bytes);
  int err = errno;
  ::close(mine);
  if (!p) throw system_error(ErrorCode::unavailable, who + ": mapping " + what, err);
  return p;
}

}  // namespace collie::shared_file
