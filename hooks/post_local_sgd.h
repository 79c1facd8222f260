// hooks/post_local_sgd.h: the post-local SGD comm hook (Lin et al., "Don't Use
// Large Mini-Batches, Use Local SGD", ICLR 2020, arXiv:1808.07217), with the
// semantics of PyTorch's post_localSGD_hook and PostLocalSGDState.
//
//   COLLIE_COMM_HOOK="post_local_sgd:start_iter=100,subgroup=host"
//
// For the first start_iter iterations it all-reduces (averages) gradients
// over every rank, like plain DDP; from then on only within a subgroup:
//   subgroup=host  the ranks of one host (the default; COLLIE_HOSTNAME
//                  overrides the host name)
//   subgroup=K     consecutive groups of K ranks (K must divide the world size)
//   subgroup=none  no gradient communication at all (purely local steps)
// The models then drift apart between hosts (or groups), and a model averager
// (hooks/model_averager.h) run after each optimizer step pulls them back
// together every few steps.
//
// The iteration counter (the hook's state, for checkpoints) counts the
// iterations this hook has reduced: it goes up with the last bucket of each.
#pragma once

#include <memory>

#include "hooks/comm_hook.h"

namespace collie {

// Builds the hook from its parameters (start_iter, default 100; subgroup,
// default host). Values that do not parse are invalid_argument errors naming
// the parameter and what it accepts; a subgroup size that does not divide the
// world size is reported by the first run(), where the world is known.
std::unique_ptr<CommHook> make_post_local_sgd_hook(const HookParams& params);

}  // namespace collie
