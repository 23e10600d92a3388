// float8/recipe.h — which tensors of a linear are cast to float8, how, and with what scales.
//
// A recipe is plain data (TransformerEngine style): the casting functions in scaling.h and the
// autograd function in float8_linear.h read it; nothing here computes. The three named recipes
// and their aliases are the ones torchtitan's `--float8.recipe_name` accepts (see
// docs/float8.md "Recipes"), plus the historical delayed-scaling recipe (torchao's former
// Float8Linear delayed scaling: the scale from an amax history).
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

namespace titan::float8 {

// Tensorwise: one scale for the whole tensor. Axiswise ("rowwise"): one scale per slice along
// the GEMM's contraction dimension (see Note [Scale follows data] in scaling.h).
enum class ScalingGranularity { Tensorwise, Axiswise };

// How one operand of one GEMM is cast.
struct CastConfig {
  ScalingGranularity granularity = ScalingGranularity::Tensorwise;
  at::ScalarType dtype = at::kFloat8_e4m3fn;  // kFloat8_e4m3fn or kFloat8_e5m2
};

struct Float8Recipe {
  std::string name = "tensorwise";  // canonical name, e.g. "rowwise"
  CastConfig input;                 // x in output = x W^T and in grad_weight = G^T x
  CastConfig weight;                // W in output = x W^T
  CastConfig weight_for_grad_input; // W in grad_input = G W (tensorwise in rowwise_with_gw_hp)
  CastConfig grad_output;           // G in grad_input and grad_weight
  // grad_weight = G^T x in the input's high precision (rowwise_with_gw_hp).
  bool grad_weight_high_precision = false;
  // scale = exp2(floor(log2(scale))): exact scaling, no mantissa bits lost in 1/scale.
  bool round_scales_to_power_of_2 = false;
  // Fast (reduced-precision) accumulation on the output GEMM only; the backward GEMMs
  // accumulate fully (torchao's default Float8GemmConfig for every recipe).
  bool use_fast_accum_output = true;
  // Delayed scaling (tensorwise only): scales come from the max of an amax history that
  // sync_amax_history() updates once per step (see float8_linear.h).
  bool delayed = false;
  int64_t amax_history_len = 16;  // entries per operand; used only when delayed
};

// The canonical recipe names, in the order error messages list them.
const std::vector<std::string>& recipe_names();

// Recipe for a canonical name or an alias (all_axiswise = rowwise, lw_axiswise_with_gw_hp =
// rowwise_with_gw_hp). Throws std::invalid_argument naming the bad value and every valid name.
Float8Recipe recipe_from_name(const std::string& name);

// torchao's MX training recipe names, in the order error messages list them (the recipes
// themselves are in block_scaled_linear.h): mxfp8_cublas (FLOOR scales), mxfp8_cublas_rceil
// (RCEIL), mxfp8_emulated (FLOOR, emulated GEMM), mxfp4_emulated (e2m1 elements, emulated GEMM).
const std::vector<std::string>& mx_recipe_names();
// The float8 recipe name of blockwise float8 (1 x 128 activation tiles, 128 x 128 weight tiles),
// a block-scaled recipe outside recipe_names().
constexpr const char* kBlockwiseRecipeName = "blockwise";

// "tensorwise" / "axiswise".
const char* granularity_name(ScalingGranularity granularity);

// True when any operand of any GEMM is scaled axiswise.
bool recipe_uses_axiswise(const Float8Recipe& recipe);

}  // namespace titan::float8
