/* collie/collie.h: collie's C ABI, for autograd engines in any language.
 *
 * Opaque handles (collie_comm, collie_reducer, collie_work), plain C structs
 * for tensors and options, and a status code from every call; when a call
 * fails, collie_last_error() gives the message (per thread, valid until the
 * thread's next failing call). Functions are named collie_<object>_<verb>.
 *
 * The ABI grows without breaking callers. Every options and stats struct
 * starts with {struct_size, struct_tag}: initialise it with its _INIT macro
 * (or the inline _init function), which sets both from the header the
 * program is built with. collie reads and writes only the fields the
 * caller's struct_size covers, so a program built against an older, smaller
 * struct keeps working (ABI 1's structs, which had no tag, are accepted
 * too); fields are only ever added at the end.
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
 * Collectives block when `work` is NULL; otherwise they return at once with
 * a handle to wait on, test, or hand to collie_hook_complete_after.
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

#define COLLIE_ABI_VERSION 5
/* struct_tag of the structs of this header: "CL" and the ABI version. */
#define COLLIE_STRUCT_TAG (0x434C0000u | COLLIE_ABI_VERSION)

#if defined(__GNUC__) || defined(__clang__)
#define COLLIE_DEPRECATED(msg) __attribute__((deprecated(msg)))
#else
#define COLLIE_DEPRECATED(msg)
#endif

typedef enum {
  COLLIE_OK = 0,
  COLLIE_ERR_TIMEOUT = 1,
  COLLIE_ERR_PEER_LOST = 2,
  COLLIE_ERR_INVALID_ARGUMENT = 3,
  COLLIE_ERR_MISMATCH = 4,
  COLLIE_ERR_UNAVAILABLE = 5,
  COLLIE_ERR_INTERNAL = 6,
  COLLIE_ERR_ABORTED = 7, /* the program aborted the communicator (collie_comm_abort) */
  COLLIE_IN_PROGRESS = 8  /* not an error: the operation has not ended yet */
} collie_status;

