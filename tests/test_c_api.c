/* tests/test_c_api.c: a whole data-parallel training step through the C ABI
 * alone, compiled by a C compiler. Run under collie-run at 2 and 3 ranks.
 *
 * Linear regression y = w.x + b on a fixed batch split across ranks, bucket
 * views on: the "engine" writes each gradient into the reducer's view, marks
 * it ready, finalizes, steps. After K steps every rank must hold the weights a
 * serial float64 run on the whole batch reaches (relative error <= 1e-5), and
 * misuse must come back as a status with a message. Exit 0 on success. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "c_check.h"
#include "collie/collie.h"

#define D 8
#define SAMPLES 24
#define STEPS 20

static double xs[SAMPLES][D], ys[SAMPLES];

static void make_data(void) {
  unsigned s = 12345;
  for (int i = 0; i < SAMPLES; ++i) {
    double dot = 0;
    for (int d = 0; d < D; ++d) {
      s = s * 1103515245u + 12345u;
      xs[i][d] = ((double)((s >> 8) % 2001) - 1000.0) / 1000.0;
      dot += xs[i][d] * (d + 1) * 0.25;
    }
    ys[i] = dot + 0.5;
  }
}

/* Adds the mean-squared-error gradient over samples [first, first+count),
 * normalised by `norm`, to gw/gb. Generic over float and double by macro. */
#define GRAD(T, w, b, gw, gb, first, count, norm)                                       \
  for (int i_ = (first); i_ < (first) + (count); ++i_) {                                \
    T err_ = (b) - (T)ys[i_];                                                           \
    for (int d_ = 0; d_ < D; ++d_) err_ += (w)[d_] * (T)xs[i_][d_];                     \
    for (int d_ = 0; d_ < D; ++d_) (gw)[d_] += (T)2 * err_ * (T)xs[i_][d_] / (T)(norm); \
    *(gb) += (T)2 * err_ / (T)(norm);                                                   \
  }

int main(void) {
  const double lr = 0.05;
  make_data();

  collie_comm* comm = NULL;
  OK(collie_comm_connect(NULL, &comm));
  int rank = 0, size = 0;
  OK(collie_comm_rank(comm, &rank));
  OK(collie_comm_size(comm, &size));

  float w[D], b[1];
  for (int d = 0; d < D; ++d) w[d] = rank == 0 ? 0.1f * d : 99.0f; /* rank 0's values win */
  b[0] = rank == 0 ? 0.0f : -5.0f;
  collie_tensor params[2] = {{w, D, COLLIE_F32, COLLIE_CPU, 0}, {b, 1, COLLIE_F32, COLLIE_CPU, 0}};

  collie_reducer_options opts;
  collie_reducer_options_init(&opts);
  opts.gradient_as_bucket_view = 1;
  opts.first_bucket_bytes = 4; /* one bucket per parameter */
  opts.bucket_bytes = 4;
  collie_reducer* red = NULL;
  OK(collie_reducer_create(comm, params, NULL, 2, &opts, &red));

  const int shard = SAMPLES / size, first = rank * shard;
  for (int step = 0; step < STEPS; ++step) {
    collie_tensor gw, gb;
    OK(collie_reducer_grad_view(red, 0, &gw));
    OK(collie_reducer_grad_view(red, 1, &gb));
    CHECK(gw.numel == D && gb.numel == 1 && gw.dtype == COLLIE_F32, "grad views");
    memset(gw.data, 0, D * sizeof(float));
    memset(gb.data, 0, sizeof(float));
    OK(collie_reducer_prepare(red, NULL, 0));
    float* pgw = (float*)gw.data;
    float* pgb = (float*)gb.data;
    GRAD(float, w, b[0], pgw, pgb, first, shard, shard);
    OK(collie_reducer_mark_ready(red, 1)); /* the bias first, as backward would */
    OK(collie_reducer_mark_ready(red, 0));
    OK(collie_reducer_finalize(red));
    OK(collie_reducer_grad_view(red, 0, &gw)); /* views may move after the first step */
    OK(collie_reducer_grad_view(red, 1, &gb));
    for (int d = 0; d < D; ++d) w[d] -= (float)lr * ((float*)gw.data)[d];
    b[0] -= (float)lr * ((float*)gb.data)[0];
  }

  collie_reducer_stats stats;
  memset(&stats, 0, sizeof stats);
  stats.struct_size = sizeof stats;
  OK(collie_reducer_get_stats(red, &stats));
  CHECK(stats.iteration == STEPS - 1, "stats iteration %llu", (unsigned long long)stats.iteration);
  CHECK(stats.num_buckets == 2, "stats buckets %u", stats.num_buckets);
  double times[4] = {-1, -1, -1, -1};
  size_t nb = 0;
  OK(collie_reducer_get_bucket_times(red, times, 4, &nb));
  CHECK(nb == 2 && times[0] >= 0 && times[1] >= 0 && times[2] == -1, "bucket times %zu", nb);
  CHECK(stats.comm_us_total >= times[0] && stats.comm_us_total >= times[1], "comm total");

  /* Serial float64 reference on the whole batch. */
  double rw[D], rb = 0;
  for (int d = 0; d < D; ++d) rw[d] = 0.1f * d;
  for (int step = 0; step < STEPS; ++step) {
    double gw[D] = {0}, gb = 0;
    GRAD(double, rw, rb, gw, &gb, 0, SAMPLES, SAMPLES);
    for (int d = 0; d < D; ++d) rw[d] -= lr * gw[d];
    rb -= lr * gb;
  }
  double worst = fabs(b[0] - rb) / fmax(1.0, fabs(rb));
  for (int d = 0; d < D; ++d) {
    double e = fabs(w[d] - rw[d]) / fmax(1.0, fabs(rw[d]));
    if (e > worst) worst = e;
  }
  CHECK(worst <= 1e-5, "relative error %g against the serial float64 run", worst);

  /* Misuse is a status and a message, not a crash. */
  OK(collie_reducer_prepare(red, NULL, 0));
  OK(collie_reducer_mark_ready(red, 0));
  CHECK(collie_reducer_mark_ready(red, 2) == COLLIE_ERR_INVALID_ARGUMENT, "out-of-range status");
  CHECK(strstr(collie_last_error(), "there are 2 parameters") != NULL, "message: %s",
        collie_last_error());
  OK(collie_reducer_mark_ready(red, 1));
  OK(collie_reducer_finalize(red));
  collie_tensor bad = {w, D, 42, COLLIE_CPU, 0};
  CHECK(collie_comm_allreduce(comm, bad, bad, COLLIE_SUM, NULL) == COLLIE_ERR_INVALID_ARGUMENT,
        "bad dtype");
  CHECK(strstr(collie_last_error(), "dtype") != NULL, "message: %s", collie_last_error());
  CHECK(collie_reducer_mark_ready(NULL, 0) == COLLIE_ERR_INVALID_ARGUMENT, "NULL reducer");

  /* Every rank agrees on the failure count, so all exit alike. */
  int32_t f = failures;
  collie_tensor ft = {&f, 1, COLLIE_I32, COLLIE_CPU, 0};
  OK(collie_comm_allreduce(comm, ft, ft, COLLIE_SUM, NULL));
  OK(collie_reducer_destroy(red));
  OK(collie_comm_destroy(comm));
  if (rank == 0)
    printf("C ABI: %d ranks, relative error %.2g, %s\n", size, worst, f ? "FAILED" : "ok");
  return f ? 1 : 0;
}
