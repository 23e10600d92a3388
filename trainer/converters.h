// trainer/converters.h — model rewrites chosen by the config (torchtitan's "model converters"):
// float8 (`--float8.enable_float8_linear` or `model.converters = ["float8"]`) or int8
// (`--int8.enable_int8_linear`) training of the linears. Applied on the meta-device model,
// before parallelization, so that TP/FSDP wrap the converted computes.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "model/llama.h"
#include "parallel/fsdp.h"
#include "trainer/config.h"

namespace titan::float8 {
class Float8LinearCompute;
}

namespace titan::trainer {

struct ConvertedModel {
  bool float8 = false;
  bool int8 = false;
  bool delayed_scaling = false;                             // tensorwise_delayed: sync each step
  std::vector<float8::Float8LinearCompute*> float8_computes;  // owned by the model's linears
  bool fsdp_float8_all_gather = false;        // float8.enable_fsdp_float8_all_gather
  bool precompute_fsdp_float8_scales = false;  // float8.precompute_float8_dynamic_scale_for_fsdp
};

// Validates the float8/int8 options (bad combinations throw ConfigError saying why), converts
// the linears and logs which were converted and which were skipped, with the reason.
ConvertedModel apply_model_converters(model::Llama& model, const JobConfig& cfg, c10::Device device);

// float8.enable_fsdp_float8_all_gather under FSDP: switches every float8 linear to the weight
// FSDP gathers in float8 (Note [Float8 weight from FSDP]) and returns FSDP's receivers, by
// weight fqn, for parallel::ParallelOptions::float8_all_gather_weights.
std::map<std::string, parallel::FsdpFloat8Weight> use_fsdp_float8_all_gather(model::Llama& model);

}  // namespace titan::trainer
