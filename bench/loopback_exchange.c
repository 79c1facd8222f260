// bench/loopback_exchange.c: what the kernel does with two processes that
// send each other N bytes at once over loopback TCP, without collie: over
// one connection used both ways, or over two connections used one way
// each (comm/tcp/tcp_mesh.h's COLLIE_TCP_SPLIT_DIRECTIONS). Each sample is
// a 1-byte ping-pong and then the exchange, in PIECE-byte writes
// alternating with reads, both non-blocking in a busy loop; with COPY=1 each
// side also copies N bytes of its own first, as an all-to-all's own block.
// Prints the sample time's minimum, quartiles and maximum on rank 0.
//   loopback_exchange N SAMPLES PIECE WAYS   (WAYS: 1 one connection, 2 two)
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int by_value(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char** argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: loopback_exchange N SAMPLES PIECE WAYS\n");
    return 2;
  }
  const size_t n = strtoul(argv[1], NULL, 10), piece = strtoul(argv[3], NULL, 10);
  const int samples = atoi(argv[2]), ways = atoi(argv[4]);
  const int copy = getenv("COPY") && atoi(getenv("COPY")) == 1;
  if (n == 0 || samples < 1 || piece == 0 || (ways != 1 && ways != 2)) {
    fprintf(stderr, "loopback_exchange: N, SAMPLES and PIECE must be positive, WAYS 1 or 2\n");
    return 2;
  }
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (bind(listener, (struct sockaddr*)&a, sizeof a) || listen(listener, 2) ||
      getsockname(listener, (struct sockaddr*)&a, &len)) {
    perror("loopback_exchange: listen");
    return 1;
  }
  int rank, fd[2];
  if (fork() == 0) {
    rank = 1;
    for (int i = 0; i < 2; ++i) {
      fd[i] = socket(AF_INET, SOCK_STREAM, 0);
      if (connect(fd[i], (struct sockaddr*)&a, sizeof a)) {
        perror("loopback_exchange: connect");
        return 1;
      }
    }
  } else {
    rank = 0;
    for (int i = 0; i < 2; ++i) fd[i] = accept(listener, NULL, NULL);
  }
  for (int i = 0; i < 2; ++i) {
    int one = 1;
    setsockopt(fd[i], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    fcntl(fd[i], F_SETFL, O_NONBLOCK);
  }
  // Connection 0 carries rank 0's data, connection 1 rank 1's (WAYS 2).
  const int out = ways == 2 ? fd[rank] : fd[0], in = ways == 2 ? fd[1 - rank] : fd[0];
  char *src = malloc(2 * n), *dst = malloc(2 * n);
  double* t = malloc(sizeof(double) * samples);
  if (!src || !dst || !t) return 1;
  memset(src, 1, 2 * n);
  memset(dst, 0, 2 * n);
  for (int s = -5; s < samples; ++s) {  // 5 warm-ups
    char c = 'x';
    if (rank == 0) {
      while (send(fd[0], &c, 1, 0) != 1) {
      }
      while (recv(fd[0], &c, 1, 0) != 1) {
      }
    } else {
      while (recv(fd[0], &c, 1, 0) != 1) {
      }
      while (send(fd[0], &c, 1, 0) != 1) {
      }
    }
    const double t0 = now_us();
    if (copy) memcpy(dst + n, src + n, n);
    size_t sent = 0, got = 0;
    while (sent < n || got < n) {
      if (sent < n) {
        size_t w = n - sent < piece ? n - sent : piece;
        ssize_t k = send(out, src + sent, w, MSG_NOSIGNAL);
        if (k > 0) sent += (size_t)k;
      }
      if (got < n) {
        ssize_t k = recv(in, dst + got, n - got, 0);
        if (k > 0) got += (size_t)k;
      }
    }
    if (s >= 0) t[s] = now_us() - t0;
  }
  if (rank == 1) return 0;
  wait(NULL);
  qsort(t, (size_t)samples, sizeof(double), by_value);
  printf("%zu B each way, %zu B writes, %s: min %.0f p25 %.0f median %.0f p75 %.0f max %.0f us\n",
         n, piece, ways == 2 ? "one connection per direction" : "one connection both ways", t[0],
         t[samples / 4], t[samples / 2], t[3 * samples / 4], t[samples - 1]);
  return 0;
}
