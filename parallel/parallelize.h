// parallel/parallelize.h — parallelize_model: the one place that shapes a model for training
// (torchtitan's parallelize.py), and build_schedule, which gives the trainer the micro-batch
// schedule it owns beside the model parts (torchtitan's pipeline_llama / pp_schedule).
//
// Every run goes through it, a single process too: with a degree of 1 a stage is a no-op
// (DeviceMesh has no Comm for a dimension of size 1), so the trainer has one path. Each stage
// is a function that decides and returns what it decided (apply_tp: which weights are sharded
// along which dim; apply_fsdp: the FSDP groups); parallelize_model hands the decisions to the
// ParallelModel (parallel/parallel_model.h).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/transformer.h"
#include "parallel/comm/mesh.h"
#include "parallel/parallel_model.h"
#include "parallel/parallel_options.h"
#include "parallel/pipeline/schedule.h"

namespace titan::parallel {

// Whether the TP degree divides the sizes the model's family shards (heads, kv heads, hidden
// dims: model::Family::tp_sharded_sizes) and seq_len: throws
// std::invalid_argument with the numbers and what to choose (a config error).
void check_tp_degree(const model::ModelArgs& args, int tp, int64_t seq_len);

// Throws std::invalid_argument when a block-scaled (MX, blockwise float8) linear would have a
// block straddle two tensor-parallel shards: the sharded dimension of each column-parallel
// (out_features) or row-parallel (in_features) linear must split into whole blocks per rank,
// so every rank's block scales are the ones one process computes.
void check_block_scaled_tp(model::Transformer& model, int tp);

// What apply_tp decided: each sharded weight's fqn and the dim split over TP, and its line of
// the start-up picture.
struct TensorParallelPlan {
  std::vector<std::pair<std::string, int>> sharded_weights;
  std::string description;
};
// How MoE layers meet tensor parallelism (torchtitan's apply_moe_ep_tp), from the EP and ETP degrees.
enum class MoeTp {
  kShardExperts,  // no EP, or ETP = TP: the layer runs on the gathered sequence, router replicated,
                  // routed and shared experts sharded on their hidden dim, the output reduce-scattered
  kSequence,      // EP with ETP = 1 (EP borrows the tp ranks): each tp rank routes its own sequence
                  // shard to whole experts; router and shared experts replicated
};
// 1. Tensor + sequence parallel over `tp` on the modules `holds` names (this rank's pipeline
// stages): installs the TP computes and input hooks on `model` as its rules say (the family's
// plan: model::Transformer::tp_plan).
TensorParallelPlan apply_tp(model::Transformer& model, comm::Comm& tp, const ParallelOptions& options, MoeTp moe_tp,
                            const std::function<bool(const std::string&)>& holds);

// What apply_fsdp decided: the FSDP groups (which own the masters from then on) and the line of
// the start-up picture.
struct FsdpPlan {
  std::unique_ptr<Fsdp> fsdp;
  std::unique_ptr<Fsdp> expert_fsdp;  // the EP-sharded experts over efsdp (efsdp > 1), else null
  std::string description;
};
// 3. FSDP (HSDP when dp_replicate > 1) over `dp_shard_cp` of `params` (this rank's parameters
// as TP left them): one group per block plus the embedding and norm+output, each wrapping its
// block outermost (See Note [FSDP wraps AC] in activation_checkpoint.h). Under expert
// parallelism the EP-sharded experts are FSDP-sharded over efsdp instead (the ranks holding the
// same experts, Note [Expert mesh]): one more group per MoE block, wrapping it outside the first.
FsdpPlan apply_fsdp(model::Transformer& model, comm::Comm& dp_shard_cp, comm::DeviceMesh& mesh,
                    const ParallelOptions& options, const std::vector<HeldParam>& params,
                    const std::function<bool(const std::string&)>& holds);

// Applies, in this order: tensor/sequence parallel, context parallel, activation checkpointing,
// FSDP/HSDP; then allocates this rank's master parameters. The model must still be on the meta
// device; call init_weights on the result next.
std::unique_ptr<ParallelModel> parallelize_model(model::Transformer& model, comm::DeviceMesh& mesh,
                                                 const ParallelOptions& options);

// How one step's micro-batches run through this rank's model parts (See Note [Schedules as
// data] in parallel/pipeline/schedule.h): the pipeline's order over this rank's stages, or
// without pipeline parallelism the whole model as one stage (gradient accumulation). The
// schedule calls `parallel` only through pipeline::MicrobatchHooks.
std::unique_ptr<pipeline::Schedule> build_schedule(model::Transformer& model, ParallelModel& parallel,
                                                   comm::DeviceMesh& mesh, const ParallelOptions& options);

}  // namespace titan::parallel
