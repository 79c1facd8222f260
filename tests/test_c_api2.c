/* tests/test_c_api2.c: what ABI 2 added to the C ABI, from C: every
 * collective blocking and with a handle, reduce_scatter, send/recv, split,
 * the in-progress status, abort and the asynchronous error, versioned
 * structs, and for engines: gradients that move (set_to_none), the layout
 * generation with stale views refused, bucket memory from the engine's
 * allocator, and DDP's semantics (gradients that arrive twice, unused ones
 * exchanged, a joined rank, the error for a gradient that never came); and
 * collie_convert, the kernel of compression hooks. Results against exact
 * references. Run under collie-run at 2 and 3 ranks. */
#define _POSIX_C_SOURCE 199309L /* nanosleep */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "c_check.h"
#include "collie/collie.h"

static collie_tensor f32(float* p, uint64_t n) {
  collie_tensor t = {p, n, COLLIE_F32, COLLIE_CPU, 0};
  return t;
}

struct alloc_books {
  int allocations;
  atomic_int releases; /* the reducer's last continuation may release on its own thread */
};

static void* book_alloc(void* user, size_t bytes, int32_t dtype, int32_t dev, int32_t idx) {
  struct alloc_books* b = (struct alloc_books*)user;
  (void)dtype;
  (void)idx;
  if (dev != COLLIE_CPU) return NULL;
  void* p = aligned_alloc(64, (bytes + 63) / 64 * 64);
  memset(p, 0, bytes);
  ++b->allocations;
  return p;
}

static void book_release(void* user, void* p, size_t bytes, int32_t dev, int32_t idx) {
  struct alloc_books* b = (struct alloc_books*)user;
  (void)bytes;
  (void)dev;
  (void)idx;
  atomic_fetch_add(&b->releases, 1);
  free(p);
}

static void count_completion(void* user, collie_status status, const char* message) {
  (void)message;
  if (status == COLLIE_OK) ++*(int*)user;
}

