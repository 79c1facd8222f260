/* tests/abi/collie_v1.h: include/collie/collie.h as ABI version 1 shipped it
 * (only this comment and the include guard differ), so that
 * tests/abi/v1_caller.c is built the way a program built against that
 * release was. Do not change the declarations.
 *
 * collie/collie.h (ABI 1): collie's C ABI, for autograd engines in any language.
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
#ifndef COLLIE_COLLIE_V1_H
#define COLLIE_COLLIE_V1_H

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

typedef enum {
  COLLIE_SUM = 0,
  COLLIE_AVG = 1,
  COLLIE_MIN = 2,
  COLLIE_MAX = 3,
  COLLIE_PROD = 4
} collie_op;

typedef enum { COLLIE_CPU = 0, COLLIE_CUDA = 1 } collie_device_type;

typedef struct {
  void* data;
  uint64_t numel;
  int32_t dtype;       /* collie_dtype */
  int32_t device_type; /* collie_device_type */
  int32_t device_index;
} collie_tensor;

typedef struct collie_comm collie_comm;
typedef struct collie_reducer collie_reducer;

/* The message of this thread's last failed call ("" if none). */
const char* collie_last_error(void);
int collie_abi_version(void);

/* ---- communicator ---- */

typedef struct {
  uint32_t struct_size;    /* sizeof(collie_comm_options) */
  int32_t rank;            /* -1: from the launcher's variables */
  int32_t world_size;      /* -1: likewise */
  const char* master_addr; /* NULL: likewise */
  int32_t master_port;     /* -1: likewise */
  const char* backend;     /* NULL or "auto", "tcp", ... */
  double timeout_seconds;  /* 0: COLLIE_TIMEOUT, else 300 */
} collie_comm_options;

void collie_comm_options_init(collie_comm_options* opts);
/* opts may be NULL: everything from the environment. */
collie_status collie_comm_connect(const collie_comm_options* opts, collie_comm** out);
collie_status collie_comm_destroy(collie_comm* comm);
collie_status collie_comm_rank(const collie_comm* comm, int* rank);
collie_status collie_comm_size(const collie_comm* comm, int* size);

/* Blocking collectives (in place when in.data == out.data). */
collie_status collie_allreduce(collie_comm* comm, collie_tensor in, collie_tensor out,
                               collie_op op);
collie_status collie_broadcast(collie_comm* comm, collie_tensor buf, int root);
collie_status collie_allgather(collie_comm* comm, collie_tensor in, collie_tensor out);
collie_status collie_barrier(collie_comm* comm);

/* ---- DDP reducer ---- */

