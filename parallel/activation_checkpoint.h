// parallel/activation_checkpoint.h — activation checkpointing (AC) of transformer blocks.
//
//   [activation_checkpoint] mode = none | full | selective, selective_ac_option = "op" | "N"
//   full:          every block keeps only its input; backward re-runs its forward with grad.
//   selective N:   the same for every N-th block (layers N-1, 2N-1, ...: torchtitan's count).
//   selective op:  every block, but its recompute replays the outputs of the ops on the save
//                  list (model/activation_checkpoint_ops.h, Note [Op save list]) instead of recomputing them.
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
// Note [FSDP wraps AC]:
// parallelize_model applies AC before FSDP, so FSDP's wrapper is the outer one (torchtitan's
// order: fully_shard wraps the checkpointed block). FSDP's gather brackets the block's first
// forward, its backward hook re-gathers the parameters before this backward recomputes the
// block, and the recompute runs on the gathered parameters without FSDP seeing it.
#pragma once

#include <cstdint>
#include <string>

#include "model/activation_checkpoint_ops.h"
#include "model/transformer.h"

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

// The ops whose outputs per-op selective AC keeps (See Note [Op save list] in the .cpp).
const model::SaveList& selective_ac_save_list();
bool op_on_save_list(const std::string& op);

// Runs `run(x)` checkpointed: forward without saving, backward recomputes (per_op: replaying
// the kept outputs of the save list's ops). x [B, S, D] -> [B, S, D].
at::Tensor checkpoint_block(const at::Tensor& x, const model::ForwardFn& run, bool per_op, int64_t layer_id);

// Wraps every checkpointed block of `model` (block_is_checkpointed) in AC, named "ac(full)" /
// "ac(op)" in the model's describe(). No-op for AcMode::kNone.
void apply_ac(model::Transformer& model, const AcOptions& options);

}  // namespace titan::parallel
