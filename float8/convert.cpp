#include "float8/convert.h"

#include <algorithm>
#include <memory>
#include <stdexcept>

#include "float8/block_scaled_linear.h"
#include "float8/float8_linear.h"
#include "float8/recipe.h"

namespace titan::float8 {

namespace {

// torchtitan 0.2.x spells the auto filter as an entry of filter_fqns: "auto_filter_small_kn"
// turns it on and is not a module name.
constexpr const char* kAutoFilterEntry = "auto_filter_small_kn";

std::vector<std::string> without_auto_filter_entry(const std::vector<std::string>& filter_fqns) {
  std::vector<std::string> out;
  for (const std::string& f : filter_fqns)
    if (f != kAutoFilterEntry) out.push_back(f);
  return out;
}

bool asks_auto_filter(const std::vector<std::string>& filter_fqns, bool auto_filter) {
  return auto_filter || std::find(filter_fqns.begin(), filter_fqns.end(), kAutoFilterEntry) != filter_fqns.end();
}

// The reason a linear may not be converted at all, or "".
std::string common_skip_reason(const titan::model::Linear& linear,
                               const std::vector<std::string>& filter_fqns) {
  for (const std::string& f : filter_fqns) {
    if (!f.empty() && linear.fqn().find(f) != std::string::npos) {
      return "fqn matches filter_fqns entry '" + f + "'";
    }
  }
  if (linear.in_features() % 16 != 0 || linear.out_features() % 16 != 0) {
    return "in_features " + std::to_string(linear.in_features()) + " or out_features " +
           std::to_string(linear.out_features()) + " not divisible by 16";
  }
  if (!dynamic_cast<const titan::model::HighPrecisionLinearCompute*>(linear.compute().get())) {
    return "compute is already '" + linear.compute()->describe() +
           "' (convert before parallelizing)";
  }
  return "";
}

}  // namespace

namespace {

// Block-scaled installation shared by MX and blockwise float8.
ConversionReport convert_block_scaled(const std::vector<titan::model::Linear*>& linears, const BlockScaledRecipe& recipe,
                                      const std::vector<std::string>& filter_fqns, bool emulate, bool auto_filter,
                                      bool fused_dim1_cast = true) {
  const int64_t block = std::max(recipe.activation.block_cols, recipe.weight.block_cols);
  const BlockGemmBackend backend = emulate ? BlockGemmBackend::Emulated : BlockGemmBackend::Auto;
  auto_filter = asks_auto_filter(filter_fqns, auto_filter);
  const std::vector<std::string> names = without_auto_filter_entry(filter_fqns);
  ConversionReport report;
  for (titan::model::Linear* linear : linears) {
    std::string reason = common_skip_reason(*linear, names);
    if (reason.empty() && (linear->in_features() % block != 0 || linear->out_features() % block != 0))
      reason = "in_features " + std::to_string(linear->in_features()) + " or out_features " +
               std::to_string(linear->out_features()) + " not divisible by the block length " + std::to_string(block);
    if (reason.empty() && auto_filter)
      reason = auto_filter_skip_reason(recipe.name, linear->in_features(), linear->out_features());
    if (!reason.empty()) {
      report.skipped.emplace_back(linear->fqn(), reason);
      continue;
    }
    auto compute = std::make_shared<BlockScaledLinearCompute>(recipe, backend, fused_dim1_cast);
    report.converted.emplace_back(linear->fqn(), compute->describe());
    linear->set_compute(std::move(compute));
  }
  return report;
}

}  // namespace

void validate_float8_options(const Float8Options& options) {
  if (options.recipe_name == kBlockwiseRecipeName) {
    if (options.enable_fsdp_float8_all_gather)
      throw std::invalid_argument(
          "float8.enable_fsdp_float8_all_gather needs a tensorwise dynamic recipe, but recipe_name = "
          "'blockwise' scales each 128 x 128 weight tile itself (FSDP gathers the high-precision "
          "weight, so no tile straddles two shards). Disable the float8 all-gather.");
    if (options.precompute_float8_dynamic_scale_for_fsdp)
      throw std::invalid_argument("float8.precompute_float8_dynamic_scale_for_fsdp needs the tensorwise "
                                  "float8 all-gather; recipe_name = 'blockwise' has none");
    return;
  }
  const Float8Recipe recipe = recipe_from_name(options.recipe_name);  // throws for bad names
  if (options.amax_history_len < 1) {
    throw std::invalid_argument("float8.amax_history_len = " +
                                std::to_string(options.amax_history_len) + " must be >= 1");
  }
  if (options.enable_fsdp_float8_all_gather &&
      (recipe.weight.granularity != ScalingGranularity::Tensorwise ||
       recipe.weight_for_grad_input.granularity != ScalingGranularity::Tensorwise ||
       recipe.delayed)) {
    throw std::invalid_argument(
        "float8.enable_fsdp_float8_all_gather needs a tensorwise dynamic recipe, but "
        "recipe_name = '" + options.recipe_name + "' scales weights " +
        (recipe.delayed ? "with delayed scaling"
                        : std::string(granularity_name(recipe.weight.granularity)) +
                              " for the output GEMM and " +
                              granularity_name(recipe.weight_for_grad_input.granularity) +
                              " for grad_input") +
        ": a weight shard cast with one global scale serves both GEMMs only when that scale is "
        "tensorwise. Use recipe_name = 'tensorwise' or disable the float8 all-gather.");
  }
  if (options.precompute_float8_dynamic_scale_for_fsdp && !options.enable_fsdp_float8_all_gather) {
    throw std::invalid_argument(
        "float8.precompute_float8_dynamic_scale_for_fsdp = true needs "
        "float8.enable_fsdp_float8_all_gather = true (the precomputed scales are only used by "
        "the float8 all-gather)");
  }
}

std::string auto_filter_skip_reason(const std::string& recipe_name, int64_t K, int64_t N) {
  // torchao publishes no table for the block-scaled recipes (MX, blockwise); their per-block
  // scales and casts along both dimensions cost what rowwise's per-row ones do, so they use its.
  const Float8Recipe recipe = recipe_from_name(is_block_scaled_recipe_name(recipe_name) ? "rowwise" : recipe_name);
  const std::string kn = "K=" + std::to_string(K) + ", N=" + std::to_string(N);
  if (!recipe_uses_axiswise(recipe)) {
    if (K <= 4096 && N <= 1024) {
      return "auto_filter_small_kn: " + kn + " (K <= 4096 and N <= 1024): tensorwise float8 is "
             "slower than bf16 here";
    }
    return "";
  }
  if (N <= 2048) return "auto_filter_small_kn: " + kn + " (N <= 2048): rowwise float8 is slower";
  if (K <= 1024) return "auto_filter_small_kn: " + kn + " (K <= 1024): rowwise float8 is slower";
  if (N <= 4096 && K <= 2048) {
    return "auto_filter_small_kn: " + kn + " (N <= 4096 and K <= 2048): rowwise float8 is slower";
  }
  return "";
}

ConversionReport convert_to_float8_training(std::vector<titan::model::Linear*> linears,
                                            const Float8Options& options) {
  validate_float8_options(options);
  if (options.recipe_name == kBlockwiseRecipeName)
    return convert_block_scaled(linears, block_scaled_recipe_from_name(kBlockwiseRecipeName), options.filter_fqns,
                                options.emulate, options.auto_filter_small_kn);
  Float8Recipe recipe = recipe_from_name(options.recipe_name);
  recipe.amax_history_len = options.amax_history_len;
  const bool auto_filter = asks_auto_filter(options.filter_fqns, options.auto_filter_small_kn);
  const std::vector<std::string> names = without_auto_filter_entry(options.filter_fqns);
  ConversionReport report;
  for (titan::model::Linear* linear : linears) {
    std::string reason = common_skip_reason(*linear, names);
    if (reason.empty() && auto_filter) {
      reason = auto_filter_skip_reason(recipe.name, linear->in_features(),
                                       linear->out_features());
    }
    if (!reason.empty()) {
      report.skipped.emplace_back(linear->fqn(), reason);
      continue;
    }
    auto compute = std::make_shared<Float8LinearCompute>(recipe, options.emulate);
    report.converted.emplace_back(linear->fqn(), compute->describe());
    linear->set_compute(std::move(compute));
  }
  return report;
}

ConversionReport convert_to_mx_training(std::vector<titan::model::Linear*> linears, const MxOptions& options) {
  if (options.recipe_name == kBlockwiseRecipeName)
    throw std::invalid_argument("mx.recipe_name = 'blockwise' is a float8 recipe: use --float8.recipe_name blockwise");
  return convert_block_scaled(linears, block_scaled_recipe_from_name(options.recipe_name), options.filter_fqns,
                              options.emulate, options.auto_filter_small_kn, options.fused_dim1_cast);
}

ConversionReport convert_to_int8_training(std::vector<titan::model::Linear*> linears,
                                          const Int8Options& options) {
  ConversionReport report;
  const Int8MmBackend backend = options.emulate ? Int8MmBackend::Emulated : Int8MmBackend::Auto;
  for (titan::model::Linear* linear : linears) {
    std::string reason = common_skip_reason(*linear, options.filter_fqns);
    if (!reason.empty()) {
      report.skipped.emplace_back(linear->fqn(), reason);
      continue;
    }
    auto compute = std::make_shared<Int8LinearCompute>(options.gemms, backend);
    report.converted.emplace_back(linear->fqn(), compute->describe());
    linear->set_compute(std::move(compute));
  }
  return report;
}

}  // namespace titan::float8
