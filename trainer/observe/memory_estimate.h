// trainer/observe/memory_estimate.h — per-rank memory of a training job, from shapes alone.
//
// `titan-train --estimate-memory <the usual config and overrides>` prints this without
// allocating a tensor: parameters, gradients, optimizer state, activations at the peak of a
// step (for the AC mode, float8 recipe and parallel layout), communication buffers, and
// whether the sum fits the device. The activation model is written out in docs/memory.md;
// its constants were calibrated against the tracked CPU allocator peak of the debug and 100M
// models (tests/test_memory.cpp keeps it within 15%).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "model/args.h"
#include "parallel/activation_checkpoint.h"
#include "parallel/context_parallel/context_parallel.h"
#include "parallel/pipeline/plan.h"
#include "trainer/config/job_config.h"

namespace titan::trainer::observe {

struct EstimateInputs {
  model::ModelArgs args;          // vocab_size already the tokenizer's
  int64_t local_batch_size = 1;
  int64_t seq_len = 2048;
  int64_t grad_accumulation_steps = 1;
  int64_t compute_bytes = 4;      // bytes per element of parameters/activations in compute
  parallel::AcOptions ac;
  std::string float8_recipe;      // "" = high precision
  bool float8_all_gather = false;  // float8.enable_fsdp_float8_all_gather (FSDP gathers float8)
  bool float8_tp_input_all_gather = false;  // tensorwise + float8.tp_input_all_gather (under TP)
  int64_t dp_shard = 1;           // FSDP degree: parameters/grads/optimizer state sharded
  int64_t tp = 1;                 // tensor (+ sequence) parallel degree
  int64_t dp_replicate = 1;       // HSDP replicas: their gradient sum keeps a bucket (parallel::kReduceBucketBytes)
  // Context parallel: each rank computes seq_len / cp positions of every sequence (activations
  // fall ~1/cp) and holds the exchange's K/V buffers. dp_shard above already includes cp (FSDP
  // shards over dp_shard x cp).
  int64_t cp = 1;
  // Expert parallel (MoE models): each rank holds num_experts / ep experts of every MoE layer,
  // FSDP-sharded over the rest of dp_shard x cp, so an FSDP gather of a block carries only those;
  // each MoE layer adds its dispatch and combine buffers.
  int64_t ep = 1;
  parallel::context_parallel::CpRotateMethod cp_rotate_method = parallel::context_parallel::CpRotateMethod::kAllGather;
  // Pipeline parallel: the plan, and which pp rank the estimate is for (See Note [Pipeline
  // memory] in memory_estimate.cpp). Unset: the rank holds the whole model. Shared, not copied:
  // the layout planner estimates thousands of layouts whose plans hold every rank's order.
  std::shared_ptr<const parallel::pipeline::PipelinePlan> pipeline;
  int pp_rank = 0;
  bool cuda = false;
  // The fused RMSNorm / SwiGLU kernels run (model::fused_ops_run_on): they keep less than ATen's
  // composites (Note [What the fused ops keep] in model/kernels/fused_ops.h).
  bool fused_ops = false;
  int64_t device_capacity = 0;    // bytes; 0 = unknown
  std::string device_name = "cpu";
  std::vector<std::string> notes;  // assumptions the report should state
};

struct MemoryEstimate {
  int64_t parameters = 0;         // float32 masters + compute copies (bf16 compute)
  int64_t gradients = 0;          // float32, at the peak
  int64_t optimizer_state = 0;    // AdamW exp_avg + exp_avg_sq (+ step counters)
  int64_t activations = 0;        // saved activations + transients at the peak
  int64_t communication = 0;      // FSDP gather / reduce-scatter buffers, TP all-gathers
  int64_t total = 0;
  std::string peak_phase;         // where the peak is: "start of backward", ...
  std::vector<std::pair<std::string, int64_t>> activation_detail;  // per-block terms
};

// Note [Block terms memo]: what each block keeps per token depends on the model and on few of
// the inputs (tp, the compute dtype, the device, seq_len, the float8 TP gather), not on the
// batch, the AC mode or the other degrees; the layout planner estimates millions of candidates
// of one model, and computing every block's terms for each was most of its search. A memo serves
// one model (estimate_memory refuses another's inputs) on one thread.
class BlockTermsMemo {
 public:
  BlockTermsMemo();
  ~BlockTermsMemo();
  BlockTermsMemo(const BlockTermsMemo&) = delete;
  BlockTermsMemo& operator=(const BlockTermsMemo&) = delete;
  struct Impl;
  std::unique_ptr<Impl> impl;
};

MemoryEstimate estimate_memory(const EstimateInputs& in, BlockTermsMemo* memo = nullptr);

// Reads the inputs from a parsed config: model flavor (vocab from the configured tokenizer),
// batch shape, AC, dtype, float8 recipe, parallel degrees (WORLD_SIZE
// from the environment, 1 when unset) and the device's capacity (total RAM on the CPU).
EstimateInputs estimate_inputs_from_config(const config::JobConfig& cfg);
// The same for `world` ranks and a known vocabulary (vocab_size 0: the flavor's), without reading
// the tokenizer or asking the device (device_capacity 0): what the layout planner calls for each
// of its candidates.
// `pipeline`: the config's pipeline plan when the caller has it (else it is built here); the
// inputs then point at it, so it must outlive them.
EstimateInputs estimate_inputs_from_config(const config::JobConfig& cfg, int64_t world, int64_t vocab_size,
                                           const parallel::pipeline::PipelinePlan* pipeline = nullptr);

// The report printed by --estimate-memory (one line per item, GiB, and the verdict).
std::string format_memory_estimate(const EstimateInputs& in, const MemoryEstimate& e);

// Note [Memory shortfall]: what a user can act on when a run does not fit: this rank's estimate
// against the machine (the device's capacity; training.cpu_memory_limit_gib is left to produce
// its out-of-memory error and snapshot, which is what it is for), the keys that set the largest
// term, and what to change. "" when the capacity is unknown or the
// estimate is at most `margin` x the capacity (the estimate is within ~15% of measured peaks).
// `pp_rank`: this rank's pipeline rank. The trainer refuses to start above 1.25x, and on an
// allocation failure adds this text (margin 0) to the allocator's message.
std::string memory_shortfall(const config::JobConfig& cfg, int pp_rank, double margin);

}  // namespace titan::trainer::observe
