// capi/c_api_internal.h: what the two halves of the C ABI share
// (c_api_comm.cc: communicators and operations; c_api.cc: the reducer,
// hooks and averagers): the handles behind the opaque types, the mapping of
// exceptions to status codes, and how versioned structs are read.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <string>

// The library defines ABI 1's exported _init functions itself (they write
// ABI 1's structs); callers get the header's inline ones.
#define COLLIE_BUILDING_LIBRARY 1
#include "collie/collie.h"
#include "collie/comm.h"

extern "C" {
void collie_comm_options_init(collie_comm_options* opts);
void collie_reducer_options_init(collie_reducer_options* opts);
}

struct collie_comm {
  std::unique_ptr<collie::Communicator> owned;  // null for the view handed to C hooks
  // The view's reference: a C hook that calls it after the communicator is
  // gone gets an error, not freed memory.
  std::shared_ptr<collie::Communicator> shared;
  collie::Communicator* comm = nullptr;
  std::string backend;  // what collie_comm_backend hands out
  bool joined = false;  // made by joining a running job (collie_comm_joined)
};

struct collie_work {
  collie::Work work;
};

namespace collie::capi {

// Keeps `msg` for collie_last_error() and returns `st`.
collie_status fail(collie_status st, std::string msg);

// Runs fn, mapping exceptions to status codes.
template <typename Fn>
collie_status guarded(Fn&& fn) {
  try {
    fn();
    return COLLIE_OK;
  } catch (const Error& e) {
    return fail(static_cast<collie_status>(e.code()), e.what());
  } catch (const std::bad_alloc&) {
    return fail(COLLIE_ERR_INTERNAL, "out of memory");
  } catch (const std::exception& e) {
    return fail(COLLIE_ERR_INTERNAL, e.what());
  }
}

TensorView to_view(const collie_tensor& t, const char* what);
collie_tensor from_view(const TensorView& v);
ReduceOp to_op(int op);

collie_status null_argument(const char* func, const char* name);
#define COLLIE_REQUIRE(ptr, name) \
  if (!(ptr)) return collie::capi::null_argument(__func__, name)

// Whether `tag` is a struct_tag of some ABI version ("CL" in the high half).
inline bool is_struct_tag(uint32_t tag) {
  return (tag >> 16) == 0x434Cu;
}

// The caller's struct as this library's: its first struct_size bytes over
// `defaults`. Fields past what the caller's (older) struct has keep their
// defaults, and nothing past its end is read.
template <typename S>
S read_struct(const S* caller, const S& defaults) {
  S s = defaults;
  std::memcpy(&s, caller, std::min<size_t>(caller->struct_size, sizeof(S)));
  return s;
}

// Writes `full` into the caller's struct, no further than its struct_size.
template <typename S>
void write_struct(S* caller, const S& full) {
  const uint32_t size = caller->struct_size, tag = caller->struct_tag;
  std::memcpy(caller, &full, std::min<size_t>(size, sizeof(S)));
  caller->struct_size = size;
  caller->struct_tag = tag;
}

}  // namespace collie::capi
