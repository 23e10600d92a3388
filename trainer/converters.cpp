#include "trainer/converters.h"
#include "model/param_path.h"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "float8/convert.h"
#include "float8/float8_linear.h"
#include "float8/grouped_experts.h"
#include "util/logging.h"

namespace titan::trainer {
namespace {

// One summary line per outcome instead of one per linear: "converted (float8[rowwise]) 42:
// layers.*.attention.wq, ..." keeps the start-up log readable for 126-layer models.
void log_report(const char* kind, const float8::ConversionReport& report) {
  std::map<std::string, std::vector<std::string>> converted, skipped;
  for (const auto& [fqn, how] : report.converted) converted[how].push_back(model::layer_pattern(fqn));
  for (const auto& [fqn, why] : report.skipped) skipped[why].push_back(model::layer_pattern(fqn));
  auto join_unique = [](const std::vector<std::string>& names) {
    std::vector<std::string> seen;
    std::string out;
    for (const auto& n : names) {
      if (std::find(seen.begin(), seen.end(), n) != seen.end()) continue;
      seen.push_back(n);
      out += (out.empty() ? "" : ", ") + n;
    }
    return out;
  };
  for (const auto& [how, names] : converted)
    util::log_info(std::string(kind) + ": converted " + std::to_string(names.size()) + " linear(s) to " +
                   how + ": " + join_unique(names));
  for (const auto& [why, names] : skipped)
    util::log_info(std::string(kind) + ": kept " + std::to_string(names.size()) +
                   " linear(s) in high precision (" + why + "): " + join_unique(names));
}

// The linears a converter may change: all but those the model keeps in its precision (an MoE
// router's gate), which no filter needs to name.
std::vector<model::Linear*> convertible_linears(model::Transformer& model) {
  std::vector<model::Linear*> out;
  for (model::Linear* l : model.linears())
    if (!l->keeps_precision) out.push_back(l);
  return out;
}

}  // namespace

ConvertedModel apply_model_converters(model::Transformer& model, const config::JobConfig& cfg, c10::Device device) {
  ConvertedModel result;
  const bool float8_requested =
      cfg.float8.enable_float8_linear ||
      std::find(cfg.model.converters.begin(), cfg.model.converters.end(), "float8") !=
          cfg.model.converters.end();
  const bool mx_requested = std::find(cfg.model.converters.begin(), cfg.model.converters.end(), "mx") !=
                            cfg.model.converters.end();
  if (int(float8_requested) + int(cfg.int8.enable_int8_linear) + int(mx_requested) > 1)
    throw config::ConfigError(
        std::string("more than one low-precision training is requested (") +
        (float8_requested ? "float8 " : "") + (cfg.int8.enable_int8_linear ? "int8.enable_int8_linear " : "") +
        (mx_requested ? "model.converters = mx" : "") + "): a linear trains in one low precision; choose one");
  if (mx_requested) {
    float8::MxOptions options;
    options.recipe_name = cfg.mx.recipe_name;
    options.filter_fqns = cfg.mx.filter_fqns;
    options.emulate = cfg.mx.emulate || device.is_cpu();
    options.fused_dim1_cast = cfg.mx.mxfp8_dim1_cast_kernel_choice != "torch";
    options.auto_filter_small_kn = cfg.mx.auto_filter_small_kn;
    float8::ConversionReport report;
    try {
      report = float8::convert_to_mx_training(convertible_linears(model), options);
    } catch (const std::invalid_argument& e) {
      throw config::ConfigError(e.what());
    }
    log_report("mx", report);
    result.mx = true;
    if (options.emulate) util::log_info("mx: GEMMs are emulated (dequantized operands, the same numerics as torchao's emulation)");
  }

  if (float8_requested) {
    float8::Float8Options options;
    options.recipe_name = cfg.float8.recipe_name;
    options.filter_fqns = cfg.float8.filter_fqns;
    options.auto_filter_small_kn = cfg.float8.auto_filter_small_kn;
    // The CPU has no float8 GEMM: emulation is the only way there (docs/float8.md).
    options.emulate = cfg.float8.emulate || device.is_cpu();
    options.amax_history_len = cfg.float8.amax_history_len;
    options.enable_fsdp_float8_all_gather = cfg.float8.enable_fsdp_float8_all_gather;
    options.precompute_float8_dynamic_scale_for_fsdp = cfg.float8.precompute_float8_dynamic_scale_for_fsdp;
    float8::ConversionReport report;
    try {
      float8::validate_float8_options(options);
      report = float8::convert_to_float8_training(convertible_linears(model), options);
    } catch (const std::invalid_argument& e) {
      throw config::ConfigError(e.what());
    }
    log_report("float8", report);
    result.float8 = true;
    if (options.emulate) util::log_info("float8: GEMMs are emulated in float32 (same numerics up to the final GEMM)");
  }
  // The MoE experts (See Note [Low-precision experts] in model/moe/moe.h), apart from the linears:
  // a model may train its dense linears in one recipe and its experts in another.
  for (const auto& [converter, kind, name, fqns] :
       {std::tuple<const char*, const char*, std::string, std::vector<std::string>>{
            "quantize.grouped_mm.float8", "float8", cfg.grouped_float8.recipe_name, cfg.grouped_float8.fqns},
        {"quantize.grouped_mm.mx", "mx", cfg.grouped_mx.recipe_name, cfg.grouped_mx.fqns}}) {
    if (std::find(cfg.model.converters.begin(), cfg.model.converters.end(), converter) == cfg.model.converters.end())
      continue;
    std::vector<model::moe::MoE*> layers;
    for (model::TransformerBlock* block : model.blocks())
      if (block->moe) layers.push_back(&*block->moe);
    float8::ExpertRecipe recipe{kind, name, (std::string(kind) == "mx" ? cfg.mx.emulate : cfg.float8.emulate) || device.is_cpu()};
    // A GPU without the recipe's GEMMs emulates them (the dense linears' recipes stop instead).
    const std::string unavailable = recipe.emulate ? "" : float8::expert_gemm_unavailable(recipe, device);
    if (!unavailable.empty()) {
      util::log_warn(std::string(converter) + " " + name + ": " + unavailable + "; the experts' GEMMs are emulated");
      recipe.emulate = true;
    }
    float8::ExpertConversionReport report;
    try {
      report = float8::convert_experts(layers, fqns, recipe, std::string(converter) + ".fqns");
      if (recipe.kind == "float8" && cfg.grouped_float8.float8_dispatch)
        for (model::moe::MoE* m : layers)
          if (m->expert_computes.defined()) m->expert_computes.float8_dispatch = true;
    } catch (const std::invalid_argument& e) {
      throw config::ConfigError(e.what());
    }
    std::vector<std::string> names;
    for (const auto& [fqn, how] : report.converted)
      names.push_back(report.converted.size() == 1 ? fqn : model::layer_pattern(fqn));
    names.erase(std::unique(names.begin(), names.end()), names.end());
    std::string listed;
    for (const std::string& n : names) listed += (listed.empty() ? "" : ", ") + n;
    util::log_info(std::string(converter) + ": " + std::to_string(report.converted.size()) + " MoE layer(s)' experts in " +
                   report.converted.front().second + " (token groups quantized alone; torchtitan aligns them to " +
                   std::to_string(float8::token_group_alignment(recipe)) + " rows): " + listed +
                   (recipe.emulate ? "; GEMMs emulated" : "") +
                   (recipe.kind == "float8" && cfg.grouped_float8.float8_dispatch
                        ? "; routed rows dispatched in float8 (rowwise e4m3 + a scale per row)"
                        : ""));
    result.expert_recipe = recipe.kind + ":" + recipe.name;
  }
  if (cfg.int8.enable_int8_linear) {
    float8::Int8Options options;
    options.filter_fqns = cfg.int8.filter_fqns;
    options.gemms.output = cfg.int8.output_gemm;
    options.gemms.grad_input = cfg.int8.grad_input_gemm;
    options.gemms.grad_weight = cfg.int8.grad_weight_gemm;
    float8::ConversionReport report;
    try {
      report = float8::convert_to_int8_training(convertible_linears(model), options);
    } catch (const std::invalid_argument& e) {
      throw config::ConfigError(e.what());
    }
    log_report("int8", report);
    result.int8 = true;
  }
  return result;
}

}  // namespace titan::trainer
