// hooks/model_averager.h: averaging parameters, not gradients, every few steps.
//
// Post-local SGD (Lin et al., "Don't Use Large Mini-Batches, Use Local SGD",
// ICLR 2020, arXiv:1808.07217) trains with ordinary data-parallel SGD for a
// while, then lets ranks (or small groups of ranks, through the
// post_local_sgd comm hook) take local steps and only averages the models
// every `period` steps. Hierarchical SGD (Wang et al., arXiv:2010.12998)
// averages at several levels: small groups often, the whole world rarely.
// Both follow PyTorch's torch.distributed.algorithms.model_averaging:
//
//   Reducer red(comm, params, {.comm_hook = "post_local_sgd:start_iter=100"});
//   PeriodicModelAverager avg(comm, /*period=*/4, /*warmup_steps=*/100);
//   for each step: backward through `red`; optimizer step; avg.average_parameters(values);
//
// warmup_steps should equal the hook's start_iter: before it the reducer
// already averages gradients over every rank, so the models are identical.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "collie/comm.h"

namespace collie {

// Replaces every parameter by its average over `comm`'s ranks. Parameters of
// one dtype travel in one all-reduce over a flat copy (one collective per
// dtype, not per tensor); `scratch` holds those copies between calls. Every
// rank must pass the same shapes in the same order; parameters must be
// floating point and in CPU memory.
void average_parameters(Communicator& comm, const std::vector<TensorView>& params,
                        std::vector<std::vector<uint8_t>>& scratch);

// Groups ranks by host: each rank's color is the lowest rank whose host
// (topology::host_identity: COLLIE_HOSTNAME, else host name, boot id and
// network namespace) hashes like its own. host_colors returns every rank's
// color, host_color this rank's. Collective.
std::vector<int> host_colors(Communicator& comm);
int host_color(Communicator& comm);

// The step counters' checkpoint format (the averagers' and the post_local_sgd
// hook's): 8 bytes, little-endian. `who` names the owner in the error that a
// state of another size gets.
Bytes counter_state(uint64_t count);
uint64_t counter_from_state(const Bytes& state, const std::string& who);

// Called after every optimizer step; averages the parameters over `comm` when
// step >= warmup_steps and (step - warmup_steps) % period == 0, then counts
// the step.
class PeriodicModelAverager {
 public:
  PeriodicModelAverager(Communicator& comm, uint64_t period, uint64_t warmup_steps = 0);

  void average_parameters(const std::vector<TensorView>& params);
  uint64_t step() const { return step_; }

  // The step count, for checkpoints.
  Bytes save_state() const;
  void load_state(const Bytes& state);

 private:
  Communicator& comm_;
  uint64_t period_;
  uint64_t warmup_steps_;
  uint64_t step_ = 0;
  std::vector<std::vector<uint8_t>> scratch_;
};

// One level of the hierarchy: groups of `group_size` consecutive ranks
// average every `period` steps. group_size 0 means the ranks of one host.
struct AveragingLevel {
  uint64_t period = 0;
  int group_size = 0;
};

// Called after every optimizer step. At step >= warmup_steps it finds the
// largest period that divides the step (not step - warmup_steps: PyTorch's
// HierarchicalModelAverager counts from 0 here, unlike PeriodicModelAverager)
// and averages within that level's group only: in the usual hierarchy a
// smaller group lies inside the larger one, so averaging it as well would
// only repeat work.
//
// Levels are given in ascending period order and the last one must be the
// whole communicator. The constructor is collective: it creates every
// level's subcommunicator, on every rank, in level order.
class HierarchicalModelAverager {
 public:
  HierarchicalModelAverager(Communicator& comm, std::vector<AveragingLevel> levels,
                            uint64_t warmup_steps = 0);
  ~HierarchicalModelAverager();
  HierarchicalModelAverager(const HierarchicalModelAverager&) = delete;
  HierarchicalModelAverager& operator=(const HierarchicalModelAverager&) = delete;

  void average_parameters(const std::vector<TensorView>& params);
  uint64_t step() const { return step_; }
  // The number of ranks level `i` averages over, this rank included.
  int group_size(size_t level) const;

  Bytes save_state() const;
  void load_state(const Bytes& state);

 private:
  struct Level {
    uint64_t period;
    // `owned`, or the whole communicator, or null when this rank's group is
    // itself alone (averaging over one rank changes nothing).
    Communicator* comm;
    std::unique_ptr<Communicator> owned;
  };
  Communicator& comm_;
  std::vector<Level> levels_;
  uint64_t warmup_steps_;
  uint64_t step_ = 0;
  std::vector<std::vector<uint8_t>> scratch_;
};

}  // namespace collie
