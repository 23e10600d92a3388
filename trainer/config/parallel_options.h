// trainer/config/parallel_options.h — the job config's parallelism, as the plan reads it: the
// mesh's degrees, the global batch, the pipeline plan, the context-parallel method and the
// ParallelOptions of parallelize_model, each of the user's choices checked here as a config
// error (exit 2) naming the keys. The Trainer and the start-up dry run (apps/dry_run.h) both
// build their plans from these, so the two can never disagree.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <string>

#include "model/args.h"
#include "model/linear.h"
#include "parallel/comm/mesh.h"
#include "parallel/context_parallel/context_parallel.h"
#include "parallel/parallel_options.h"
#include "parallel/pipeline/plan.h"
#include "trainer/config/job_config.h"

namespace titan::trainer::config {

// A dtype config value (training.mixed_precision_param, checkpoint.export_dtype); `key` names it
// in the error. The key table already restricts each key to the names it accepts.
at::ScalarType dtype_from_name(const std::string& name, const char* key);
// training.cpu_float32_gemm as the model's choice; a config error when it asks for oneDNN and this
// LibTorch has no oneDNN linear.
model::CpuFloat32Gemm cpu_float32_gemm_of(const JobConfig& cfg);

// Whether attention is block-causal: model.attn_mask_type = block_causal, or a block-causal flavor
// (torchtitan's *_flex_attn / *_varlen_attn / *_flex / *_varlen).
bool block_causal_attention(const JobConfig& cfg);

// The config's parallelism degrees resolved for `world_size` ranks (data_parallel_shard_degree
// -1 = the rest); an impossible layout is a config error saying why.
parallel::comm::ParallelDims parallel_dims(const JobConfig& cfg, int world_size);

// The rows one optimizer step consumes over all data-parallel ranks: training.global_batch_size,
// or local_batch_size x dp when unset; not a multiple of local_batch_size x dp is a config error.
int64_t global_batch_size(const JobConfig& cfg, const parallel::comm::ParallelDims& dims);

// The pipeline plan (parallel/pipeline/plan.h) from the config's pipeline keys when
// pipeline_parallel_degree > 1, else nullopt; an impossible one is a config error. Pure: the
// trainer checks it before any process group starts.
std::optional<parallel::pipeline::PipelinePlan> pipeline_plan(const JobConfig& cfg,
                                                              const parallel::comm::ParallelDims& dims);

// parallelism.context_parallel_rotate_method, after checking that the context-parallel degree can
// split this model's sequences (parallel/context_parallel/context_parallel.h).
parallel::context_parallel::CpRotateMethod context_parallel_method(const JobConfig& cfg,
                                                                   const parallel::comm::ParallelDims& dims);

// What the model's flavor allows of this layout, before any process group: a tied embedding
// trains without pipeline parallelism for now; expert_parallel_degree must divide the MoE
// flavor's experts.
// Throws ConfigError naming the keys.
void check_model_layout(const JobConfig& cfg, const parallel::comm::ParallelDims& dims);

// Every start-up check of the config's layout for `world_size` ranks, in the trainer's order:
// the degrees, the pipeline plan, the context-parallel split, what the model flavor allows, the
// global batch against local batch x dp, the tensor-parallel split and the AC mode. The trainer
// runs it before any rank connects, and the layout planner (planner/) runs it on every candidate,
// so a layout the planner lists is one the trainer accepts. Throws ConfigError naming the keys.
struct CheckedLayout {
  parallel::comm::ParallelDims dims;
  std::optional<parallel::pipeline::PipelinePlan> pipeline;
  parallel::context_parallel::CpRotateMethod cp_method = parallel::context_parallel::CpRotateMethod::kAllGather;
  int64_t global_batch = 0;
};
CheckedLayout check_layout(const JobConfig& cfg, int world_size);

// The parallelization options the config asks for. `dims`: the mesh's degrees; `float8`:
// whether the converters made float8 linears.
parallel::ParallelOptions parallel_options(const JobConfig& cfg, const model::ModelArgs& args,
                                           const parallel::comm::ParallelDims& dims, c10::Device device,
                                           bool float8);

}  // namespace titan::trainer::config
