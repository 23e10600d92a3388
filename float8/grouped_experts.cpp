// float8/grouped_experts.cpp — see grouped_experts.h.
#include "float8/grouped_experts.h"

#include <algorithm>
#include <memory>
#include <stdexcept>

#include "float8/block_scaled_linear.h"
#include "float8/float8_linear.h"
#include "float8/gemm.h"
#include "float8/recipe.h"

namespace titan::float8 {

const std::vector<std::string>& grouped_float8_recipe_names() {
  static const std::vector<std::string> names = {"rowwise", kBlockwiseRecipeName};
  return names;
}

const std::vector<std::string>& grouped_mx_recipe_names() {
  static const std::vector<std::string> names = {"mxfp8", "mxfp8_rceil", "mxfp8_floor"};
  return names;
}

namespace {

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

void check_recipe(const ExpertRecipe& r) {
  if (r.kind == "float8") {
    const auto& names = grouped_float8_recipe_names();
    if (std::find(names.begin(), names.end(), r.name) == names.end())
      throw std::invalid_argument("quantize.grouped_mm.float8.recipe_name '" + r.name + "' is not one of: " + joined(names));
  } else if (r.kind == "mx") {
    const auto& names = grouped_mx_recipe_names();
    if (std::find(names.begin(), names.end(), r.name) == names.end())
      throw std::invalid_argument("quantize.grouped_mm.mx.recipe_name '" + r.name + "' is not one of: " + joined(names));
  } else {
    throw std::invalid_argument("expert recipe kind '" + r.kind + "' is not one of: float8, mx");
  }
}

// The dense recipe an expert recipe applies per group.
BlockScaledRecipe block_recipe(const ExpertRecipe& r) {
  if (r.kind == "float8") return block_scaled_recipe_from_name(kBlockwiseRecipeName);
  // torchao 0.18's MXFP8 grouped GEMMs scale with RCEIL unless asked for FLOOR.
  return block_scaled_recipe_from_name(r.name == "mxfp8_floor" ? "mxfp8_cublas" : "mxfp8_cublas_rceil");
}

bool is_rowwise(const ExpertRecipe& r) { return r.kind == "float8" && r.name == "rowwise"; }

// The divisor every expert dimension (D, H, and H/tp under TP) must have: the float8 GEMM's 16,
// an MX block's 32; blockwise tiles may be partial, so 16 (its GEMM's alignment) as well.
int64_t dimension_divisor(const ExpertRecipe& r) { return r.kind == "mx" ? 32 : 16; }

}  // namespace

int64_t token_group_alignment(const ExpertRecipe& r) {
  check_recipe(r);
  if (r.kind == "mx") return 32;
  return is_rowwise(r) ? 16 : 128;
}

std::string expert_gemm_unavailable(const ExpertRecipe& r, const c10::Device& device) {
  check_recipe(r);
  if (!device.is_cuda()) return "";
  const int needs = r.kind == "mx" ? 100 : is_rowwise(r) ? 89 : 90;
  const int has = cuda_compute_capability(device);
  if (has >= needs) return "";
  return "its GEMMs need sm" + std::to_string(needs) + "+, this GPU is " +
         (has > 0 ? "sm" + std::to_string(has) : std::string("unknown"));
}

model::moe::ExpertComputes expert_computes(const ExpertRecipe& r) {
  check_recipe(r);
  model::moe::ExpertComputes c;
  // MX's weight gradient casts the tokens in blocks of 32, which its linear needs whole.
  c.group_alignment = r.kind == "mx" ? 32 : 1;
  for (std::shared_ptr<model::LinearCompute>* slot : {&c.w1, &c.w2, &c.w3}) {
    if (is_rowwise(r))
      *slot = std::make_shared<Float8LinearCompute>(recipe_from_name("rowwise"), r.emulate);
    else
      *slot = std::make_shared<BlockScaledLinearCompute>(block_recipe(r),
                                                         r.emulate ? BlockGemmBackend::Emulated : BlockGemmBackend::Auto);
  }
  return c;
}

ExpertConversionReport convert_experts(const std::vector<model::moe::MoE*>& layers, const std::vector<std::string>& fqns,
                                       const ExpertRecipe& recipe, const std::string& fqns_key) {
  check_recipe(recipe);
  const std::string converter = "quantize.grouped_mm." + recipe.kind;
  if (layers.empty())
    throw std::invalid_argument("model.converters lists " + converter +
                                ", but the model has no mixture-of-experts layer (no experts to convert)");
  std::string available;
  for (const model::moe::MoE* m : layers) available += (available.empty() ? "" : ", ") + m->prefix + ".experts";
  if (fqns.empty())
    throw std::invalid_argument(fqns_key + " is empty: model.converters lists " + converter +
                                " but names no MoE module to convert (the model's: " + available +
                                "; \"experts\" names them all)");
  auto selects = [](const std::string& entry, const model::moe::MoE& m) {
    return !entry.empty() && (m.prefix + ".experts").find(entry) != std::string::npos;
  };
  for (const std::string& entry : fqns)
    if (std::none_of(layers.begin(), layers.end(), [&](const model::moe::MoE* m) { return selects(entry, *m); }))
      throw std::invalid_argument(fqns_key + " entry '" + entry + "' names no MoE module (the model's: " + available +
                                  "; \"experts\" names them all)");
  ExpertConversionReport report;
  const int64_t divisor = dimension_divisor(recipe);
  for (model::moe::MoE* m : layers) {
    if (std::none_of(fqns.begin(), fqns.end(), [&](const std::string& e) { return selects(e, *m); })) continue;
    if (m->dim % divisor != 0 || m->hidden_dim % divisor != 0)
      throw std::invalid_argument(m->prefix + ".experts: dim " + std::to_string(m->dim) + " and hidden dim " +
                                  std::to_string(m->hidden_dim) + " must both be divisible by " + std::to_string(divisor) +
                                  " for " + converter + " recipe " + recipe.name +
                                  (recipe.kind == "mx" ? " (one MX block is 32 elements)" : " (the float8 GEMM's alignment)"));
    m->expert_computes = expert_computes(recipe);
    report.converted.emplace_back(m->prefix + ".experts", m->expert_computes.describe());
  }
  return report;
}

model::moe::ExpertComputes expert_computes_under_tp(const model::moe::MoE& layer, int tp_degree,
                                                    const std::function<void(at::Tensor&)>& amax_max) {
  const model::moe::ExpertComputes& c = layer.expert_computes;
  if (!c.defined() || tp_degree <= 1) return c;
  const int64_t local_hidden = layer.hidden_dim / tp_degree;
  if (const auto* block = dynamic_cast<const BlockScaledLinearCompute*>(model::innermost(c.w1))) {
    const int64_t alignment = block->block_alignment();
    // A 128 x 128 weight tile may be partial only at the tensor's own edge, not at a shard's.
    if (local_hidden % alignment != 0)
      throw std::invalid_argument(layer.prefix + ".experts: tensor parallel " + std::to_string(tp_degree) +
                                  " shards the experts' hidden dim " + std::to_string(layer.hidden_dim) + " into " +
                                  std::to_string(local_hidden) + " columns, not a multiple of the " +
                                  block->recipe().name + " block of " + std::to_string(alignment) +
                                  " (a block would span two ranks)");
    return c;
  }
  if (local_hidden % 16 != 0)
    throw std::invalid_argument(layer.prefix + ".experts: tensor parallel " + std::to_string(tp_degree) +
                                " leaves a hidden shard of " + std::to_string(local_hidden) +
                                ", not divisible by 16 (the float8 GEMM's alignment)");
  const auto* f8 = dynamic_cast<const Float8LinearCompute*>(model::innermost(c.w1));
  if (!f8) return c;
  // Along which dimension of each 2-D operand this rank holds a shard (0 rows, 1 columns): the
  // gate / up projections are column-sharded (their weight's rows, their output gradient's
  // columns), the down projection row-sharded (its input's and weight's columns).
  model::moe::ExpertComputes out = c;
  out.w1 = std::make_shared<Float8LinearCompute>(f8->recipe(), f8->emulate(), f8->backend(), TpSharding{amax_max, -1, 0, 1});
  out.w3 = std::make_shared<Float8LinearCompute>(f8->recipe(), f8->emulate(), f8->backend(), TpSharding{amax_max, -1, 0, 1});
  out.w2 = std::make_shared<Float8LinearCompute>(f8->recipe(), f8->emulate(), f8->backend(), TpSharding{amax_max, 1, 1, -1});
  return out;
}

}  // namespace titan::float8
