// tests/push_after_failure.cc: a rank whose all-reduce fails gets its
// buffer back with no peer still writing into it. shm's direct all-reduce
// pushes each rank's reduced slice into the others' buffers
// (process_vm_writev); a peer still pushing when this rank's op failed must
// stop, and this rank wait for it, before the op returns (a review found
// the late write: 2097152 of 4194304 elements changed after the failed op
// had returned).
//
//   push_after_failure DIR     (collie-run -n 2, COLLIE_BACKEND=shm,
//                               COLLIE_TIMEOUT=1)
//
// Rank 1's first write into rank 0's buffer in the second all-reduce of
// 16 MiB stalls for 2 s before it writes (this program's
// process_vm_writev, which libcollie's call binds to), so rank 0's op times
// out meanwhile. Rank 0 then fills its buffer with 7, waits until rank 1's
// op has returned too (rank 1 creates DIR/push_after_failure.<pid of rank
// 0>), and every element must still be 7.
//
// Exit status: 0 as expected; 2 usage; 3 the scenario did not happen (rank
// 0's op did not fail, or a setup step did); 4 rank 0's buffer changed
// after its op returned.
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "collie/comm.h"

using namespace collie;

namespace {
std::atomic<bool> stall_next_write{false};
}

// Every process_vm_writev of this process, libcollie's included: the first
// one after stall_next_write is set waits 2 s, then writes.
extern "C" ssize_t process_vm_writev(pid_t pid, const iovec* local, unsigned long nlocal,
                                     const iovec* remote, unsigned long nremote,
                                     unsigned long flags) {
  if (stall_next_write.exchange(false)) std::this_thread::sleep_for(std::chrono::seconds(2));
  return syscall(SYS_process_vm_writev, pid, local, nlocal, remote, nremote, flags);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: push_after_failure DIR\n");
    return 2;
  }
  std::unique_ptr<Communicator> c;
  int64_t token = 0;
  try {
    c = connect();
    if (c->size() != 2 || c->backend() != "shm") {
      std::printf("push_after_failure: needs 2 ranks on shm, has %d on %s\n", c->size(),
                  c->backend().c_str());
      return 3;
    }
    token = c->rank() == 0 ? getpid() : 0;
    c->allreduce(view_of(&token, 1), ReduceOp::sum).wait();
  } catch (const Error& e) {
    std::printf("push_after_failure: setup failed: %s\n", e.what());
    return 3;
  }
  const int rank = c->rank();
  const std::string done = std::string(argv[1]) + "/push_after_failure." + std::to_string(token);
  const size_t n = size_t{4} << 20;  // 16 MiB of f32: the direct path
  std::vector<float> buf(n, 1.0f);
  if (rank == 1) stall_next_write = true;
  bool failed = false;
  try {
    c->allreduce(view_of(buf.data(), n), ReduceOp::sum).wait();
  } catch (const Error& e) {
    failed = true;
    std::printf("rank %d: the all-reduce failed, as it may: %.200s\n", rank, e.what());
  }
  std::fflush(stdout);
  if (rank == 1) {
    std::ofstream(done) << "done\n";
    return 0;
  }
  if (!failed) {
    std::printf("push_after_failure: rank 0's all-reduce did not fail\n");
    return 3;
  }
  for (float& x : buf) x = 7.0f;  // the buffer is the caller's again
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!std::ifstream(done)) {
    if (std::chrono::steady_clock::now() > give_up) {
      std::printf("push_after_failure: rank 1 never said its op had returned\n");
      return 3;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::remove(done.c_str());
  size_t changed = 0;
  for (float x : buf) changed += x != 7.0f;
  std::printf("rank 0: %zu of %zu elements changed after the failed all-reduce returned\n", changed,
              n);
  return changed ? 4 : 0;
}
