/* tests/test_c_hooks.c: comm hooks written in C, reducer checkpoints and
 * model averaging, through the C ABI alone (a C compiler builds this).
 * Run under collie-run at 2 and 3 ranks; exit 0 on success.
 *
 *  - a hook that completes before returning (blocking all-reduce, then a
 *    scale), one that completes later through an asynchronous all-reduce,
 *    and one that fails: the first two must leave the exact average (small
 *    integers: exact in f32), the third an error naming the hook and its
 *    message;
 *  - a PowerSGD reducer saved after 3 steps and loaded into a second one:
 *    both give the same bits from then on;
 *  - periodic and hierarchical model averagers: parameters equal the mean
 *    (of the right group) right after an averaging step and are left alone
 *    between. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "c_check.h"
#include "collie/collie.h"

static collie_tensor f32(float* p, uint64_t n) {
  collie_tensor t;
  memset(&t, 0, sizeof t);
  t.data = p;
  t.numel = n;
  t.dtype = COLLIE_F32;
  t.device_type = COLLIE_CPU;
  return t;
}

static int calls = 0;

/* Sum, then divide by the world size, before returning. */
static void sum_then_scale(void* user, collie_comm* comm, const collie_grad_bucket* b,
                           collie_hook_done* done) {
  int size = 0;
  (void)user;
  ++calls;
  collie_status st = collie_comm_allreduce(comm, b->buffer, b->buffer, COLLIE_SUM, NULL);
  if (st == COLLIE_OK) st = collie_comm_size(comm, &size);
  if (st == COLLIE_OK) {
    float* x = (float*)b->buffer.data;
    for (uint64_t i = 0; i < b->buffer.numel; ++i) x[i] /= (float)size;
  }
  collie_hook_complete(done, st, st == COLLIE_OK ? NULL : collie_last_error());
}

/* Starts an averaging all-reduce and returns at once: the hook ends with it. */
static void async_avg(void* user, collie_comm* comm, const collie_grad_bucket* b,
                      collie_hook_done* done) {
  collie_work* w = NULL;
  if (++*(int*)user == 1)
    CHECK(collie_comm_destroy(comm) == COLLIE_ERR_INVALID_ARGUMENT &&
              strstr(collie_last_error(), "lent"),
          "a hook must not destroy the communicator it was lent: %s", collie_last_error());
  collie_status st = collie_comm_allreduce(comm, b->buffer, b->buffer, COLLIE_AVG, &w);
  if (st != COLLIE_OK)
    collie_hook_complete(done, st, collie_last_error());
  else
    collie_hook_complete_after(done, w);
}

static void fails(void* user, collie_comm* comm, const collie_grad_bucket* b,
                  collie_hook_done* done) {
  (void)user;
  (void)comm;
  (void)b;
  collie_hook_complete(done, COLLIE_ERR_INVALID_ARGUMENT, "custom failure from C");
}

#define N1 40
#define N2 9

/* One step over two parameters whose gradients are small integers from the
 * rank; returns 0 and leaves the averages in g1/g2, or the finalize status. */
static collie_status step(collie_reducer* red, float* g1, float* g2, int rank, int salt) {
  OK(collie_reducer_prepare(red, NULL, 0));
  for (int i = 0; i < N1; ++i) g1[i] = (float)((rank * 7 + i * 3 + salt) % 11);
  for (int i = 0; i < N2; ++i) g2[i] = (float)((rank * 5 + i + salt) % 13);
  OK(collie_reducer_mark_ready(red, 1));
  OK(collie_reducer_mark_ready(red, 0));
  return collie_reducer_finalize(red);
}

static void check_average(const float* g1, const float* g2, int size, int salt, const char* what) {
  for (int i = 0; i < N1; ++i) {
    double want = 0;
    for (int q = 0; q < size; ++q) want += (q * 7 + i * 3 + salt) % 11;
    want /= size;
    CHECK(fabs(g1[i] - want) <= 1e-6 * (1 + want), "%s: g1[%d] = %g, want %g", what, i, g1[i],
          want);
  }
  for (int i = 0; i < N2; ++i) {
    double want = 0;
    for (int q = 0; q < size; ++q) want += (q * 5 + i + salt) % 13;
    want /= size;
    CHECK(fabs(g2[i] - want) <= 1e-6 * (1 + want), "%s: g2[%d] = %g, want %g", what, i, g2[i],
          want);
  }
}

static collie_reducer* make(collie_comm* comm, float* v1, float* g1, float* v2, float* g2,
                            const char* hook) {
  collie_tensor p[2] = {f32(v1, N1), f32(v2, N2)}, g[2] = {f32(g1, N1), f32(g2, N2)};
  uint64_t rows[2] = {8, 0}; /* parameter 0 is an 8 x 5 matrix */
  collie_reducer_options o;
  collie_reducer_options_init(&o);
  o.comm_hook = hook;
  o.param_rows = rows;
  o.first_bucket_bytes = 16; /* two buckets */
  o.bucket_bytes = 64;
  collie_reducer* red = NULL;
  OK(collie_reducer_create(comm, p, g, 2, &o, &red));
  return red;
}

