// parallel/parallel_options.h — what the config asks of the parallelization plan, as plain
// values (trainer/config/parallel_options.h fills them from the job config; the plan,
// parallelize_model, and the schedule read them).
#pragma once

#include <c10/core/ScalarType.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <optional>
#include <string>

#include "parallel/activation_checkpoint.h"
#include "parallel/context_parallel/context_parallel.h"
#include "parallel/pipeline/plan.h"

namespace titan::parallel {

struct ParallelOptions {
  std::string reshard_after_forward = "default";  // default|always|never
  bool loss_parallel = true;                       // = !parallelism.disable_loss_parallel
  at::ScalarType compute_dtype = at::kFloat;       // training.mixed_precision_param
  c10::Device device = c10::kCPU;
  int64_t seq_len = 0;                             // training.seq_len (sequence parallel)
  bool fsdp_overlap = true;                        // See Note [FSDP overlap] in fsdp.h
  bool async_tp = false;                           // See Note [Async TP] in tensor_parallel.h
  int64_t async_tp_chunks = 2;
  AcOptions ac;                                    // [activation_checkpoint]
  // Micro-batches per step on this rank (gradient accumulation: this rank's rows of the global
  // batch / training.local_batch_size); the schedule runs them (parallel/pipeline/schedule.h).
  int64_t microbatches = 1;
  // float8.enable_fsdp_float8_all_gather: FSDP gathers the weights of float8 tensorwise linears
  // as float8 bytes (Note [FSDP float8 all-gather] in fsdp.h). No effect without FSDP.
  bool float8_fsdp_all_gather = false;
  // float8.precompute_float8_dynamic_scale_for_fsdp: those weights' next scales in one
  // all-reduce after each optimizer step.
  bool float8_precompute_fsdp_scales = false;
  // float8.tp_input_all_gather: under TP, modules whose input linears are all float8 tensorwise
  // gather that input in float8 (Note [Float8 operands from the producer] in float8_linear.h).
  bool float8_tp_input_all_gather = true;
  // Pipeline parallelism (pp > 1): the stages, their ranks and the order (pipeline/plan.h). This
  // rank's model holds only its stages' modules; the schedule runs the plan's order.
  std::optional<pipeline::PipelinePlan> pipeline;
  // parallelism.context_parallel_rotate_method: how attention exchanges keys and values when cp > 1
  // (context_parallel.h).
  context_parallel::CpRotateMethod cp_rotate_method = context_parallel::CpRotateMethod::kAllGather;
};

}  // namespace titan::parallel
