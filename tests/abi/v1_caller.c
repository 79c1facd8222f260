/* tests/abi/v1_caller.c: a program built against ABI 1's header
 * (collie_v1.h, as that release shipped it) and run against this library:
 * ABI 1's struct sizes and layouts (collie_comm_options had no struct_tag
 * and its rank where the tag is now), its exported _init functions, and its
 * function names must all still work. Run under collie-run at 2 ranks; the
 * asan build reports any write past ABI 1's smaller structs. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "c_check.h"
#include "collie_v1.h"

/* Bytes a call must not have written, after a struct of ABI 1's size. */
static void check_guard(const unsigned char* guard, size_t n, unsigned char fill,
                        const char* what) {
  for (size_t i = 0; i < n; ++i) CHECK(guard[i] == fill, "byte %zu past the %s written", i, what);
}

/* An ABI-1 C hook: sum, then scale in place. */
static void sum_then_scale(void* user, collie_comm* comm, const collie_grad_bucket* b,
                           collie_hook_done* done) {
  int size = 1;
  (void)user;
  collie_comm_size(comm, &size);
  collie_status st = collie_allreduce(comm, b->buffer, b->buffer, COLLIE_SUM);
  float* v = (float*)b->buffer.data;
  for (uint64_t i = 0; i < b->buffer.numel; ++i) v[i] /= (float)size;
  collie_hook_complete(done, st, st == COLLIE_OK ? NULL : collie_last_error());
}

int main(void) {
  CHECK(collie_abi_version() >= 1, "ABI version %d", collie_abi_version());

  /* The exported initialiser writes ABI 1's 48-byte struct; guard bytes
   * after it show that nothing is written past it. */
  struct {
    collie_comm_options o;
    unsigned char guard[32];
  } opts;
  memset(&opts, 0x5a, sizeof opts);
  collie_comm_options_init(&opts.o);
  CHECK(opts.o.struct_size == sizeof(collie_comm_options) && sizeof(collie_comm_options) == 48,
        "ABI 1 comm options are %u bytes", opts.o.struct_size);
  check_guard(opts.guard, sizeof opts.guard, 0x5a, "comm options");
  opts.o.backend = "tcp";
  opts.o.timeout_seconds = 120;
  collie_comm* comm = NULL;
  OK(collie_comm_connect(&opts.o, &comm));
  int rank = 0, size = 0;
  OK(collie_comm_rank(comm, &rank));
  OK(collie_comm_size(comm, &size));

  float x[5];
  for (int i = 0; i < 5; ++i) x[i] = (float)(rank + i);
  collie_tensor tx = {x, 5, COLLIE_F32, COLLIE_CPU, 0};
  OK(collie_allreduce(comm, tx, tx, COLLIE_SUM));
  for (int i = 0; i < 5; ++i)
    CHECK(x[i] == (float)(size * (size - 1) / 2 + size * i), "allreduce %d: %g", i, x[i]);
  float root_val = rank == 0 ? 42.0f : 0.0f;
  collie_tensor tr = {&root_val, 1, COLLIE_F32, COLLIE_CPU, 0};
  OK(collie_broadcast(comm, tr, 0));
  CHECK(root_val == 42.0f, "broadcast %g", root_val);
  int32_t mine = rank * 10, all[16];
  collie_tensor tm = {&mine, 1, COLLIE_I32, COLLIE_CPU, 0},
                ta = {all, (uint64_t)size, COLLIE_I32, COLLIE_CPU, 0};
  OK(collie_allgather(comm, tm, ta));
  for (int q = 0; q < size; ++q) CHECK(all[q] == q * 10, "allgather %d: %d", q, all[q]);
  OK(collie_barrier(comm));
  collie_work* w = NULL;
  double d = 1.5;
  collie_tensor td = {&d, 1, COLLIE_F64, COLLIE_CPU, 0};
  OK(collie_allreduce_async(comm, td, td, COLLIE_SUM, &w));
  OK(collie_work_wait(w));
  int done = 0;
  OK(collie_work_test(w, &done));
  CHECK(done == 1 && d == 1.5 * size, "async allreduce %g", d);
  OK(collie_work_free(w));

  /* The reducer with ABI 1's 56-byte options, its initialiser and a hook
   * registered under ABI 1's name. */
  OK(collie_register_comm_hook("v1_sum_then_scale", sum_then_scale, NULL));
  struct {
    collie_reducer_options o;
    unsigned char guard[32];
  } ro;
  memset(&ro, 0x5a, sizeof ro);
  collie_reducer_options_init(&ro.o);
  CHECK(ro.o.struct_size == 56 && sizeof(collie_reducer_options) == 56,
        "ABI 1 reducer options are %u bytes", ro.o.struct_size);
  check_guard(ro.guard, sizeof ro.guard, 0x5a, "reducer options");
  ro.o.gradient_as_bucket_view = 1;
  ro.o.comm_hook = "v1_sum_then_scale";
  float p0[3] = {0}, p1[2] = {0};
  collie_tensor params[2] = {{p0, 3, COLLIE_F32, COLLIE_CPU, 0},
                             {p1, 2, COLLIE_F32, COLLIE_CPU, 0}};
  collie_reducer* red = NULL;
  OK(collie_reducer_create(comm, params, NULL, 2, &ro.o, &red));
  for (int step = 0; step < 3; ++step) {
    OK(collie_reducer_prepare(red, NULL, 0));
    for (size_t i = 0; i < 2; ++i) {
      collie_tensor g;
      OK(collie_reducer_grad_view(red, i, &g));
      for (uint64_t k = 0; k < g.numel; ++k) ((float*)g.data)[k] = (float)(rank + step + k);
      OK(collie_reducer_mark_ready(red, i));
    }
    OK(collie_reducer_finalize(red));
    for (size_t i = 0; i < 2; ++i) {
      collie_tensor g;
      OK(collie_reducer_grad_view(red, i, &g));
      for (uint64_t k = 0; k < g.numel; ++k) {
        double want = (size - 1) / 2.0 + step + (double)k;
        CHECK(fabs(((float*)g.data)[k] - want) < 1e-6, "step %d grad %zu[%llu] %g, want %g", step,
              i, (unsigned long long)k, ((float*)g.data)[k], want);
      }
    }
  }
  /* ABI 1's stats struct, 64 bytes, padding left as garbage. */
  struct {
    collie_reducer_stats s;
    unsigned char guard[32];
  } st;
  memset(&st, 0xcd, sizeof st);
  st.s.struct_size = sizeof st.s;
  CHECK(sizeof st.s == 64, "ABI 1 stats are %zu bytes", sizeof st.s);
  OK(collie_reducer_get_stats(red, &st.s));
  CHECK(st.s.iteration == 2 && st.s.num_buckets >= 1, "stats: iteration %llu",
        (unsigned long long)st.s.iteration);
  check_guard(st.guard, sizeof st.guard, 0xcd, "stats");
  OK(collie_reducer_destroy(red));

  int32_t f = failures;
  collie_tensor ft = {&f, 1, COLLIE_I32, COLLIE_CPU, 0};
  OK(collie_allreduce(comm, ft, ft, COLLIE_SUM));
  OK(collie_comm_destroy(comm));
  if (rank == 0) printf("ABI 1 caller on ABI %d: %s\n", collie_abi_version(), f ? "FAILED" : "ok");
  return f ? 1 : 0;
}
