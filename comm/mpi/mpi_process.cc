// comm/mpi/mpi_process.cc: MPI's process state (mpi_process.h).
#include "collie_build_config.h"

#if COLLIE_HAVE_MPI

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "base/log.h"
#include "base/reduce.h"
#include "collie/error.h"
#include "comm/mpi/mpi_process.h"

namespace collie::mpi {

template <ReduceOp R>
void user_op(void* in, void* inout, int* len, MPI_Datatype* type);

std::string mpi_error(int rc) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(rc);
  return std::string(text, static_cast<size_t>(len));
}

std::string level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    default:
      return "MPI_THREAD_MULTIPLE";
  }
}

// The reduce ops MPI lacks, made of collie's kernels, so that results match
// the other backends: f16 and bf16 (widened to f32, combined, rounded once
// per step), 8-bit sums (wrapped: Open MPI 4.1's op/avx saturates them over
// its vector body, 100 + 100 in int8 gave 127 there and -56 in its tail;
// Allreduce.EightBitSumsWrapAtEveryCount in tests/test_collectives.cc), and
// min/max on floats (NaN wins wherever it is; MPI_MIN's
// comparison keeps whichever side comes first).
template <ReduceOp R>
void user_op(void* in, void* inout, int* len, MPI_Datatype* type) {
  DType t = Process::get().dtype_of(*type);
  kernels::reduce(t, R, inout, in, inout, static_cast<size_t>(*len));
}

// libnbc's all-reduce algorithm for `bytes` (`count` elements) over `n`
// ranks. Below 16 KiB, recursive doubling:
// log2(n) rounds, each a pairwise exchange (8 B over TCP: 9.7 us, against
// 13 us for Open MPI 4.1's binomial tree and 18 us for a ring). From 16 KiB,
// bandwidth counts: a ring under 4 ranks (2 ranks on shared memory: 1 MiB
// in 330 us, the binomial tree's 506 us, the blocking MPI_Allreduce's 580
// us), Rabenseifner's halving and doubling from 4 (Open MPI's own pick
// there, which it drops for in-place calls, the reducer's kind). Over a
// network (`network`: ranks on several hosts, or Open MPI told not to use
// shared memory), where a message costs more than its bytes, recursive
// doubling holds under 4 ranks up to 32 KiB: one exchange, not a ring's
// two (2 ranks over TCP, 32 KiB: 23 us against 31 us, raw MPI_Allreduce
// 27 to 30 us). From 64 KiB its one message passes Open MPI's TCP eager
// limit (64 KiB) and waits for a rendezvous round trip: 50 us against the
// ring's 37 us.
NbcAllreduce allreduce_algorithm(size_t bytes, size_t count, int n, bool network) {
  if (bytes < (network && n < 4 ? 65536 - 1024 : 16384)) return NbcAllreduce::recursive_doubling;
  if (n < 4) return NbcAllreduce::ring;
  size_t pof2 = 1;
  while (pof2 * 2 <= static_cast<size_t>(n)) pof2 *= 2;
  return count >= pof2 ? NbcAllreduce::rabenseifner : NbcAllreduce::ring;
}

void Process::start(bool choose) {
  std::lock_guard lk(mu_);
  if (started_) return;
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (finalized)
    throw Error(ErrorCode::unavailable,
                "the mpi backend cannot start: the program has finalised MPI already");
  if (!inited) {
    int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &level_);
    if (rc != MPI_SUCCESS)
      throw Error(ErrorCode::unavailable, "MPI_Init_thread failed: " + mpi_error(rc));
    we_initialised_ = true;
    std::atexit([] { Process::get().finalize_at_exit(); });
    // Open MPI 4.1 reports the errors of a non-blocking collective's
    // request through MPI_COMM_WORLD's handler, whichever communicator it
    // ran on: fatal by default, so a mismatched count aborted the job
    // instead of naming the rank. Only when collie started MPI: a program
    // that did chose its own handler.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  } else {
    MPI_Query_thread(&level_);
  }
  // Operations run on whichever thread waits for them, or on the
  // executor's; communicators run side by side.
  if (level_ < MPI_THREAD_SERIALIZED)
    throw Error(ErrorCode::unavailable,
                "the mpi backend needs MPI_THREAD_SERIALIZED or more, and MPI was initialised "
                "with " +
                    level_name(level_) +
                    ": initialise it with MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...) "
                    "(mpi4py does), or let collie initialise it");
  serialize_ = level_ < MPI_THREAD_MULTIPLE;
  MPI_Errhandler world;
  MPI_Comm_get_errhandler(MPI_COMM_WORLD, &world);
  errors_return_ = world == MPI_ERRORS_RETURN;
  MPI_Errhandler_free(&world);
  MPI_Type_contiguous(2, MPI_BYTE, &f16_);
  MPI_Type_commit(&f16_);
  MPI_Type_contiguous(2, MPI_BYTE, &bf16_);
  MPI_Type_commit(&bf16_);
  MPI_Op_create(&user_op<ReduceOp::sum>, 1, &ops_[0]);
  MPI_Op_create(&user_op<ReduceOp::prod>, 1, &ops_[1]);
  MPI_Op_create(&user_op<ReduceOp::min>, 1, &ops_[2]);
  MPI_Op_create(&user_op<ReduceOp::max>, 1, &ops_[3]);
  if (choose) find_algorithm_setting();
  started_ = true;
}

