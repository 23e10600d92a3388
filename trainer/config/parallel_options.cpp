// trainer/config/parallel_options.cpp — see parallel_options.h.
#include "trainer/config/parallel_options.h"

#include <stdexcept>
#include <string>

#include "model/flavors.h"
#include "parallel/activation_checkpoint.h"
#include "parallel/parallelize.h"
#include "trainer/config/pipeline_keys.h"

namespace titan::trainer::config {

bool block_causal_attention(const JobConfig& cfg) {
  return cfg.model.attn_mask_type == "block_causal" || model::model_flavor(cfg.model.name, cfg.model.flavor).block_causal;
}

at::ScalarType dtype_from_name(const std::string& name, const char* key) {
  if (name == "float32") return at::kFloat;
  if (name == "bfloat16") return at::kBFloat16;
  if (name == "float16") return at::kHalf;
  throw ConfigError(std::string(key) + " '" + name + "' (valid: float32, bfloat16, float16)");
}


model::CpuFloat32Gemm cpu_float32_gemm_of(const JobConfig& cfg) {
  if (cfg.training.cpu_float32_gemm != "onednn") return model::CpuFloat32Gemm::kAten;
  if (!model::onednn_linear_available())
    throw ConfigError("training.cpu_float32_gemm = onednn, but this LibTorch has no oneDNN linear "
                      "(mkldnn::_linear_pointwise); use aten");
  return model::CpuFloat32Gemm::kOneDnn;
}

parallel::comm::ParallelDims parallel_dims(const JobConfig& cfg, int world_size) {
  const auto& p = cfg.parallelism;
  try {
    return parallel::comm::resolve_parallel_dims(p.data_parallel_replicate_degree, p.data_parallel_shard_degree,
                                                 p.tensor_parallel_degree, p.pipeline_parallel_degree,
                                                 p.context_parallel_degree, world_size, p.expert_parallel_degree,
                                                 p.expert_tensor_parallel_degree);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(e.what());
  }
}

std::optional<parallel::pipeline::PipelinePlan> pipeline_plan(const JobConfig& cfg, const parallel::comm::ParallelDims& dims) {
  if (dims.pp <= 1) return std::nullopt;
  const parallel::pipeline::PipelineConfig pc = pipeline_config(cfg);
  try {
    const int64_t n_layers = model::model_flavor(cfg.model.name, cfg.model.flavor).n_layers;
    return parallel::pipeline::plan_pipeline(pc, dims.pp, n_layers, cfg.training.local_batch_size);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(std::string("pipeline parallel: ") + e.what());
  }
}

parallel::context_parallel::CpRotateMethod context_parallel_method(const JobConfig& cfg, const parallel::comm::ParallelDims& dims) {
  try {
    const parallel::context_parallel::CpRotateMethod method =
        parallel::context_parallel::cp_rotate_method_from_name(cfg.parallelism.context_parallel_rotate_method);
    parallel::context_parallel::check_cp_degree(model::model_flavor(cfg.model.name, cfg.model.flavor), dims.cp, dims.tp, cfg.training.seq_len, method);
    return method;
  } catch (const std::invalid_argument& e) {
    throw ConfigError(e.what());
  }
}

int64_t global_batch_size(const JobConfig& cfg, const parallel::comm::ParallelDims& dims) {
  const auto& t = cfg.training;
  const int64_t dp_degree = dims.dp();
  const int64_t global = t.global_batch_size > 0 ? t.global_batch_size : t.local_batch_size * dp_degree;
  if (global % (t.local_batch_size * dp_degree) != 0)
    throw ConfigError("training.global_batch_size (" + std::to_string(global) +
                              ") must be a multiple of training.local_batch_size (" +
                              std::to_string(t.local_batch_size) + ") x data-parallel degree (" +
                              std::to_string(dp_degree) + ")");
  return global;
}

void check_model_layout(const JobConfig& cfg, const parallel::comm::ParallelDims& dims) {
  const model::ModelArgs args = model::model_flavor(cfg.model.name, cfg.model.flavor);
  if (dims.ep > 1 && args.moe && args.moe->num_experts % dims.ep != 0)
    throw ConfigError("parallelism.expert_parallel_degree " + std::to_string(dims.ep) + " does not divide the " +
                      std::to_string(args.moe->num_experts) + " experts of model.flavor " + cfg.model.flavor +
                      " (each EP rank holds num_experts / degree whole experts)");
}

CheckedLayout check_layout(const JobConfig& cfg, int world_size) {
  CheckedLayout layout;
  layout.dims = parallel_dims(cfg, world_size);
  layout.pipeline = pipeline_plan(cfg, layout.dims);
  layout.cp_method = context_parallel_method(cfg, layout.dims);
  check_model_layout(cfg, layout.dims);
  layout.global_batch = global_batch_size(cfg, layout.dims);
  try {
    parallel::parse_ac_options(cfg.activation_checkpoint.mode, cfg.activation_checkpoint.selective_ac_option);
    if (layout.dims.tp > 1)
      parallel::check_tp_degree(model::model_flavor(cfg.model.name, cfg.model.flavor), layout.dims.tp,
                                layout.dims.cp > 1 ? 0 : cfg.training.seq_len);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(e.what());
  }
  return layout;
}

parallel::ParallelOptions parallel_options(const JobConfig& cfg, const model::ModelArgs& args,
                                           const parallel::comm::ParallelDims& dims, c10::Device device, bool float8) {
  const int tp_degree = dims.tp;
  check_model_layout(cfg, dims);
  parallel::ParallelOptions popt;
  popt.microbatches = global_batch_size(cfg, dims) / (cfg.training.local_batch_size * dims.dp());
  popt.reshard_after_forward = cfg.parallelism.fsdp_reshard_after_forward;
  popt.loss_parallel = !cfg.parallelism.disable_loss_parallel;
  popt.compute_dtype = dtype_from_name(cfg.training.mixed_precision_param, "training.mixed_precision_param");
  popt.device = device;
  popt.seq_len = cfg.training.seq_len;
  popt.fsdp_overlap = cfg.parallelism.fsdp_overlap;
  popt.async_tp = cfg.parallelism.enable_async_tensor_parallel;
  popt.async_tp_chunks = cfg.parallelism.async_tp_chunks;
  popt.float8_fsdp_all_gather = float8 && cfg.float8.enable_fsdp_float8_all_gather;
  popt.float8_precompute_fsdp_scales = float8 && cfg.float8.precompute_float8_dynamic_scale_for_fsdp;
  popt.float8_tp_input_all_gather = cfg.float8.tp_input_all_gather;
  popt.pipeline = pipeline_plan(cfg, dims);
  // The user's choices are checked here, as config errors (exit 2); anything parallelize_model
  // throws after that is a bug, reported as such.
  try {
    popt.ac = parallel::parse_ac_options(cfg.activation_checkpoint.mode,
                                         cfg.activation_checkpoint.selective_ac_option);
    popt.cp_rotate_method = context_parallel_method(cfg, dims);
    // Under context parallelism the sequence-parallel share is checked with the cp split.
    if (tp_degree > 1) parallel::check_tp_degree(args, tp_degree, dims.cp > 1 ? 0 : cfg.training.seq_len);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(e.what());
  }
  return popt;
}

}  // namespace titan::trainer::config