int main(void) {
  collie_comm* comm = NULL;
  int rank = 0, size = 0, async_calls = 0;
  float v1[N1] = {0}, g1[N1], v2[N2] = {0}, g2[N2];
  OK(collie_comm_connect(NULL, &comm));
  OK(collie_comm_rank(comm, &rank));
  OK(collie_comm_size(comm, &size));

  OK(collie_hook_register("c_sum_then_scale", sum_then_scale, NULL));
  OK(collie_hook_register("c_async_avg", async_avg, &async_calls));
  OK(collie_hook_register("c_fails", fails, NULL));

  /* Hooks written in C, picked by name like the built-ins. */
  const char* hooks[] = {"c_sum_then_scale", "c_async_avg"};
  for (int h = 0; h < 2; ++h) {
    collie_reducer* red = make(comm, v1, g1, v2, g2, hooks[h]);
    for (int s = 0; s < 3; ++s) {
      OK(step(red, g1, g2, rank, s));
      check_average(g1, g2, size, s, hooks[h]);
    }
    OK(collie_reducer_destroy(red));
  }
  CHECK(calls == 6 && async_calls == 6, "hook calls %d and %d, want 6 each (2 buckets x 3 steps)",
        calls, async_calls);

  /* Swapped between iterations, by spec: the default all-reduce first, then
   * the C hook; an unknown name keeps the old hook and lists the known ones. */
  {
    collie_reducer* red = make(comm, v1, g1, v2, g2, "allreduce");
    OK(step(red, g1, g2, rank, 1));
    CHECK(calls == 6, "the C hook ran before it was set (%d calls)", calls);
    OK(collie_reducer_set_comm_hook(red, "c_sum_then_scale"));
    OK(step(red, g1, g2, rank, 2));
    check_average(g1, g2, size, 2, "after set_comm_hook");
    CHECK(calls == 8, "the swapped-in C hook ran %d times, want 2", calls - 6);
    CHECK(collie_reducer_set_comm_hook(red, "nope") == COLLIE_ERR_INVALID_ARGUMENT &&
              strstr(collie_last_error(), "c_sum_then_scale") &&
              strstr(collie_last_error(), "powersgd"),
          "unknown hook: %s", collie_last_error());
    OK(step(red, g1, g2, rank, 3));
    CHECK(calls == 10, "the old hook stays after a bad spec (%d calls)", calls);
    OK(collie_reducer_destroy(red));
  }

  /* Callers built against the first ABI pass smaller option and stats
   * structs: accepted, and nothing is written past their end. */
  {
    collie_tensor p[2] = {f32(v1, N1), f32(v2, N2)}, g[2] = {f32(g1, N1), f32(g2, N2)};
    collie_reducer_options o;
    collie_reducer_options_init(&o);
    o.struct_size = (uint32_t)offsetof(collie_reducer_options, comm_hook);
    collie_reducer* red = NULL;
    OK(collie_reducer_create(comm, p, g, 2, &o, &red));
    OK(step(red, g1, g2, rank, 5));
    check_average(g1, g2, size, 5, "first-ABI options");
    collie_reducer_stats stats;
    memset(&stats, 0xab, sizeof stats);
    stats.struct_size = (uint32_t)offsetof(collie_reducer_stats, gradient_bytes);
    OK(collie_reducer_get_stats(red, &stats));
    CHECK(stats.num_buckets == 1 && stats.gradient_bytes == 0xababababababababull &&
              stats.hook_bytes == 0xababababababababull,
          "first-ABI stats: %u buckets, fields past the end untouched", stats.num_buckets);
    o.struct_size = 8;
    collie_reducer* bad = NULL;
    CHECK(collie_reducer_create(comm, p, g, 2, &o, &bad) == COLLIE_ERR_INVALID_ARGUMENT,
          "tiny struct_size");
    OK(collie_reducer_destroy(red));
  }

  /* A failing hook: finalize reports it, naming the hook. */
  {
    collie_reducer* red = make(comm, v1, g1, v2, g2, "c_fails");
    collie_status st = step(red, g1, g2, rank, 0);
    CHECK(st == COLLIE_ERR_INVALID_ARGUMENT, "failing hook status %d", (int)st);
    CHECK(strstr(collie_last_error(), "custom failure from C") &&
              strstr(collie_last_error(), "c_fails"),
          "message: %s", collie_last_error());
    OK(collie_reducer_destroy(red));
  }

  /* Checkpoints: PowerSGD's state carried from one reducer to another
   * (skipped in a build without BLAS, where PowerSGD is unavailable). */
  {
    collie_tensor probe_p = f32(v1, N1), probe_g = f32(g1, N1);
    collie_reducer_options po;
    collie_reducer* probe = NULL;
    collie_reducer_options_init(&po);
    po.comm_hook = "powersgd:start_iter=2";
    collie_status pst = collie_reducer_create(comm, &probe_p, &probe_g, 1, &po, &probe);
    if (probe) OK(collie_reducer_destroy(probe));
    if (pst == COLLIE_ERR_UNAVAILABLE) {
      printf("rank %d: no PowerSGD in this build (no BLAS): checkpoint test skipped\n", rank);
      goto averagers;
    }
    OK(pst);
  }
  {
    float w1[N1] = {0}, h1[N1], w2[N2] = {0}, h2[N2];
    collie_reducer* a = make(comm, v1, g1, v2, g2, "powersgd:start_iter=2,min_compression_rate=1");
    for (int s = 0; s < 4; ++s) OK(step(a, g1, g2, rank, s));
    collie_reducer_stats stats;
    memset(&stats, 0, sizeof stats);
    stats.struct_size = sizeof stats;
    OK(collie_reducer_get_stats(a, &stats));
    CHECK(stats.hook_bytes < stats.gradient_bytes, "PowerSGD sent %llu bytes for %llu of gradients",
          (unsigned long long)stats.hook_bytes, (unsigned long long)stats.gradient_bytes);
    size_t need = 0;
    OK(collie_reducer_save_state(a, NULL, 0, &need));
    CHECK(need > 0, "state size");
    unsigned char* state = malloc(need);
    size_t got = 0;
    OK(collie_reducer_save_state(a, state, need, &got));
    CHECK(got == need, "state size %zu then %zu", need, got);
    collie_reducer* b = make(comm, w1, h1, w2, h2, "powersgd:start_iter=2,min_compression_rate=1");
    OK(collie_reducer_load_state(b, state, need));
    for (int s = 4; s < 7; ++s) {
      OK(step(a, g1, g2, rank, s));
      OK(step(b, h1, h2, rank, s));
      CHECK(memcmp(g1, h1, sizeof g1) == 0 && memcmp(g2, h2, sizeof g2) == 0,
            "step %d: the reducer loaded from the checkpoint differs", s);
    }
    CHECK(collie_reducer_load_state(b, state, need / 2) == COLLIE_ERR_INVALID_ARGUMENT,
          "truncated state");
    free(state);
    OK(collie_reducer_destroy(a));
    OK(collie_reducer_destroy(b));
  }

averagers:
  /* Periodic model averaging after each optimizer step. */
  {
    collie_averager* avg = NULL;
    CHECK(collie_averager_create_periodic(comm, 0, 0, &avg) == COLLIE_ERR_INVALID_ARGUMENT,
          "period 0");
    OK(collie_averager_create_periodic(comm, 2, 1, &avg));
    float p[5];
    collie_tensor t = f32(p, 5);
    for (int s = 0; s < 5; ++s) {
      if (s == 2) { /* checkpoint: a new averager goes on from the saved step */
        size_t need = 0;
        unsigned char buf[64];
        OK(collie_averager_save_state(avg, buf, sizeof buf, &need));
        CHECK(need > 0 && need <= sizeof buf, "averager state size %zu", need);
        OK(collie_averager_destroy(avg));
        OK(collie_averager_create_periodic(comm, 2, 1, &avg));
        OK(collie_averager_load_state(avg, buf, need));
      }
      for (int i = 0; i < 5; ++i) p[i] = (float)(rank * 10 + i + s);
      OK(collie_averager_average(avg, &t, 1));
      /* warmup 1: steps 1 and 3 average, 0, 2 and 4 do not. */
      int averaged = s >= 1 && (s - 1) % 2 == 0;
      for (int i = 0; i < 5; ++i) {
        double want = averaged ? (10.0 * (size - 1) / 2.0 + i + s) : (double)(rank * 10 + i + s);
        CHECK(fabs(p[i] - want) < 1e-5, "averager step %d: p[%d] = %g, want %g", s, i, p[i], want);
      }
    }
    OK(collie_averager_destroy(avg));
  }

  /* Hierarchical: every 2 steps within groups of one rank (nothing to do),
   * every 4 steps over everyone; steps 0 and 4 are multiples of 4. */
  {
    collie_averager* avg = NULL;
    uint64_t periods[2] = {2, 4};
    int32_t groups[2] = {1, size};
    int32_t bad[2] = {1, size + 1};
    CHECK(collie_averager_create_hierarchical(comm, periods, bad, 2, 0, &avg) ==
              COLLIE_ERR_INVALID_ARGUMENT,
          "a group larger than the world");
    OK(collie_averager_create_hierarchical(comm, periods, groups, 2, 0, &avg));
    float p[3];
    collie_tensor t = f32(p, 3);
    for (int s = 0; s < 6; ++s) {
      for (int i = 0; i < 3; ++i) p[i] = (float)(rank * 4 + i - s);
      OK(collie_averager_average(avg, &t, 1));
      int global = s % 4 == 0;
      for (int i = 0; i < 3; ++i) {
        double want = global ? (4.0 * (size - 1) / 2.0 + i - s) : (double)(rank * 4 + i - s);
        CHECK(fabs(p[i] - want) < 1e-5, "hierarchical step %d: p[%d] = %g, want %g", s, i, p[i],
              want);
      }
    }
    OK(collie_averager_destroy(avg));
  }

  OK(collie_comm_destroy(comm));
  if (failures)
    fprintf(stderr, "rank %d: %d checks failed\n", rank, failures);
  else
    printf("rank %d: C hooks, checkpoints and averaging all correct\n", rank);
  return failures ? 1 : 0;
}