DType Process::dtype_of(MPI_Datatype t) const {
  if (t == MPI_FLOAT) return DType::f32;
  if (t == MPI_DOUBLE) return DType::f64;
  if (t == f16_) return DType::f16;
  if (t == MPI_INT8_T) return DType::i8;
  if (t == MPI_UINT8_T) return DType::u8;
  return DType::bf16;
}

MPI_Datatype Process::type(DType t) const {
  switch (t) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::f64:
      return MPI_DOUBLE;
    case DType::f16:
      return f16_;
    case DType::bf16:
      return bf16_;
    case DType::i32:
      return MPI_INT32_T;
    case DType::i64:
      return MPI_INT64_T;
    case DType::u8:
      return MPI_UINT8_T;
    case DType::i8:
      return MPI_INT8_T;
  }
  return MPI_BYTE;
}

// avg is a sum here; the caller divides. Which ops are collie's: user_op.
MPI_Op Process::op(ReduceOp r, DType t) const {
  const bool narrow = t == DType::f16 || t == DType::bf16;
  const bool fp = narrow || t == DType::f32 || t == DType::f64;
  const bool byte = t == DType::u8 || t == DType::i8;
  switch (r) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      return narrow || byte ? ops_[0] : MPI_SUM;
    case ReduceOp::prod:
      return narrow ? ops_[1] : MPI_PROD;
    case ReduceOp::min:
      return fp ? ops_[2] : MPI_MIN;
    case ReduceOp::max:
      return fp ? ops_[3] : MPI_MAX;
  }
  return MPI_SUM;
}

void Process::finalize_at_exit() {
  if (!we_initialised_ || !usable()) return;
  if (abandoned_) {
    // MPI_Finalize would wait for the operation that never ended.
    log::warn(
        "not finalising MPI: an operation of the mpi backend never finished (it timed "
        "out or a peer failed); mpirun ends the job");
    return;
  }
  MPI_Finalize();
}

// Open MPI's coll_libnbc_iallreduce_algorithm through the MPI tool
// interface, with its enumeration's names and values, when it can be
// written and nobody set it (a value other than 0, "ignore", is the
// user's choice). Open MPI 4.1's own pick for fewer than 4 ranks is a
// binomial tree, which sends the whole buffer up and back down: half the
// speed of a ring from 16 KiB up (bench/RESULTS.md).
void Process::find_algorithm_setting() {
  int provided = 0, index = -1, count = 0;
  if (MPI_T_init_thread(MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) return;
  if (MPI_T_cvar_get_index("coll_libnbc_iallreduce_algorithm", &index) != MPI_SUCCESS) return;
  char name[256], desc[1024];
  int name_len = sizeof name, desc_len = sizeof desc, verbosity = 0, bind = 0, scope = 0;
  MPI_Datatype type;
  MPI_T_enum values;
  if (MPI_T_cvar_get_info(index, name, &name_len, &verbosity, &type, &values, desc, &desc_len,
                          &bind, &scope) != MPI_SUCCESS ||
      type != MPI_INT || values == MPI_T_ENUM_NULL)
    return;
  int items = 0;
  char enum_name[256];
  int enum_len = sizeof enum_name;
  if (MPI_T_enum_get_info(values, &items, enum_name, &enum_len) != MPI_SUCCESS) return;
  int found[std::size(kNbcAllreduceNames)] = {-1, -1, -1};
  for (int i = 0; i < items; ++i) {
    int v = 0;
    char item[256];
    int item_len = sizeof item;
    if (MPI_T_enum_get_item(values, i, &v, item, &item_len) != MPI_SUCCESS) continue;
    for (size_t a = 0; a < std::size(kNbcAllreduceNames); ++a)
      if (std::strcmp(item, kNbcAllreduceNames[a]) == 0) found[a] = v;
  }
  if (MPI_T_cvar_handle_alloc(index, nullptr, &algorithm_, &count) != MPI_SUCCESS || count != 1)
    return;
  if (MPI_T_cvar_read(algorithm_, &users_algorithm_) != MPI_SUCCESS || users_algorithm_ != 0 ||
      MPI_T_cvar_write(algorithm_, &users_algorithm_) != MPI_SUCCESS)
    return;
  std::copy(std::begin(found), std::end(found), algorithm_values_);
}

}  // namespace collie::mpi

#endif  // COLLIE_HAVE_MPI