int main(void) {
  collie_comm_options o = COLLIE_COMM_OPTIONS_INIT;
  o.backend = "tcp";
  o.timeout_seconds = 60;
  collie_comm* comm = NULL;
  OK(collie_comm_connect(&o, &comm));
  int rank = 0, size = 0;
  OK(collie_comm_rank(comm, &rank));
  OK(collie_comm_size(comm, &size));
  const char* backend = NULL;
  OK(collie_comm_backend(comm, &backend));
  CHECK(backend && strcmp(backend, "tcp") == 0, "backend %s", backend ? backend : "(null)");

  /* A struct with neither a tag nor ABI 1's size is refused, saying how to
   * initialise it. */
  {
    collie_comm_options junk;
    memset(&junk, 0, sizeof junk);
    junk.struct_size = 20;
    collie_comm* none = NULL;
    CHECK(collie_comm_connect(&junk, &none) == COLLIE_ERR_INVALID_ARGUMENT && none == NULL,
          "untagged options of 20 bytes");
    CHECK(strstr(collie_last_error(), "COLLIE_COMM_OPTIONS_INIT") != NULL, "message: %s",
          collie_last_error());
  }

  /* reduce_scatter with a handle: rank r contributes (r + 1) * (i + 1) at
   * element i of size x 3; block q of the sum is sum_r (r + 1) * (3q + k + 1). */
  {
    float in[3 * 16], out[3];
    for (int i = 0; i < 3 * size; ++i) in[i] = (float)((rank + 1) * (i + 1));
    collie_work* w = NULL;
    OK(collie_comm_reduce_scatter(comm, f32(in, 3 * (uint64_t)size), f32(out, 3), COLLIE_SUM, &w));
    collie_status q = collie_work_query(w);
    CHECK(q == COLLIE_IN_PROGRESS || q == COLLIE_OK, "query while running: %d", (int)q);
    OK(collie_work_wait_for(w, 60));
    CHECK(collie_work_query(w) == COLLIE_OK, "query after the end");
    OK(collie_work_free(w));
    const double ranks_sum = size * (size + 1) / 2.0;
    for (int k = 0; k < 3; ++k)
      CHECK(out[k] == (float)(ranks_sum * (3 * rank + k + 1)), "reduce_scatter %d: %g", k, out[k]);
  }

  /* alltoall: element k of the block rank r sends rank j is 100r + 10j + k;
   * then alltoallv, rank r sending rank j (r + j) % 3 elements, blocking,
   * and a completion callback on the first. */
  {
    float in[2 * 16], out[2 * 16];
    for (int j = 0; j < size; ++j)
      for (int k = 0; k < 2; ++k) in[2 * j + k] = (float)(100 * rank + 10 * j + k);
    collie_work* w = NULL;
    OK(collie_comm_alltoall(comm, f32(in, 2 * (uint64_t)size), f32(out, 2 * (uint64_t)size), &w));
    int called = 0;
    OK(collie_work_wait(w));
    OK(collie_work_on_complete(w, count_completion, &called));
    CHECK(called == 1, "a completion registered after the end runs at once: %d", called);
    OK(collie_work_free(w));
    for (int q = 0; q < size; ++q)
      for (int k = 0; k < 2; ++k)
        CHECK(out[2 * q + k] == (float)(100 * q + 10 * rank + k), "alltoall from %d: %g", q,
              out[2 * q + k]);
    size_t sc[16], rc[16];
    uint64_t ns = 0, nr = 0;
    float vin[3 * 16], vout[3 * 16];
    for (int j = 0; j < size; ++j) {
      sc[j] = (size_t)((rank + j) % 3);
      rc[j] = (size_t)((j + rank) % 3);
      for (size_t k = 0; k < sc[j]; ++k) vin[ns++] = (float)(100 * rank + 10 * j + (int)k);
      nr += rc[j];
    }
    OK(collie_comm_alltoallv(comm, f32(vin, ns), sc, f32(vout, nr), rc, NULL));
    uint64_t at = 0;
    for (int q = 0; q < size; ++q)
      for (size_t k = 0; k < rc[q]; ++k, ++at)
        CHECK(vout[at] == (float)(100 * q + 10 * rank + (int)k), "alltoallv from %d: %g", q,
              vout[at]);
  }

  /* A ring of sends and receives, both posted before either is waited for. */
  {
    float send_buf[4], recv_buf[4];
    for (int i = 0; i < 4; ++i) send_buf[i] = (float)(100 * rank + i);
    collie_work *s = NULL, *r = NULL;
    OK(collie_comm_send(comm, f32(send_buf, 4), (rank + 1) % size, 7, &s));
    OK(collie_comm_recv(comm, f32(recv_buf, 4), (rank + size - 1) % size, 7, &r));
    OK(collie_work_wait(s));
    OK(collie_work_wait(r));
    collie_work_free(s);
    collie_work_free(r);
    int left = (rank + size - 1) % size;
    for (int i = 0; i < 4; ++i)
      CHECK(recv_buf[i] == (float)(100 * left + i), "recv %d: %g", i, recv_buf[i]);
  }

  /* broadcast, allgather and barrier, blocking. */
  {
    float v[2] = {(float)rank, (float)rank};
    OK(collie_comm_broadcast(comm, f32(v, 2), size - 1, NULL));
    CHECK(v[0] == (float)(size - 1) && v[1] == (float)(size - 1), "broadcast %g", v[0]);
    float mine = (float)rank * 2, all[16];
    OK(collie_comm_allgather(comm, f32(&mine, 1), f32(all, (uint64_t)size), NULL));
    for (int q = 0; q < size; ++q) CHECK(all[q] == (float)(2 * q), "allgather %d", q);
    OK(collie_comm_barrier(comm, NULL));
  }

  /* communicator memory: zeroed, aligned, reduced in place, freed once. */
  {
    const uint64_t n = 100003;
    void* mem = NULL;
    OK(collie_comm_mem_alloc(comm, n * sizeof(float), &mem));
    CHECK(mem != NULL && (uintptr_t)mem % 64 == 0, "mem_alloc gave %p", mem);
    float* x = (float*)mem;
    int nonzero = 0;
    for (uint64_t i = 0; i < n; ++i) nonzero += x[i] != 0.0f;
    CHECK(nonzero == 0, "%d elements not zeroed", nonzero);
    for (uint64_t i = 0; i < n; ++i) x[i] = (float)(rank + (int)(i % 5));
    OK(collie_comm_allreduce(comm, f32(x, n), f32(x, n), COLLIE_SUM, NULL));
    int wrong = 0;
    for (uint64_t i = 0; i < n; ++i)
      wrong += x[i] != (float)(size * (size - 1) / 2 + size * (int)(i % 5));
    CHECK(wrong == 0, "%d wrong sums in communicator memory", wrong);
    OK(collie_mem_free(mem));
    CHECK(collie_mem_free(mem) == COLLIE_ERR_INVALID_ARGUMENT, "a second free was accepted");
    CHECK(strstr(collie_last_error(), "collie_comm_mem_alloc") != NULL, "message: %s",
          collie_last_error());
    float local = 0;
    CHECK(collie_mem_free(&local) == COLLIE_ERR_INVALID_ARGUMENT, "a stack pointer was freed");
    OK(collie_mem_free(NULL));
  }

  /* collie_convert: f32 to f16 and bf16 divided by 3 and back, against
   * known answers (whole numbers, exact in both; 1/3 rounded to nearest
   * even: f16 0x3555, bf16 0x3eab); and the errors. */
  {
    enum { N = 1029 };
    static float src[N], back[N];
    static uint16_t half[N];
    for (int i = 0; i < N; ++i) src[i] = (float)(3 * (i % 512 - 256));
    src[N - 1] = 1.0f;
    const int32_t types[2] = {COLLIE_F16, COLLIE_BF16};
    const uint16_t third[2] = {0x3555, 0x3eab};
    for (int k = 0; k < 2; ++k) {
      collie_tensor h = {half, N, types[k], COLLIE_CPU, 0};
      OK(collie_convert(f32(src, N), h, 3));
      OK(collie_convert(h, f32(back, N), 1));
      int wrong = 0;
      for (int i = 0; i + 1 < N; ++i) wrong += back[i] != (float)(i % 512 - 256);
      CHECK(wrong == 0, "%d wrong conversions to dtype %d and back", wrong, types[k]);
      CHECK(half[N - 1] == third[k], "1/3 as dtype %d: 0x%04x", types[k], half[N - 1]);
    }
    collie_tensor h = {half, N - 1, COLLIE_F16, COLLIE_CPU, 0};
    CHECK(collie_convert(f32(src, N), h, 1) == COLLIE_ERR_INVALID_ARGUMENT &&
              strstr(collie_last_error(), "src has 1029 elements, dst 1028") != NULL,
          "lengths: %s", collie_last_error());
    h.numel = N;
    CHECK(collie_convert(f32(src, N), h, 0) == COLLIE_ERR_INVALID_ARGUMENT &&
              strstr(collie_last_error(), "divisor 0 is below 1") != NULL,
          "divisor: %s", collie_last_error());
    collie_tensor inside = {src + 1, 8, COLLIE_F16, COLLIE_CPU, 0};
    CHECK(collie_convert(f32(src, 8), inside, 1) == COLLIE_ERR_INVALID_ARGUMENT &&
              strstr(collie_last_error(), "overlap") != NULL,
          "overlap: %s", collie_last_error());
    collie_tensor ints = {half, N / 2, COLLIE_I32, COLLIE_CPU, 0};
    CHECK(collie_convert(f32(src, N / 2), ints, 1) == COLLIE_ERR_INVALID_ARGUMENT &&
              strstr(collie_last_error(), "float types only") != NULL,
          "ints: %s", collie_last_error());
  }

  /* split by parity; then abort the odd-free group on rank 0 and see every
   * member fail with the cause, while the world goes on. */
  {
    collie_comm* half = NULL;
    OK(collie_comm_split(comm, rank % 2, rank, &half));
    CHECK(half != NULL, "split");
    int hrank = -1, hsize = 0;
    OK(collie_comm_rank(half, &hrank));
    OK(collie_comm_size(half, &hsize));
    CHECK(hsize == (size + 1 - rank % 2) / 2 && hrank == rank / 2, "split rank %d of %d", hrank,
          hsize);
    float one = 1.0f;
    OK(collie_comm_allreduce(half, f32(&one, 1), f32(&one, 1), COLLIE_SUM, NULL));
    CHECK(one == (float)hsize, "allreduce in the half: %g", one);
    OK(collie_comm_destroy(half));

    collie_comm* group = NULL;
    OK(collie_comm_split(comm, 0, rank, &group));
    OK(collie_comm_get_async_error(group));
    if (rank == 0) {
      OK(collie_comm_abort(group, "stopped from C"));
      collie_status st = collie_comm_get_async_error(group);
      CHECK(st == COLLIE_ERR_ABORTED, "async error after abort: %d", (int)st);
      CHECK(strstr(collie_last_error(), "stopped from C") != NULL, "message: %s",
            collie_last_error());
    }
    float x = 1.0f;
    collie_status st = collie_comm_allreduce(group, f32(&x, 1), f32(&x, 1), COLLIE_SUM, NULL);
    CHECK(st == COLLIE_ERR_ABORTED, "allreduce on the aborted group: %d (%s)", (int)st,
          collie_last_error());
    CHECK(strstr(collie_last_error(), "stopped from C") != NULL, "message: %s",
          collie_last_error());
    OK(collie_comm_destroy(group));
    OK(collie_comm_barrier(comm, NULL));
  }

  /* Copy mode with gradients that move: no buffers at creation, a fresh one
   * every step, passed at mark time; the freed ones are never written. */
  {
    float a[5] = {0}, b[3] = {0};
    collie_tensor params[2] = {f32(a, 5), f32(b, 3)};
    collie_reducer_options ro = COLLIE_REDUCER_OPTIONS_INIT;
    collie_reducer* red = NULL;
    OK(collie_reducer_create(comm, params, NULL, 2, &ro, &red));
    for (int step = 0; step < 4; ++step) {
      float* g0 = (float*)malloc(5 * sizeof(float));
      float* g1 = (float*)malloc(3 * sizeof(float));
      for (int k = 0; k < 5; ++k) g0[k] = (float)(rank + step + k);
      for (int k = 0; k < 3; ++k) g1[k] = (float)(2 * rank - k);
      OK(collie_reducer_prepare(red, NULL, 0));
      OK(collie_reducer_mark_ready_grad(red, 1, f32(g1, 3)));
      OK(collie_reducer_mark_ready_grad(red, 0, f32(g0, 5)));
      OK(collie_reducer_finalize(red));
      for (int k = 0; k < 5; ++k)
        CHECK(g0[k] == (float)((size - 1) / 2.0 + step + k), "moving grad 0[%d] %g", k, g0[k]);
      for (int k = 0; k < 3; ++k)
        CHECK(g1[k] == (float)((size - 1) - k), "moving grad 1[%d] %g", k, g1[k]);
      OK(collie_reducer_set_grad(red, 0, NULL)); /* set_to_none */
      OK(collie_reducer_set_grad(red, 1, NULL));
      free(g0);
      free(g1);
    }
    OK(collie_reducer_prepare(red, NULL, 0));
    CHECK(collie_reducer_mark_ready(red, 0) == COLLIE_ERR_INVALID_ARGUMENT,
          "marking a gradient that has no buffer");
    CHECK(strstr(collie_last_error(), "no buffer") != NULL, "message: %s", collie_last_error());
    OK(collie_reducer_destroy(red));
  }

  /* DDP's semantics, the reducer's for every engine: "shared" arrives
   * twice per backward (its sum is sent once), "rare" only on rank 0 (the
   * others get its average), "idle" on no rank (left as it was); the last
   * rank joins (shadows) the third step; without find_unused_parameters a
   * gradient that never arrives is an error naming it. */
  {
    float w[2] = {0}, shared[2] = {0}, rare[2] = {0}, idle[2] = {0};
    float gw[2], gs[2], gr[2], gi[2];
    collie_tensor params[4] = {f32(w, 2), f32(shared, 2), f32(rare, 2), f32(idle, 2)};
    collie_tensor grads[4] = {f32(gw, 2), f32(gs, 2), f32(gr, 2), f32(gi, 2)};
    const char* names[4] = {"w", "shared", "rare", "idle"};
    collie_reducer_options ro = COLLIE_REDUCER_OPTIONS_INIT;
    ro.find_unused_parameters = 1;
    ro.param_names = names;
    collie_reducer* red = NULL;
    OK(collie_reducer_create(comm, params, grads, 4, &ro, &red));
    for (int step = 0; step < 3; ++step) {
      int joined = step == 2 && size > 1 && rank == size - 1;
      gr[0] = gr[1] = -1.0f;
      gi[0] = gi[1] = 7.0f;
      if (joined) {
        OK(collie_reducer_join_step(red));
        CHECK(gi[0] == 7.0f && gr[0] == -1.0f, "a joined rank's gradients were written");
        continue;
      }
      OK(collie_reducer_prepare(red, NULL, 0));
      gw[0] = gw[1] = (float)(rank + 1);
      OK(collie_reducer_mark_ready(red, 0));
      gs[0] = gs[1] = 1.0f;
      OK(collie_reducer_mark_ready(red, 1));
      gs[0] = gs[1] = 1.0f + (float)rank; /* accumulated: the second arrival */
      OK(collie_reducer_mark_ready(red, 1));
      if (rank == 0) {
        gr[0] = gr[1] = 6.0f;
        OK(collie_reducer_mark_ready(red, 2));
      }
      OK(collie_reducer_finalize(red));
      int trained = step == 2 && size > 1 ? size - 1 : size;
      CHECK(gw[0] == (float)(trained * (trained + 1) / 2) / (float)size, "w: %g", gw[0]);
      CHECK(gs[1] == (float)(trained + trained * (trained - 1) / 2) / (float)size, "shared: %g",
            gs[1]);
      CHECK(gr[0] == 6.0f / (float)size, "rare on rank %d: %g", rank, gr[0]);
      CHECK(gi[0] == 7.0f, "idle was written: %g", gi[0]);
      uint8_t use[4];
      OK(collie_reducer_param_use(red, use, 4));
      CHECK(use[0] == 0 && use[1] == 0 && use[3] == 2 && use[2] == (rank == 0 ? 0 : 1),
            "param_use %d %d %d %d", use[0], use[1], use[2], use[3]);
      collie_tensor avg;
      OK(collie_reducer_bucket_grad(red, 2, &avg));
      CHECK(((float*)avg.data)[1] == 6.0f / (float)size, "rare's bucket: %g",
            ((float*)avg.data)[1]);
    }
    OK(collie_reducer_destroy(red));

    collie_reducer_options strict = COLLIE_REDUCER_OPTIONS_INIT;
    strict.param_names = names;
    OK(collie_reducer_create(comm, params, grads, 4, &strict, &red));
    OK(collie_reducer_prepare(red, NULL, 0));
    OK(collie_reducer_mark_ready(red, 0));
    OK(collie_reducer_mark_ready(red, 1));
    CHECK(collie_reducer_finalize(red) == COLLIE_ERR_INVALID_ARGUMENT, "no error for no gradient");
    CHECK(strstr(collie_last_error(), "parameters rare, idle received no gradient") != NULL,
          "message: %s", collie_last_error());
    OK(collie_reducer_destroy(red));
    OK(collie_comm_barrier(comm, NULL));
  }

  /* Bucket views in the engine's memory: allocated once per stream, never
   * again; the layout generation moves at the rebuild, and a view kept from
   * before it is refused. */
  {
    struct alloc_books books;
    books.allocations = 0;
    atomic_init(&books.releases, 0);
    collie_allocator al = COLLIE_ALLOCATOR_INIT;
    al.allocate = book_alloc;
    al.release = book_release;
    al.user = &books;
    float a[6] = {0}, b[5] = {0}, c[4] = {0};
    collie_tensor params[3] = {f32(a, 6), f32(b, 5), f32(c, 4)};
    collie_reducer_options ro = COLLIE_REDUCER_OPTIONS_INIT;
    ro.gradient_as_bucket_view = 1;
    ro.first_bucket_bytes = 16;
    ro.bucket_bytes = 24;
    ro.bucket_allocator = &al;
    collie_reducer* red = NULL;
    OK(collie_reducer_create(comm, params, NULL, 3, &ro, &red));
    CHECK(books.allocations == 1, "allocations %d", books.allocations);
    collie_tensor before[3];
    for (size_t i = 0; i < 3; ++i) OK(collie_reducer_grad_view(red, i, &before[i]));
    uint64_t gen = 99;
    OK(collie_reducer_layout_generation(red, &gen));
    CHECK(gen == 0, "generation %llu before the first step", (unsigned long long)gen);
    for (int step = 0; step < 2; ++step) {
      OK(collie_reducer_prepare(red, NULL, 0));
      for (size_t i = 0; i < 3; ++i) { /* registration order: the rebuild reorders */
        collie_tensor g;
        OK(collie_reducer_grad_view(red, i, &g));
        for (uint64_t k = 0; k < g.numel; ++k) ((float*)g.data)[k] = (float)(rank * (i + 1) + k);
        OK(collie_reducer_mark_ready_grad(red, i, g));
      }
      OK(collie_reducer_finalize(red));
      for (size_t i = 0; i < 3; ++i) {
        collie_tensor g;
        OK(collie_reducer_grad_view(red, i, &g));
        for (uint64_t k = 0; k < g.numel; ++k)
          CHECK(((float*)g.data)[k] == (float)((size - 1) / 2.0 * (i + 1) + k), "view %zu[%llu]", i,
                (unsigned long long)k);
      }
    }
    collie_reducer_stats stats = COLLIE_REDUCER_STATS_INIT;
    OK(collie_reducer_get_stats(red, &stats));
    CHECK(stats.layout_generation == 1, "generation %llu after the rebuild",
          (unsigned long long)stats.layout_generation);
    CHECK(books.allocations == 1 && atomic_load(&books.releases) == 0, "allocations %d releases %d",
          books.allocations, atomic_load(&books.releases));
    size_t moved = 3;
    for (size_t i = 0; i < 3 && moved == 3; ++i) {
      collie_tensor now;
      OK(collie_reducer_grad_view(red, i, &now));
      if (now.data != before[i].data) moved = i;
    }
    CHECK(moved < 3, "the rebuild moved no gradient");
    if (moved < 3) {
      OK(collie_reducer_prepare(red, NULL, 0));
      CHECK(
          collie_reducer_mark_ready_grad(red, moved, before[moved]) == COLLIE_ERR_INVALID_ARGUMENT,
          "a stale view");
      CHECK(strstr(collie_last_error(), "layout generation 0") != NULL, "message: %s",
            collie_last_error());
      for (size_t i = 0; i < 3; ++i) OK(collie_reducer_mark_ready(red, i));
      OK(collie_reducer_finalize(red));
    }
    OK(collie_reducer_destroy(red));
    /* The last bucket's continuation may hold the memory a moment longer. */
    for (int i = 0; i < 5000 && atomic_load(&books.releases) == 0; ++i) {
      struct timespec ts = {0, 1000000};
      nanosleep(&ts, NULL);
    }
    CHECK(atomic_load(&books.releases) == 1, "releases %d after destroy",
          atomic_load(&books.releases));
  }

  int32_t f = failures;
  collie_tensor ft = {&f, 1, COLLIE_I32, COLLIE_CPU, 0};
  OK(collie_comm_allreduce(comm, ft, ft, COLLIE_SUM, NULL));
  OK(collie_comm_destroy(comm));

  /* A second job-wide communicator after the first is gone, as a Python
   * program that builds a second DDP does. Rank 0 served the first store on
   * the socket collie-run handed down, which died with it: the second must
   * serve on the port again rather than reuse a closed descriptor. */
  comm = NULL;
  OK(collie_comm_connect(&o, &comm));
  int32_t again = rank + 1;
  collie_tensor at = {&again, 1, COLLIE_I32, COLLIE_CPU, 0};
  OK(collie_comm_allreduce(comm, at, at, COLLIE_SUM, NULL));
  CHECK(again == size * (size + 1) / 2, "second communicator's sum %d", (int)again);
  f += failures;
  OK(collie_comm_allreduce(comm, ft, ft, COLLIE_SUM, NULL));
  OK(collie_comm_destroy(comm));
  if (rank == 0) printf("C ABI 2: %d ranks, %s\n", size, f ? "FAILED" : "ok");
  return f ? 1 : 0;
}
