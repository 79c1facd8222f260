// reducer/replica_check.h: are the replicas still identical? Data-parallel
// ranks must hold the same parameters after every step; silent corruption or
// a non-deterministic kernel on one rank makes its copy drift and nothing
// else notices. Every ReducerOptions::check_replicas iterations the reducer
// calls this before the backward pass.
//
// Each rank fingerprints every parameter (xxHash's XXH3, 64 bits, over its
// bytes) and the ranks gather one combined fingerprint each: one 16-byte
// all-gather when they agree. When they do not, the ranks that hold the
// majority's bits are the reference, the others are the ones that disagree;
// a second all-gather of the per-parameter fingerprints finds the first
// parameter that differs, and the reference's copy of it, broadcast, gives
// each rank where its copy first differs and by how much at most.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "collie/comm.h"

namespace collie {

// Collective: every rank calls it at the same point. Returns "" when every
// compared rank holds the same bits, else one message, the same on every
// rank, naming the ranks that disagree, the first parameter that differs
// (`name(i)`), where and by how much. `compared` false: a rank that takes
// part without being compared (one that has joined with uneven inputs and
// no longer steps its optimizer).
std::string check_replicas(Communicator& comm, const std::vector<TensorView>& params,
                           const std::function<std::string(size_t)>& name, uint64_t iteration,
                           bool compared);

// XXH3-64 of a tensor's bytes (through host memory for a CUDA tensor).
uint64_t tensor_fingerprint(const TensorView& t);

}  // namespace collie
