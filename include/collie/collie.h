/* collie/collie.h: collie's C ABI, for autograd engines in any language.
 *
 * Opaque handles (collie_comm, collie_reducer), plain C structs for tensors
 * and options, and a status code from every call; when a call fails,
 * collie_last_error() gives the message (per thread, valid until the thread's
 * next failing call). Option structs start with their own size so that the
 * ABI can grow: initialise them with the matching *_init function.
 *
 * A training step, as an engine drives it:
 *
 *   collie_reducer_prepare(red, NULL, 0);
 *   for each parameter i, as backward produces its gradient:
 *       write it into collie_reducer_grad_view(red, i, &g)   (bucket views)
 *       collie_reducer_mark_ready(red, i);                     (any thread)
 *   collie_reducer_finalize(red);      -> averaged gradients in place
 *   optimizer step
 *
 * Thread safety: collie_reducer_mark_ready may be called from several
 * threads at once; every other reducer call belongs to one thread at a time.
 * Communicator calls are safe from any thread.
 */
#ifndef COLLIE_COLLIE_H
#define COLLIE_COLLIE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define COLLIE_ABI_VERSION 1

typedef enum {
  COLLIE_OK = 0,
  COLLIE_ERR_TIMEOUT = 1,
  COLLIE_ERR_PEER_LOST = 2,
  COLLIE_ERR_INVALID_ARGUMENT = 3,
  COLLIE_ERR_MISMATCH = 4,
  COLLIE_ERR_UNAVAILABLE = 5,
  COLLIE_ERR_INTERNAL = 6
} collie_status;

typedef enum {
  COLLIE_F32 = 0,
  COLLIE_F64 = 1,
  COLLIE_F16 = 2,
  COLLIE_BF16 = 3,
  COLLIE_I32 = 4,
  COLLIE_I64 = 5,
  COLLIE_U8 = 6
} collie_dtype;

typedef enum { COLLIE_SUM = 0, COLLIE_AVG = 1, COLLIE_MIN = 2, COLLIE_MAX = 3, COLLIE_PROD = 4 } collie_op;

typedef enum { COLLIE_CPU = 0, COLLIE_CUDA = 1 } collie_device_type;

typedef struct {
  void* data;
  uint64_t numel;
  int32_t dtype;        /* collie_dtype */
  int32_t device_type;  /* collie_device_type */
  int32_t device_index;
} collie_tensor;

typedef struct collie_comm collie_comm;
typedef struct collie_reducer collie_reducer;

/* The message of this thread's last failed call ("" if none). */
const char* collie_last_error(void);
int collie_abi_version(void);

/* ---- communicator ---- */

typedef struct {
  uint32_t struct_size;   /* sizeof(collie_comm_options) */
  int32_t rank;           /* -1: from the launcher's variables */
  int32_t world_size;     /* -1: likewise */
  const char* master_addr; /* NULL: likewise */
  int32_t master_port;    /* -1: likewise */
  const char* backend;    /* NULL or "auto", "tcp", ... */
  double timeout_seconds; /* 0: COLLIE_TIMEOUT, else 300 */
} collie_comm_options;

void collie_comm_options_init(collie_comm_options* opts);
/* opts may be NULL: everything from the environment. */
collie_status collie_comm_connect(const collie_comm_options* opts, collie_comm** out);
collie_status collie_comm_destroy(collie_comm* comm);
collie_status collie_comm_rank(const collie_comm* comm, int* rank);
collie_status collie_comm_size(const collie_comm* comm, int* size);

/* Blocking collectives (in place when in.data == out.data). */
collie_status collie_allreduce(collie_comm* comm, collie_tensor in, collie_tensor out, collie_op op);
collie_status collie_broadcast(collie_comm* comm, collie_tensor buf, int root);
collie_status collie_allgather(collie_comm* comm, collie_tensor in, collie_tensor out);
collie_status collie_barrier(collie_comm* comm);

/* ---- DDP reducer ---- */

typedef struct {
  uint32_t struct_size;          /* sizeof(collie_reducer_options) */
  uint64_t first_bucket_bytes;   /* default 1 MiB */
  uint64_t bucket_bytes;         /* default 25 MiB */
  int32_t gradient_as_bucket_view;
  int32_t find_unused_parameters;
  int32_t static_graph;
  int32_t broadcast_parameters;  /* default 1 */
  const char* comm_hook;         /* NULL: COLLIE_COMM_HOOK, else "allreduce"; e.g. "fp16" */
} collie_reducer_options;

void collie_reducer_options_init(collie_reducer_options* opts);

/* params[i] are the model's parameters; grads[i] the engine's gradient
 * buffers (may be NULL with gradient_as_bucket_view). The arrays are copied;
 * the memory they describe must outlive the reducer. Collective: every rank
 * calls it with the same shapes. */
collie_status collie_reducer_create(collie_comm* comm, const collie_tensor* params,
                                    const collie_tensor* grads, size_t num_params,
                                    const collie_reducer_options* opts, collie_reducer** out);
collie_status collie_reducer_destroy(collie_reducer* red);
/* used: one byte per parameter (non-zero = used this iteration), or NULL. */
collie_status collie_reducer_prepare(collie_reducer* red, const uint8_t* used, size_t num_params);
collie_status collie_reducer_mark_ready(collie_reducer* red, size_t param);
collie_status collie_reducer_finalize(collie_reducer* red);
/* Where gradient `param` lives: re-read after each finalize. */
collie_status collie_reducer_grad_view(collie_reducer* red, size_t param, collie_tensor* out);
collie_status collie_reducer_set_no_sync(collie_reducer* red, int on);

typedef struct {
  uint32_t struct_size;    /* sizeof(collie_reducer_stats), set by the caller */
  uint64_t iteration;      /* which synchronised iteration these describe */
  double backward_us;      /* prepare -> last mark_ready */
  double exposed_us;       /* time finalize waited for communication */
  double comm_us_total;    /* sum over buckets of launch -> completion */
  uint32_t num_buckets;
} collie_reducer_stats;

collie_status collie_reducer_get_stats(const collie_reducer* red, collie_reducer_stats* out);
/* Per-bucket communication time (launch -> completion, microseconds) of the
 * last synchronised iteration: writes min(capacity, buckets) values and the
 * bucket count to *count. */
collie_status collie_reducer_get_bucket_times(const collie_reducer* red, double* us,
                                              size_t capacity, size_t* count);

#ifdef __cplusplus
}
#endif

#endif /* COLLIE_COLLIE_H */
