// parallel/activation_checkpoint.h — activation checkpointing (AC) of transformer blocks.
//
//   [activation_checkpoint] mode = none | full | selective, selective_ac_option = "op" | "N"
//   full:          every block keeps only its input; backward re-runs its forward with grad.
//   selective N:   the same for every N-th block (layers N-1, 2N-1, ...: torchtitan's count).
//   selective op:  every block, but its recompute replays the outputs of the ops on the save
//                  list (model/checkpoint_ops.h, Note [Op save list]) instead of recomputing them.
//
// Mechanism: a block-level autograd Function whose forward runs the block with grad disabled
// (nothing is saved inside it) and whose backward re-runs it with grad from its saved input and
// back-propagates through that fresh graph (a reentrant backward; parameter grads accumulate
// into the parameters as without AC). Llama has no randomness in a block (no dropout), so no
// RNG state needs restoring. Gradients equal those without AC bit for bit on the CPU
// (tests/test_activation_checkpoint.cpp): the recompute runs the very same kernels on the very
// same inputs, and every value in a block is consumed at most twice (so the order in which the
// engine sums contributions cannot differ).
//
// Note [AC composes outermost]:
// AC is installed as the OUTER BlockRunner around whatever parallel/ installed before (FSDP):
// compose_block_runners(ac, fsdp). The recompute then calls the inner runner again, so FSDP
// re-gathers the block's parameters inside the recompute, as torchtitan's order (TP, AC, FSDP
// wrapping AC'd blocks) does. An inner runner sees its first call with grad disabled: it must
// not register backward hooks then (there is no graph), only in the recompute.
#pragma once

#include <cstdint>
#include <string>

#include "model/llama.h"

namespace titan::parallel {

enum class AcMode { kNone, kFull, kSelectiveLayer, kSelectiveOp };

struct AcOptions {
  AcMode mode = AcMode::kNone;
  int64_t every_n = 1;  // kSelectiveLayer: checkpoint every N-th block
};

// Validates the two config values; throws std::invalid_argument naming the value and what is
// allowed (mode none|full|selective; selective_ac_option "op" or an integer >= 1).
AcOptions parse_ac_options(const std::string& mode, const std::string& selective_ac_option);
std::string describe_ac(const AcOptions& options);  // "none", "full", "every 2nd block", "per-op"

// Whether block `layer_id` is checkpointed (recomputed in backward) under `options`.
bool block_is_checkpointed(const AcOptions& options, int64_t layer_id);

// Runs `run(x)` checkpointed: forward without saving, backward recomputes (per_op: replaying
// the kept outputs of listed ops). x [B, S, D] -> [B, S, D].
at::Tensor checkpoint_block(const at::Tensor& x, const std::function<at::Tensor(const at::Tensor&)>& run,
                            bool per_op, int64_t layer_id);

// The BlockRunner applying `options` (empty function for kNone).
model::BlockRunner make_ac_block_runner(const AcOptions& options);

// outer(layer, h, x -> inner(layer, x, run)). Either may be empty (then the other is returned).
model::BlockRunner compose_block_runners(model::BlockRunner outer, model::BlockRunner inner);

// Installs AC on `model` as the outermost runner (See Note [AC composes outermost]).
void apply_activation_checkpointing(model::Llama& model, const AcOptions& options);

}  // namespace titan::parallel
