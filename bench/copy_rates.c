// bench/copy_rates.c: how fast this machine moves N bytes each of the ways
// shm's large collectives can (comm/shm/steps_allreduce.h), without
// collie: memcpy within one process; process_vm_readv from another
// process (the direct path) into a buffer of N and into a scratch piece
// that stays in the cache; and memcpy out of a shared mapping another
// process has just written (the path of buffers in communicator memory).
// Prints each one's median over SAMPLES in GB/s of bytes copied.
//   copy_rates MIB SAMPLES PIECE_KIB
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int by_value(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static double median(double* v, int n) {
  qsort(v, (size_t)n, sizeof *v, by_value);
  return v[n / 2];
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: copy_rates MIB SAMPLES PIECE_KIB\n");
    return 2;
  }
  const size_t n = (size_t)atol(argv[1]) << 20, piece = (size_t)atol(argv[3]) << 10;
  const int samples = atoi(argv[2]);
  if (n == 0 || piece == 0 || samples < 1 || samples > 1000 || n % piece) {
    fprintf(stderr, "copy_rates: MIB, SAMPLES (1-1000) and PIECE_KIB (dividing MIB) > 0\n");
    return 2;
  }
  char* theirs = malloc(n);  // the child's private copy once it has written it
  char* shared = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  int go[2], done[2];
  if (!theirs || shared == MAP_FAILED || pipe(go) || pipe(done)) return 1;
  pid_t child = fork();
  if (child == 0) {  // writes its buffer once, then the shared one on each request
    close(go[1]);
    memset(theirs, 1, n);
    char c = 0;
    if (write(done[1], &c, 1) != 1) _exit(1);
    while (read(go[0], &c, 1) == 1) {
      memset(shared, c, n);
      if (write(done[1], &c, 1) != 1) _exit(1);
    }
    _exit(0);
  }
  char c;
  if (read(done[0], &c, 1) != 1) return 1;
  char* mine = malloc(n);
  char* dst = malloc(n);
  char* scratch = malloc(piece);
  if (!mine || !dst || !scratch) return 1;
  memset(mine, 2, n);
  memset(dst, 3, n);
  memset(scratch, 4, piece);
  double* t = calloc(4 * (size_t)samples, sizeof(double));
  for (int s = 0; s < samples; ++s) {
    double t0 = now();
    memcpy(dst, mine, n);
    t[s] = now() - t0;
    t0 = now();
    for (size_t off = 0; off < n; off += piece) {
      struct iovec local = {dst + off, piece}, remote = {theirs + off, piece};
      if (process_vm_readv(child, &local, 1, &remote, 1, 0) != (ssize_t)piece) return 1;
    }
    t[samples + s] = now() - t0;
    t0 = now();
    for (size_t off = 0; off < n; off += piece) {
      struct iovec local = {scratch, piece}, remote = {theirs + off, piece};
      if (process_vm_readv(child, &local, 1, &remote, 1, 0) != (ssize_t)piece) return 1;
    }
    t[2 * samples + s] = now() - t0;
    c = (char)(5 + s);
    if (write(go[1], &c, 1) != 1 || read(done[0], &c, 1) != 1) return 1;
    t0 = now();
    memcpy(dst, shared, n);
    t[3 * samples + s] = now() - t0;
  }
  const char* what[] = {"memcpy, own memory", "process_vm_readv into a buffer of N",
                        "process_vm_readv into a cached piece",
                        "memcpy from a peer's shared mapping"};
  printf("%zu MiB, %d samples, pieces of %zu KiB: median GB/s of bytes copied\n", n >> 20, samples,
         piece >> 10);
  for (int k = 0; k < 4; ++k)
    printf("  %-38s %6.2f GB/s\n", what[k], (double)n / median(t + k * samples, samples) / 1e9);
  close(go[1]);
  waitpid(child, NULL, 0);
  return 0;
}