typedef struct {
  uint32_t struct_size;        /* sizeof(collie_reducer_options) */
  uint64_t first_bucket_bytes; /* default 1 MiB */
  uint64_t bucket_bytes;       /* default 25 MiB */
  int32_t gradient_as_bucket_view;
  int32_t find_unused_parameters;
  int32_t static_graph;
  int32_t broadcast_parameters; /* default 1 */
  const char* comm_hook;        /* NULL: COLLIE_COMM_HOOK, else "allreduce"; e.g. "fp16",
                                   "powersgd:rank=2,start_iter=10" */
  const uint64_t* param_rows;   /* NULL, or per parameter its first dimension when it is a
                                   matrix (rows of the rows x numel/rows view that PowerSGD
                                   compresses; a conv weight [o,i,kh,kw] has o), 0 for a vector */
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
/* Swaps the comm hook between iterations, by spec ("fp16", "powersgd:rank=2",
 * a name given to collie_register_comm_hook, ...); every rank at the same
 * iteration. Unknown names and bad parameters: an error listing what is
 * accepted, and the old hook stays. */
collie_status collie_reducer_set_comm_hook(collie_reducer* red, const char* spec);

typedef struct {
  uint32_t struct_size; /* sizeof(collie_reducer_stats), set by the caller */
  uint64_t iteration;   /* which synchronised iteration these describe */
  double backward_us;   /* prepare -> last mark_ready */
  double exposed_us;    /* time finalize waited for communication */
  double comm_us_total; /* sum over buckets of launch -> completion */
  uint32_t num_buckets;
  uint64_t gradient_bytes; /* bytes of the buckets handed to the comm hook */
  uint64_t hook_bytes;     /* bytes the hook handed to collectives (per rank) */
} collie_reducer_stats;

collie_status collie_reducer_get_stats(const collie_reducer* red, collie_reducer_stats* out);
/* Per-bucket communication time (launch -> completion, microseconds) of the
 * last synchronised iteration: writes min(capacity, buckets) values and the
 * bucket count to *count. */
collie_status collie_reducer_get_bucket_times(const collie_reducer* red, double* us,
                                              size_t capacity, size_t* count);

/* Checkpoints: the bucket layout, the iteration count and the comm hook's
 * state (PowerSGD's error feedback and Q, ...). save: with buf NULL (or
 * capacity too small) only *size is set. A resumed job creates its reducer as
 * before and loads the state before its first backward; loading may move the
 * buckets, so re-read collie_reducer_grad_view afterwards. Every rank must
 * load the state it saved at the same step. */
collie_status collie_reducer_save_state(collie_reducer* red, void* buf, size_t capacity,
                                        size_t* size);
collie_status collie_reducer_load_state(collie_reducer* red, const void* buf, size_t size);

/* ---- asynchronous collectives ---- */

typedef struct collie_work collie_work;
collie_status collie_allreduce_async(collie_comm* comm, collie_tensor in, collie_tensor out,
                                     collie_op op, collie_work** work);
collie_status collie_work_wait(collie_work* work);            /* the op's status */
collie_status collie_work_test(collie_work* work, int* done); /* non-blocking */
/* Need not be complete; the op goes on, and the tensors it was given must
 * stay valid until it ends. */
collie_status collie_work_free(collie_work* work);

/* ---- comm hooks written in C ---- */

/* What the reducer hands a hook: valid only during the callback, except the
 * memory it points to, which stays valid until the hook completes. */
typedef struct {
  uint64_t index;       /* bucket number, in launch order */
  collie_tensor buffer; /* the flat gradients; leave the average here */
  uint64_t num_grads;
  const collie_tensor* grads;  /* each gradient, a view into buffer */
  const collie_tensor* params; /* the matching parameters */
  const uint64_t* rows;        /* each gradient's first dimension (0: vector) */
  int32_t is_last;             /* the last bucket of this iteration */
  uint64_t iteration;
} collie_grad_bucket;

typedef struct collie_hook_done collie_hook_done;

/* Starts reducing bucket->buffer over comm (the reducer's communicator) and
 * returns; the hook reports the end through `done`, exactly once, from any
 * thread, before returning or later: collie_hook_complete, or
 * collie_hook_complete_after to end when an asynchronous collective does.
 * `done` is freed by that call: completing twice is undefined behaviour.
 * A hook that never completes makes finalize fail with a timeout.
 *
 * The hook runs on the thread that called collie_reducer_mark_ready (or
 * prepare), with the reducer locked: it must not call collie_reducer_*
 * functions. `comm` is lent, not owned: collie_comm_destroy refuses it.
 * Buckets are handed to hooks in the same order on every rank; a hook that
 * issues a second collective later (from a completion) must keep that order
 * itself, and the user should not issue other collectives on the same
 * communicator while hooks are in flight. collie cannot count the bytes a C
 * hook sends: collie_reducer_stats.hook_bytes stays 0 for it. */
typedef void (*collie_comm_hook_fn)(void* user_data, collie_comm* comm,
                                    const collie_grad_bucket* bucket, collie_hook_done* done);

/* Registers a hook under `name` (usable as a comm_hook spec, by
 * COLLIE_COMM_HOOK and in fp16_wrap:<name>); user_data goes to every call. */
collie_status collie_register_comm_hook(const char* name, collie_comm_hook_fn fn, void* user_data);
/* status COLLIE_OK, or an error whose message (may be NULL) the reducer reports. */
collie_status collie_hook_complete(collie_hook_done* done, collie_status status,
                                   const char* message);
/* Completes `done` when `work` completes, with its status; frees `work`. */
collie_status collie_hook_complete_after(collie_hook_done* done, collie_work* work);

/* ---- model averaging (post-local SGD) ---- */

typedef struct collie_averager collie_averager;
/* Averages parameters over every rank each `period` steps after
 * `warmup_steps` (PyTorch's PeriodicModelAverager). */
collie_status collie_averager_create_periodic(collie_comm* comm, uint64_t period,
                                              uint64_t warmup_steps, collie_averager** out);
/* Levels (periods ascending): at a step, the largest period that divides
 * it averages within groups of group_sizes[i] consecutive ranks (0: the
 * ranks of one host); the last level must span every rank. Collective. */
collie_status collie_averager_create_hierarchical(collie_comm* comm, const uint64_t* periods,
                                                  const int32_t* group_sizes, size_t levels,
                                                  uint64_t warmup_steps, collie_averager** out);
/* Call after every optimizer step; averages when the step says so. */
collie_status collie_averager_average(collie_averager* avg, const collie_tensor* params, size_t n);
/* The step count, for checkpoints (as collie_reducer_save_state). */
collie_status collie_averager_save_state(collie_averager* avg, void* buf, size_t capacity,
                                         size_t* size);
collie_status collie_averager_load_state(collie_averager* avg, const void* buf, size_t size);
collie_status collie_averager_destroy(collie_averager* avg);

#ifdef __cplusplus
}
#endif

#endif /* COLLIE_COLLIE_V1_H */
