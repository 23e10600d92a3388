#include "float8/recipe.h"

#include <stdexcept>

namespace titan::float8 {

namespace {

constexpr CastConfig kTensorE4m3{ScalingGranularity::Tensorwise, at::kFloat8_e4m3fn};
constexpr CastConfig kTensorE5m2{ScalingGranularity::Tensorwise, at::kFloat8_e5m2};
constexpr CastConfig kAxisE4m3{ScalingGranularity::Axiswise, at::kFloat8_e4m3fn};

// e4m3 for the forward operands (precision), e5m2 for gradients (range): the FP8 paper's split.
Float8Recipe tensorwise_recipe() {
  Float8Recipe r;
  r.name = "tensorwise";
  r.input = kTensorE4m3;
  r.weight = kTensorE4m3;
  r.weight_for_grad_input = kTensorE4m3;
  r.grad_output = kTensorE5m2;
  return r;
}

// Per-row scales keep outliers from flattening a whole tensor, so e4m3 suffices for gradients.
Float8Recipe rowwise_recipe() {
  Float8Recipe r;
  r.name = "rowwise";
  r.input = kAxisE4m3;
  r.weight = kAxisE4m3;
  r.weight_for_grad_input = kAxisE4m3;
  r.grad_output = kAxisE4m3;
  r.round_scales_to_power_of_2 = true;
  return r;
}

Float8Recipe rowwise_with_gw_hp_recipe() {
  Float8Recipe r = rowwise_recipe();
  r.name = "rowwise_with_gw_hp";
  r.weight_for_grad_input = kTensorE4m3;
  r.grad_weight_high_precision = true;
  return r;
}

Float8Recipe tensorwise_delayed_recipe() {
  Float8Recipe r = tensorwise_recipe();
  r.name = "tensorwise_delayed";
  r.delayed = true;
  return r;
}

}  // namespace

const std::vector<std::string>& recipe_names() {
  static const std::vector<std::string> names = {"tensorwise", "rowwise", "rowwise_with_gw_hp",
                                                 "tensorwise_delayed"};
  return names;
}

Float8Recipe recipe_from_name(const std::string& name) {
  if (name == "tensorwise") return tensorwise_recipe();
  if (name == "rowwise" || name == "all_axiswise") return rowwise_recipe();
  if (name == "rowwise_with_gw_hp" || name == "lw_axiswise_with_gw_hp") {
    return rowwise_with_gw_hp_recipe();
  }
  if (name == "tensorwise_delayed") return tensorwise_delayed_recipe();
  std::string valid;
  for (const auto& n : recipe_names()) valid += (valid.empty() ? "" : ", ") + n;
  throw std::invalid_argument("unknown float8 recipe_name '" + name + "'; valid names: " + valid +
                              " (aliases: all_axiswise = rowwise, lw_axiswise_with_gw_hp = "
                              "rowwise_with_gw_hp)");
}

const std::vector<std::string>& mx_recipe_names() {
  static const std::vector<std::string> names = {"mxfp8_cublas", "mxfp8_cublas_rceil", "mxfp8_emulated",
                                                 "mxfp4_emulated"};
  return names;
}

const char* granularity_name(ScalingGranularity granularity) {
  return granularity == ScalingGranularity::Tensorwise ? "tensorwise" : "axiswise";
}

bool recipe_uses_axiswise(const Float8Recipe& recipe) {
  for (const CastConfig* c :
       {&recipe.input, &recipe.weight, &recipe.weight_for_grad_input, &recipe.grad_output}) {
    if (c->granularity == ScalingGranularity::Axiswise) return true;
  }
  return false;
}

}  // namespace titan::float8
