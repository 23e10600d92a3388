// trainer/converters.h — model rewrites chosen by the config (torchtitan's "model converters"):
// float8 (`--float8.enable_float8_linear` or `model.converters = ["float8"]`) or int8
// (`--int8.enable_int8_linear`) training of the linears; the MoE experts' recipes
// (`model.converters` quantize.grouped_mm.float8 / .mx, float8/grouped_experts.h). Applied on the meta-device model,
// before parallelization, so that TP/FSDP wrap the converted computes.
#pragma once

#include <c10/core/Device.h>

#include <string>

#include "model/transformer.h"
#include "trainer/config/job_config.h"

namespace titan::trainer {

struct ConvertedModel {
  bool float8 = false;
  bool int8 = false;
  bool mx = false;  // MX block-scaled training ([mx])
  std::string expert_recipe;  // "float8:rowwise", "mx:mxfp8", ... when the MoE experts are converted; else ""
};

// Validates the float8/int8 options (bad combinations throw ConfigError saying why), converts
// the linears and logs which were converted and which were skipped, with the reason.
// The float8 options that shape the parallel plan (the FSDP float8 all-gather, precomputed
// scales, the TP float8 input gather) go to parallel::ParallelOptions instead: the plan builds
// what float8 needs itself.
ConvertedModel apply_model_converters(model::Transformer& model, const config::JobConfig& cfg, c10::Device device);

}  // namespace titan::trainer
