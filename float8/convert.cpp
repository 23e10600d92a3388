#include "float8/convert.h"

#include <memory>
#include <stdexcept>

#include "float8/float8_linear.h"
#include "float8/recipe.h"

namespace titan::float8 {

namespace {

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

void validate_float8_options(const Float8Options& options) {
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
  const Float8Recipe recipe = recipe_from_name(recipe_name);
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
  Float8Recipe recipe = recipe_from_name(options.recipe_name);
  recipe.amax_history_len = options.amax_history_len;
  ConversionReport report;
  for (titan::model::Linear* linear : linears) {
    std::string reason = common_skip_reason(*linear, options.filter_fqns);
    if (reason.empty() && options.auto_filter_small_kn) {
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
