// float8/grouped_experts.h — low-precision MoE experts: the recipes of torchtitan's
// quantize.grouped_mm.float8 / quantize.grouped_mm.mx, installed on the MoE layers a list of fqns
// names (docs/low_precision.md "Experts").
//
// An expert recipe is the dense linears' recipe applied to each expert's token group (Note
// [Low-precision experts] in model/moe/moe.h), which is what torchao's grouped GEMMs compute:
//   float8 rowwise (torchao 0.18 _Float8GroupedMM, MoETrainingConfig's FP8_ROWWISE): e4m3 in all
//     three GEMMs, power-of-2 scales; out = A @ B with A per row and each expert's B = W^T per
//     column (over K); grad_A = G @ W with G per row and W per column of W (over N); grad_W = G^T A
//     per group with G and A each scaled per column over the group's tokens. That is the dense
//     "rowwise" recipe per expert.
//   blockwise float8 (DeepSeek-V3's; not in torchtitan 0.2.2): 1 x 128 activation tiles, 128 x 128
//     weight tiles, the dense "blockwise" recipe per expert.
//   MXFP8 (torchao 0.18 _MXFP8GroupedMM): e4m3 elements, one E8M0 scale per 1 x 32 block along the
//     contraction dimension of each GEMM, per group; torchao's default RCEIL scales ("mxfp8",
//     "mxfp8_rceil") or FLOOR ("mxfp8_floor"). The dense MX recipe per expert.
// Checkpoints gain nothing: no recipe here keeps state across steps.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <c10/core/Device.h>

#include "model/moe/moe.h"

namespace titan::float8 {

// quantize.grouped_mm.float8.recipe_name's choices: rowwise (torchtitan's, the default), blockwise.
const std::vector<std::string>& grouped_float8_recipe_names();
// quantize.grouped_mm.mx.recipe_name's choices: mxfp8 (torchtitan's, = mxfp8_rceil), mxfp8_rceil,
// mxfp8_floor.
const std::vector<std::string>& grouped_mx_recipe_names();

// Which expert recipe: kind "float8" or "mx", and a name of that kind's list.
struct ExpertRecipe {
  std::string kind;
  std::string name;
  bool emulate = false;  // emulated GEMMs even on CUDA (the CPU always emulates)
};

// torchtitan's token-group alignment for the recipe (set_token_group_alignment_size_m: 16 for
// float8 rowwise, 32 for MXFP8; 128 for blockwise, its token tile). titan's grouped products
// quantize each group alone, so this is the group granularity a fused grouped-GEMM kernel would
// pad to; the numbers are the same padded or not (Note [Low-precision experts]).
int64_t token_group_alignment(const ExpertRecipe& recipe);

// Why the recipe's GEMMs cannot run natively on `device` ("" when they can, and on the CPU, which
// always emulates): float8 rowwise needs sm89+ (_scaled_mm), blockwise sm90+, MXFP8 sm100+
// (cuBLASLt's block scales). The converter then emulates them and says so once.
std::string expert_gemm_unavailable(const ExpertRecipe& recipe, const c10::Device& device);

// The three per-expert computes of the recipe. Throws std::invalid_argument naming the recipe
// and the valid names.
model::moe::ExpertComputes expert_computes(const ExpertRecipe& recipe);

// The MoE layers whose routed experts a list of torchtitan fqns selects: layer `prefix` is
// selected when some entry is a substring of "<prefix>.experts" (torchtitan's filter: an entry
// contained in a module's fqn; naming the MoE layer, its experts or a parent selects it).
struct ExpertConversionReport {
  std::vector<std::pair<std::string, std::string>> converted;  // "<prefix>.experts", description
};
// Installs expert_computes(recipe) on every selected layer. Throws std::invalid_argument when
// `fqns` is empty, when an entry selects no layer (naming it and the MoE layers the model has),
// when `layers` is empty (a model without experts), or when an expert dimension does not suit the
// recipe (float8 GEMMs need D and H divisible by 16, MX by 32), naming the layer and its shapes.
ExpertConversionReport convert_experts(const std::vector<model::moe::MoE*>& layers, const std::vector<std::string>& fqns,
                                       const ExpertRecipe& recipe, const std::string& fqns_key);

// The computes of one MoE layer whose experts tensor parallelism shards on their hidden dimension
// H (w1, w3 [E, H/tp, D], w2 [E, D, H/tp]): float8 computes are rebuilt so that every amax that
// reduces along H reduces over the TP group as well (`amax_max`, Note [Scales under TP] in
// float8_linear.h), so a TP run casts what one process casts; block-scaled computes need H/tp to
// be a multiple of their block (a block never spans two ranks). Throws std::invalid_argument
// naming the layer, H, the degree and the block otherwise.
model::moe::ExpertComputes expert_computes_under_tp(const model::moe::MoE& layer, int tp_degree,
                                                    const std::function<void(at::Tensor&)>& amax_max);

}  // namespace titan::float8
