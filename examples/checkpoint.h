// examples/checkpoint.h: a training checkpoint for the example engine, so
// that a job restarted by `collie-run --max-restarts` goes on from its last
// one and ends with the parameters an uninterrupted run would have had.
//
// One file holds the next step to run, the model's shape, its parameters
// and every rank's reducer state (Reducer::save_state: the bucket layout, the
// iteration and the comm hook's state; PowerSGD's error feedback differs
// from rank to rank, so each rank's is kept). Rank 0 gathers the states and
// writes the file atomically (a temporary file, fsync, rename, fsync of the
// folder): a rank killed at any moment leaves the old checkpoint or the new
// one, never half of one. Rank 0 also reads it back and sends it to every
// rank, so the other ranks need not see rank 0's disk.
//
// The file: "CLLCKPT1", u64 step, u64 ranks, u64 shape length, the shape
// (u64 each), u64 parameter count, the parameters (f32), then for each rank
// u64 length and its reducer state, and last an FNV-1a 64 checksum of all
// that, all little-endian. Reading checks every length against what is
// left, the checksum, and that nothing trails: a truncated or damaged file
// is an error that says so, not a crash or a silently wrong model. (The
// plain SGD of train_mlp has no optimizer state; an engine with momentum
// would add its buffers beside the parameters.)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "collie/comm.h"
#include "reducer/reducer.h"

namespace collie::example {

struct Checkpoint {
  uint64_t step = 0;            // the next step to run
  std::vector<uint64_t> shape;  // the model's layer widths: another model's is refused
  std::vector<float> params;
  std::vector<Bytes> rank_states;  // Reducer::save_state() of each rank, by rank
};

Bytes encode(const Checkpoint& ck);
// Throws std::runtime_error naming `path` and what is wrong with the bytes.
Checkpoint decode(const Bytes& bytes, const std::string& path);

// Collective: every rank calls it after the same step. Gathers every rank's
// reducer state; rank 0 writes `path`. Throws std::runtime_error when the
// file cannot be written (on rank 0).
void save(Communicator& comm, Reducer& reducer, uint64_t step, const std::vector<uint64_t>& shape,
          const std::vector<float>& params, const std::string& path);

// Collective: rank 0 reads `path` and sends it to every rank. Nothing when
// there is no such file; throws std::runtime_error, on every rank, when it
// cannot be read or is damaged, or was saved by a job of another size or a
// model of another shape.
std::optional<Checkpoint> load(Communicator& comm, const std::string& path,
                               const std::vector<uint64_t>& shape);

}  // namespace collie::example
