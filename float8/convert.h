// float8/convert.h — install float8 / int8 computes on a model's linears, by name and shape.
//
// The C++ counterpart of torchao's convert_to_float8_training with torchtitan's filters: every
// Linear is converted unless its fully-qualified name contains a filter_fqns entry, a dimension
// is not divisible by 16 (float8 GEMM hardware rule), or the optional auto filter predicts
// float8 to be slower for its (K, N) (docs/float8.md "Which linears are converted"). The weight
// tensor never changes hands (see model/linear.h); the report says what happened to each
// linear and why, for the trainer to log.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "float8/int8_linear.h"
#include "model/linear.h"

namespace titan::float8 {

struct Float8Options {
  // tensorwise | rowwise | rowwise_with_gw_hp | tensorwise_delayed (+ aliases) | blockwise
  std::string recipe_name = "tensorwise";
  // Skip linears whose fqn contains one; the entry "auto_filter_small_kn" (torchtitan 0.2.x's
  // spelling) turns on the auto filter instead (float8 and MX alike).
  std::vector<std::string> filter_fqns = {"output"};
  bool auto_filter_small_kn = false;  // skip (K, N) where float8 is slower than bf16
  bool emulate = false;               // emulated GEMMs even on CUDA (the CPU always emulates)
  int64_t amax_history_len = 16;      // delayed recipes: history entries per operand
  bool enable_fsdp_float8_all_gather = false;  // all-gather float8 weight shards (tensorwise)
  bool precompute_float8_dynamic_scale_for_fsdp = false;  // one all-reduce for all weight scales
};

struct Int8Options {
  std::vector<std::string> filter_fqns = {"output"};
  Int8GemmSwitches gemms;  // which of the three GEMMs run in int8
  bool emulate = false;    // exact emulated int32 accumulation instead of at::_int_mm
};

// MX training (torchtitan's [mx] / [quantize.linear.mx]): a recipe of mx_recipe_names().
struct MxOptions {
  std::string recipe_name = "mxfp8_cublas";
  std::vector<std::string> filter_fqns = {"output"};
  bool emulate = false;  // emulated GEMMs even on CUDA (the CPU always emulates)
  bool fused_dim1_cast = true;  // mxfp8_dim1_cast_kernel_choice "torch": false
  bool auto_filter_small_kn = false;  // float8 rowwise's table (torchao has none for MX)
};

struct ConversionReport {
  std::vector<std::pair<std::string, std::string>> converted;  // fqn, compute description
  std::vector<std::pair<std::string, std::string>> skipped;    // fqn, reason
};

// Throws std::invalid_argument saying what is wrong and what would be right: an unknown
// recipe, amax_history_len < 1, fsdp float8 all-gather with an axiswise or delayed recipe
// (only tensorwise-dynamic weights can be cast per shard with a global scale), or precompute
// without the float8 all-gather it feeds.
void validate_float8_options(const Float8Options& options);

// Why the auto filter skips a linear with in_features K and out_features N under the recipe
// (torchao's thresholds, listed in docs/float8.md; delayed recipes use tensorwise's,
// rowwise_with_gw_hp rowwise's), or
// "" when float8 is expected to pay off.
std::string auto_filter_skip_reason(const std::string& recipe_name, int64_t K, int64_t N);

// Installs one Float8LinearCompute per eligible linear (each owns its delayed-scaling state).
// Linears whose compute is not the default high-precision one are skipped (already converted
// or wrapped), so conversion must run before tensor parallelism wraps computes.
ConversionReport convert_to_float8_training(std::vector<titan::model::Linear*> linears,
                                            const Float8Options& options);

// Installs one BlockScaledLinearCompute per eligible linear: the float8 filters, and in/out
// features divisible by the block length (32 for MX, 128 for blockwise: torchao never pads a
// block). Throws std::invalid_argument for an unknown recipe name.
ConversionReport convert_to_mx_training(std::vector<titan::model::Linear*> linears, const MxOptions& options);

// Same filters (fqn, divisibility by 16 for the int8 GEMM alignment) with Int8LinearCompute.
ConversionReport convert_to_int8_training(std::vector<titan::model::Linear*> linears,
                                          const Int8Options& options);

}  // namespace titan::float8