typedef enum {
  COLLIE_F32 = 0,
  COLLIE_F64 = 1,
  COLLIE_F16 = 2,
  COLLIE_BF16 = 3,
  COLLIE_I32 = 4,
  COLLIE_I64 = 5,
  COLLIE_U8 = 6,
  COLLIE_I8 = 7 /* ABI 4: int8, whose sums and products wrap around as the other integers' do */
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
typedef struct collie_work collie_work;

/* The message of this thread's last failed call ("" if none). */
const char* collie_last_error(void);
/* The ABI version of the library (COLLIE_ABI_VERSION of the header it was
 * built from): a program may check it is at least the one it needs. */
int collie_abi_version(void);

/* ---- communicator ---- */

typedef struct {
  uint32_t struct_size;     /* sizeof(collie_comm_options) */
  uint32_t struct_tag;      /* COLLIE_STRUCT_TAG */
  int32_t rank;             /* -1: from the launcher's variables */
  int32_t world_size;       /* -1: likewise */
  const char* master_addr;  /* NULL: likewise */
  int32_t master_port;      /* -1: likewise */
  int32_t local_rank;       /* -1: likewise */
  const char* backend;      /* NULL or "auto", "tcp", ... */
  double timeout_seconds;   /* 0: COLLIE_TIMEOUT, else 300 */
  int32_t local_world_size; /* -1: from the launcher's variables */
  int32_t reserved0;
  const char* secret; /* NULL: COLLIE_JOB_SECRET */
  /* ABI 3 */
  int32_t deterministic; /* 1: all-reduce and reduce-scatter sum in rank order, the same bits
                            on every backend (host memory); 0 off; -1: COLLIE_DETERMINISTIC */
  int32_t reserved1;
} collie_comm_options;

#define COLLIE_COMM_OPTIONS_INIT                                                                  \
  {                                                                                               \
    sizeof(collie_comm_options), COLLIE_STRUCT_TAG, -1, -1, NULL, -1, -1, NULL, 0.0, -1, 0, NULL, \
        -1, 0                                                                                     \
  }

/* Sets *opts to COLLIE_COMM_OPTIONS_INIT. Inline, so that it writes the
 * struct as the header the caller is built with defines it (the library's
 * exported function of this name serves programs built against ABI 1, and
 * writes ABI 1's smaller struct). */
#ifndef COLLIE_BUILDING_LIBRARY
static inline void collie_comm_options_init(collie_comm_options* opts) {
  const collie_comm_options init = COLLIE_COMM_OPTIONS_INIT;
  if (opts) *opts = init;
}
#endif
/* opts may be NULL: everything from the environment. */
collie_status collie_comm_connect(const collie_comm_options* opts, collie_comm** out);
collie_status collie_comm_destroy(collie_comm* comm);
collie_status collie_comm_rank(const collie_comm* comm, int* rank);
collie_status collie_comm_size(const collie_comm* comm, int* size);
/* The backend's name ("tcp", ...), valid as long as the communicator. */
collie_status collie_comm_backend(const collie_comm* comm, const char** name);

/* Collectives (in place when in.data == out.data). work NULL: blocks until
 * the operation ends and returns its status. Otherwise *work receives a
 * handle (free it with collie_work_free) and the call returns at once; the
 * tensors must stay valid until the operation ends. */
collie_status collie_comm_allreduce(collie_comm* comm, collie_tensor in, collie_tensor out,
                                    collie_op op, collie_work** work);
collie_status collie_comm_broadcast(collie_comm* comm, collie_tensor buf, int root,
                                    collie_work** work);
/* out holds size x in.numel elements, every rank's `in` in rank order. */
collie_status collie_comm_allgather(collie_comm* comm, collie_tensor in, collie_tensor out,
                                    collie_work** work);
/* in holds size x out.numel elements; rank r gets block r of the reduction. */
collie_status collie_comm_reduce_scatter(collie_comm* comm, collie_tensor in, collie_tensor out,
                                         collie_op op, collie_work** work);
collie_status collie_comm_barrier(collie_comm* comm, collie_work** work);
/* in and out hold size x k elements each: block j of in goes to rank j,
 * block q of out comes from rank q (MPI_Alltoall). They must not overlap.
 * alltoallv: send_counts[j] elements to rank j and recv_counts[q] from
 * rank q, each array of `size` counts, blocks packed in rank order; the
 * counts must agree with the peers'. Host memory. */
collie_status collie_comm_alltoall(collie_comm* comm, collie_tensor in, collie_tensor out,
                                   collie_work** work);
collie_status collie_comm_alltoallv(collie_comm* comm, collie_tensor in, const size_t* send_counts,
                                    collie_tensor out, const size_t* recv_counts,
                                    collie_work** work);
/* Point to point: messages between two ranks arrive in the order they were
 * sent; the receiver's count, dtype and tag must match the sender's. */
collie_status collie_comm_send(collie_comm* comm, collie_tensor buf, int peer, int tag,
                               collie_work** work);
collie_status collie_comm_recv(collie_comm* comm, collie_tensor buf, int peer, int tag,
                               collie_work** work);
/* Collective: ranks passing the same color form a new communicator ordered
 * by (key, rank); color < 0 joins none and gets *out = NULL. */
collie_status collie_comm_split(collie_comm* comm, int color, int key, collie_comm** out);
/* After ranks are lost: a new communicator of the survivors, in the old
 * order (Communicator::shrink). Collective over the survivors; ranks in
 * exclude[0..n_exclude), and those this rank saw die, are left out at once,
 * the others waited for up to wait_ms (0: the smaller of the timeout and
 * 10 s). */
collie_status collie_comm_shrink(collie_comm* comm, const int* exclude, size_t n_exclude,
                                 int wait_ms, collie_comm** out);
/* A new communicator of this one's ranks, numbered as here, and `joiners`
 * processes that join the running job (collie_comm_join, or
 * collie_comm_connect under COLLIE_JOIN=1, as collie-run --elastic restarts
 * a lost rank), numbered after them in the order they came
 * (Communicator::grow). Collective over this communicator; waits up to
 * wait_ms (0: the timeout) for the joiners. */
collie_status collie_comm_grow(collie_comm* comm, int joiners, int wait_ms, collie_comm** out);
/* A process that joins a running job: waits (up to the timeout) until a
 * communicator of the job grows by it, and returns its place there
 * (collie::join). The options give the store and the secret as for
 * collie_comm_connect; the rank and world size come from the grow. */
collie_status collie_comm_join(const collie_comm_options* options, collie_comm** out);
/* *out = 1 when `comm` was made by joining a running job (collie_comm_join,
 * or collie_comm_connect under COLLIE_JOIN=1), else 0 (a grow's survivors
 * get 0): whether its first DDP wrapper takes the survivors' hand-over. */
collie_status collie_comm_joined(const collie_comm* comm, int* out);
/* Which rank arrived last, and how long after the first, at the host
 * collectives since the last call (Communicator::arrivals). Collective.
 * *collectives gets how many were compared; last and median_late_ms (each
 * size() entries, or NULL) how many each rank arrived last at and the
 * median of how long after the first it came then (ms); summary (cap
 * bytes, or NULL) the sentence, NUL-terminated, cut to fit. */
collie_status collie_comm_arrivals(collie_comm* comm, uint64_t* collectives, uint64_t* last,
                                   double* median_late_ms, char* summary, size_t cap);
/* Fails the communicator with COLLIE_ERR_ABORTED and `reason`: the operation
 * in flight stops, later calls fail at once, the peers are told. Any thread. */
collie_status collie_comm_abort(collie_comm* comm, const char* reason);
/* COLLIE_OK while the communicator works; once it has failed, the first
 * failure's status, with its message in collie_last_error(). Never blocks. */
collie_status collie_comm_get_async_error(collie_comm* comm);

/* Zeroed host memory of `bytes` bytes, 64-byte aligned, that the
 * communicator's backend reduces in place: on shm the peers map it, and an
 * all-reduce whose buffer is such memory on every rank copies nothing
 * through the shared segment; elsewhere it is ordinary host memory. Not
 * collective. Give it back with collie_mem_free, before or after the
 * communicator is destroyed. */
collie_status collie_comm_mem_alloc(collie_comm* comm, size_t bytes, void** out);
/* Frees what collie_comm_mem_alloc returned; NULL is allowed. Memory that
 * did not come from there is refused (COLLIE_ERR_INVALID_ARGUMENT). */
collie_status collie_mem_free(void* ptr);

/* dst[i] = src[i] / divisor for i < numel, between the float types (f32,
 * f16, bf16; f64 too, slower), computed in f32 (in f64 where either side
 * is f64) and rounded once to nearest even: a compression hook's two
 * conversions (divisor 1: a plain one), with the F16C instructions where
 * the CPU has them. Host tensors of the same length that do not overlap;
 * divisor >= 1. Not collective. From ABI 5. */
collie_status collie_convert(collie_tensor src, collie_tensor dst, int divisor);

/* ---- operations in flight ---- */

collie_status collie_work_wait(collie_work* work); /* the op's status */
/* As collie_work_wait, giving up with COLLIE_ERR_TIMEOUT after `seconds`
 * (the op goes on). On a host backend, where `seconds` is at least the
 * communicator's timeout, the waiting thread first runs the queued ops up
 * to this one (each within that timeout) and `seconds` counts from then;
 * a shorter wait leaves them to the communicator's progress thread and
 * gives up after `seconds`. */
collie_status collie_work_wait_for(collie_work* work, double seconds);
/* COLLIE_IN_PROGRESS while the op runs, then its status. Never blocks. */
collie_status collie_work_query(collie_work* work);
/* Makes `stream` (a cudaStream_t) wait for the op: a stream wait for device
 * operations, a host wait for host ones. */
collie_status collie_work_wait_stream(collie_work* work, void* stream);
/* The CUDA stream (a cudaStream_t) that the calling thread's ops on CUDA
 * tensors are ordered after, as PyTorch's current stream: each starts once
 * the work queued on it before the call has finished. Per thread; NULL, the
 * default, is the legacy default stream. */
collie_status collie_set_cuda_stream(void* stream);
/* *done = 1 once ended; the status is the op's error if it failed. */
collie_status collie_work_test(collie_work* work, int* done);
/* Need not be complete; the op goes on, and the tensors it was given must
 * stay valid until it ends. */
collie_status collie_work_free(collie_work* work);
/* Calls fn(user, status, message) once when the op ends: status COLLIE_OK
 * and message NULL on success, else its error and message (valid during the
 * call). On the communicator's continuation thread, or on this thread at
 * once if the op has already ended; fn must not wait for another op's
 * continuation. The work may be freed before fn runs. */
typedef void (*collie_work_callback)(void* user, collie_status status, const char* message);
collie_status collie_work_on_complete(collie_work* work, collie_work_callback fn, void* user);

/* ---- DDP reducer ---- */

/* Where bucket memory comes from, when the engine provides it (its own
 * allocator, device memory). allocate returns `bytes` bytes for `dtype`
 * elements on the device, aligned to 64 bytes, or NULL; release gets back
 * what allocate returned, once nothing uses it (after the reducer is
 * destroyed). collie copies this struct; `user` must outlive the reducer. */
typedef struct {
  uint32_t struct_size; /* sizeof(collie_allocator) */
  uint32_t struct_tag;  /* COLLIE_STRUCT_TAG */
  void* (*allocate)(void* user, size_t bytes, int32_t dtype, int32_t device_type,
                    int32_t device_index);
  void (*release)(void* user, void* ptr, size_t bytes, int32_t device_type, int32_t device_index);
  void* user;
} collie_allocator;

#define COLLIE_ALLOCATOR_INIT \
  { sizeof(collie_allocator), COLLIE_STRUCT_TAG, NULL, NULL, NULL }

typedef struct {
  uint32_t struct_size;        /* sizeof(collie_reducer_options) */
  uint32_t struct_tag;         /* COLLIE_STRUCT_TAG */
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
  /* ABI 2 */
  const collie_allocator* bucket_allocator; /* NULL: zeroed host memory */
  int32_t rebuild_buckets;                  /* default 1: re-plan after the first iteration */
  int32_t reserved0;
  const char* const* param_names; /* NULL, or per parameter its name, for errors */
  /* ABI 3: the checks (reducer/README.md). -1 in each: its variable's value. */
  int64_t check_replicas;  /* every this many iterations, the ranks compare fingerprints of their
                              parameters; a difference names the ranks, the first parameter
                              that differs and by how much (0: never; COLLIE_CHECK_REPLICAS) */
  int32_t check_nonfinite; /* 1: gradients searched for NaN and Inf before averaging; the
                              rank, parameter and element named (COLLIE_CHECK_NONFINITE) */
  int32_t check_warns;     /* 1: a failed check is a warning in the log, 0: the iteration's
                              finalize (or prepare, for replicas) fails on every rank with
                              COLLIE_ERR_MISMATCH / COLLIE_ERR_INVALID_ARGUMENT
                              (COLLIE_CHECK_ACTION) */
} collie_reducer_options;

#define COLLIE_REDUCER_OPTIONS_INIT                                                           \
  {                                                                                           \
    sizeof(collie_reducer_options), COLLIE_STRUCT_TAG, 1u << 20, 25u << 20, 0, 0, 0, 1, NULL, \
        NULL, NULL, 1, 0, NULL, -1, -1, -1                                                    \
  }

/* Sets *opts to COLLIE_REDUCER_OPTIONS_INIT (inline, as collie_comm_options_init). */
#ifndef COLLIE_BUILDING_LIBRARY
static inline void collie_reducer_options_init(collie_reducer_options* opts) {
  const collie_reducer_options init = COLLIE_REDUCER_OPTIONS_INIT;
  if (opts) *opts = init;
}
#endif

/* params[i] are the model's parameters; grads[i] the engine's gradient
 * buffers: NULL with gradient_as_bucket_view, or when the engine passes each
 * gradient where it is now, at collie_reducer_mark_ready_grad (an entry with
 * data NULL likewise). The arrays are copied; the parameters' memory must
 * outlive the reducer. Collective: every rank calls it with the same shapes. */
collie_status collie_reducer_create(collie_comm* comm, const collie_tensor* params,
                                    const collie_tensor* grads, size_t num_params,
                                    const collie_reducer_options* opts, collie_reducer** out);
collie_status collie_reducer_destroy(collie_reducer* red);
/* used: one byte per parameter (non-zero = used this iteration), or NULL. */
collie_status collie_reducer_prepare(collie_reducer* red, const uint8_t* used, size_t num_params);
/* Gradient `param` has been accumulated: once per arrival, when it arrives
 * several times in one backward (activation checkpointing, shared weights).
 * The first synchronised step learns how often each arrives and sends its
 * buckets at finalize; later steps send a bucket as soon as its gradients
 * have arrived that often. Arriving more often after the bucket has left is
 * an error at finalize; never arriving is one too unless find_unused_parameters
 * or static_graph (then it counts as zeros: see collie_reducer_param_use). */
collie_status collie_reducer_mark_ready(collie_reducer* red, size_t param);
/* The same, saying where the gradient is now. Copy mode: the engine's current
 * buffer, which may have moved since the last step (PyTorch's
 * zero_grad(set_to_none=True)); the average is copied back there. Bucket
 * views: it must be the current grad view; a view from before a rebuild is
 * refused (COLLIE_ERR_INVALID_ARGUMENT, naming the layout generation). */
collie_status collie_reducer_mark_ready_grad(collie_reducer* red, size_t param, collie_tensor grad);
/* Copy mode: where gradient `param` is now; NULL (or data NULL): the engine
 * has none, and finalize leaves it alone. */
collie_status collie_reducer_set_grad(collie_reducer* red, size_t param, const collie_tensor* grad);
collie_status collie_reducer_finalize(collie_reducer* red);
/* A rank out of data while others still train (uneven inputs): the
 * collectives of one step with zero gradients, the engine's left alone. */
collie_status collie_reducer_join_step(collie_reducer* red);
/* Where each gradient came from in the last synchronised step, one byte per
 * parameter: 0 this rank's backward (or its no_sync steps); 1 not here but
 * on another rank (its average is in its bucket: collie_reducer_bucket_grad;
 * copy mode copied it into the engine's buffer when there was one); 2 on no
 * rank (left as it was in copy mode; zeros in its bucket view). */
collie_status collie_reducer_param_use(const collie_reducer* red, uint8_t* out, size_t num_params);
/* Where gradient `param` sits in its bucket: the grad view with bucket views;
 * in copy mode the bucket's copy, holding the average after finalize until
 * the next prepare. */
collie_status collie_reducer_bucket_grad(collie_reducer* red, size_t param, collie_tensor* out);
/* PyTorch's _set_static_graph: static_graph on after create, before the
 * first synchronised step, on every rank. */
collie_status collie_reducer_set_static_graph(collie_reducer* red);
/* Where gradient `param` lives: re-read when the layout generation changes. */
collie_status collie_reducer_grad_view(collie_reducer* red, size_t param, collie_tensor* out);
/* Counts the bucket layout's changes (the rebuild after the first iteration,
 * a load_state with another layout); 0 until the first. */
collie_status collie_reducer_layout_generation(const collie_reducer* red, uint64_t* generation);
collie_status collie_reducer_set_no_sync(collie_reducer* red, int on);
/* Swaps the comm hook between iterations, by spec ("fp16", "powersgd:rank=2",
 * a name given to collie_hook_register, ...); every rank at the same
 * iteration. Unknown names and bad parameters: an error listing what is
 * accepted, and the old hook stays. */
collie_status collie_reducer_set_comm_hook(collie_reducer* red, const char* spec);

typedef struct {
  uint32_t struct_size; /* sizeof(collie_reducer_stats), set by the caller */
  uint32_t struct_tag;  /* COLLIE_STRUCT_TAG */
  uint64_t iteration;   /* which synchronised iteration these describe */
  double backward_us;   /* prepare -> last mark_ready */
  double exposed_us;    /* time finalize waited for communication */
  double comm_us_total; /* sum over buckets of launch -> completion */
  uint32_t num_buckets;
  uint64_t gradient_bytes;    /* bytes of the buckets handed to the comm hook */
  uint64_t hook_bytes;        /* bytes the hook handed to collectives (per rank) */
  uint64_t layout_generation; /* ABI 2: as collie_reducer_layout_generation */
} collie_reducer_stats;

#define COLLIE_REDUCER_STATS_INIT \
  { sizeof(collie_reducer_stats), COLLIE_STRUCT_TAG, 0, 0.0, 0.0, 0.0, 0, 0, 0, 0 }

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
/* The synchronised iterations it has finished (as the saved state counts
 * them): after a shrink or a grow, the ranks compare them to know whether
 * each may go on from its own state (Reducer::handoff_state). */
collie_status collie_reducer_iterations(const collie_reducer* red, uint64_t* iterations);
/* After a shrink or a grow (collie_comm_grow): the state a rank's new
 * reducer on `comm` loads (collie_reducer_load_state), so that training
 * goes on in memory, without a checkpoint (Reducer::handoff_state). A rank
 * with a reducer (`mine`, of the old communicator) keeps its own state; a
 * joiner passes NULL and gets rank `root`'s, and so does every rank when
 * the reducers finished different iterations. Collective over `comm`; call
 * it before creating the new reducer. *state is allocated by collie (free
 * it with collie_free), *size its bytes. */
collie_status collie_reducer_handoff_state(collie_comm* comm, collie_reducer* mine, int root,
                                           void** state, size_t* size);
/* Frees what collie allocated for the caller (collie_reducer_handoff_state's
 * state). NULL is ignored. */
void collie_free(void* ptr);

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
 * prepare, or finalize: the first step's buckets leave there), with the
 * reducer locked: it must not call collie_reducer_*
 * functions. `comm` is lent, not owned: collie_comm_destroy refuses it, and
 * calls through it after the communicator is destroyed fail cleanly.
 * Buckets are handed to hooks in the same order on every rank; a hook that
 * issues a second collective later (from a completion) must keep that order
 * itself, and the user should not issue other collectives on the same
 * communicator while hooks are in flight. collie cannot count the bytes a C
 * hook sends: collie_reducer_stats.hook_bytes stays 0 for it. */
typedef void (*collie_comm_hook_fn)(void* user_data, collie_comm* comm,
                                    const collie_grad_bucket* bucket, collie_hook_done* done);

/* Registers a hook under `name` (usable as a comm_hook spec, by
 * COLLIE_COMM_HOOK and in fp16_wrap:<name>); user_data goes to every call. */
collie_status collie_hook_register(const char* name, collie_comm_hook_fn fn, void* user_data);
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

/* ---- ABI 1 names, kept so that programs built against it still link ---- */

COLLIE_DEPRECATED("use collie_comm_allreduce(comm, in, out, op, NULL)")
collie_status collie_allreduce(collie_comm* comm, collie_tensor in, collie_tensor out,
                               collie_op op);
COLLIE_DEPRECATED("use collie_comm_broadcast(comm, buf, root, NULL)")
collie_status collie_broadcast(collie_comm* comm, collie_tensor buf, int root);
COLLIE_DEPRECATED("use collie_comm_allgather(comm, in, out, NULL)")
collie_status collie_allgather(collie_comm* comm, collie_tensor in, collie_tensor out);
COLLIE_DEPRECATED("use collie_comm_barrier(comm, NULL)")
collie_status collie_barrier(collie_comm* comm);
COLLIE_DEPRECATED("use collie_comm_allreduce(comm, in, out, op, &work)")
collie_status collie_allreduce_async(collie_comm* comm, collie_tensor in, collie_tensor out,
                                     collie_op op, collie_work** work);
COLLIE_DEPRECATED("use collie_hook_register")
collie_status collie_register_comm_hook(const char* name, collie_comm_hook_fn fn, void* user_data);

#ifdef __cplusplus
}
#endif

#endif /* COLLIE_COLLIE_H */
