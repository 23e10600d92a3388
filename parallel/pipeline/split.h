// parallel/pipeline/split.h — which modules of the Llama each pipeline stage holds, as torchtitan
// splits it (generate_llm_fqn_per_model_part in v0.2, split points in v0.1).
//
// Note [Pipeline stage split]: the embedding counts as `input_weight` layers on the first stage
// (parallelism.pipeline_parallel_first_stage_less_layers, default 1) and norm + output as
// `output_weight` layers on the last (..._last_stage_less_layers, default 1). The n_layers + input +
// output "effective layers" are divided by the stage count; where they do not divide, the first
// stages take one more. Stage 0 is tok_embeddings + its layers, the last stage its layers + norm +
// output, and every layer lies on exactly one stage, in order. E.g. 6 layers over 2 stages:
// [tok_embeddings, layers.0-2] [layers.3-5, norm, output]; over 4: [tok_embeddings, layers.0]
// [layers.1-2] [layers.3-4] [layers.5, norm, output].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "parallel/pipeline/orders.h"

namespace titan::parallel::pipeline {

using StageModules = std::vector<std::vector<std::string>>;  // per stage, its module fqns in order

// The number of stages: pp x the schedule's default stages per rank (1 for GPipe / 1F1B, else 2)
// when layers_per_stage is 0 (unset); else ceil((n_layers + input_weight + output_weight) /
// layers_per_stage), which must be a multiple of pp and give 1 stage per rank for a single-stage
// schedule, at least 2 for a multi-stage one. Throws std::invalid_argument with the numbers.
int pipeline_stage_count(PipelineScheduleKind kind, int pp, int64_t n_layers, int64_t layers_per_stage,
                         int64_t input_weight, int64_t output_weight);

// See Note [Pipeline stage split]. Throws std::invalid_argument when there are more stages than
// effective layers or a weight exceeds the layers per stage.
StageModules module_fqns_per_stage(int num_stages, int64_t n_layers, int64_t input_weight, int64_t output_weight);

// Note [Stage split by FLOPs]: parallelism.pipeline_parallel_stage_balance = "flops" splits the
// blocks so that every pp rank's stages, as the schedule places them (one per rank, looped: stage
// s on rank s mod pp, or V-shaped: rank r holds r and 2pp-1-r), cost the same training FLOPs: a
// block its matmuls and attention, norm + output 6 x dim x vocab per token, the embedding lookup
// nothing. torchtitan's split counts the embedding and the output as whole layers on their
// stages, which misjudges both (the debug model's output is 0.4-0.6 of a block, Llama 3 8B's ~2) and
// under a V puts both on rank 0: the debug model's ZBVZeroBubble then gives rank 0 two blocks and
// rank 1 four. Water-filling, first over ranks (each block in turn to the rank whose stages cost
// least: the smallest possible largest rank), then within each rank over its stages. Every stage
// between the first and the last holds at least one block (those two hold the embedding and the
// output, and may hold none, as in torchtitan's split); stages stay contiguous, in model order.
// Blocks that cost differently (DeepSeek-V3's dense first blocks beside its MoE ones) give their
// costs one by one (per_block): then the split is the least largest rank load a greedy finds
// for each load bound, the bound bisected (exact for one stage per rank, where contiguous
// blocks filling each stage up to the bound is the classic partition; with several stages per
// rank a rank's first stage may take what its later ones needed, and the bound rises).
struct ModuleFlops {
  double block = 1;      // one transformer block, forward + backward, per token
  double embedding = 0;  // tok_embeddings, on stage 0
  double output = 0;     // norm + output (+ the loss), on the last stage
  std::vector<double> per_block;  // each block's, in model order, where they differ; else empty
};

// The split of `n_layers` blocks over stage_rank.size() stages (stage s on pp rank stage_rank[s]);
// see Note [Stage split by FLOPs]. Throws std::invalid_argument when the stages between the first
// and the last outnumber the blocks.
StageModules module_fqns_balanced(const std::vector<int>& stage_rank, int64_t n_layers, const ModuleFlops& costs);
// What module_fqns_balanced asks of the stage count alone (a block for every stage between the
// first and the last): checkable before a schedule places the stages, which at a large pp and many
// micro-batches costs far more than the split. Throws std::invalid_argument as it does.
void check_balanced_stage_count(int64_t num_stages, int64_t n_layers);

// torchtitan v0.1's pipeline_parallel_split_points: each "layers.k" starts a new stage
// ("layers.2,layers.4" over 6 layers: 3 stages). Throws std::invalid_argument naming a point that
// is not a layer or not in ascending order.
StageModules module_fqns_from_split_points(const std::vector<std::string>& split_points, int64_t n_layers);

// A split given module by module (parallelism.module_fqns_per_model_part, or one of the above):
// every stage non-empty, and the stages read in order give exactly tok_embeddings, layers.0 ..
// layers.{n-1}, norm, output once each (a stage's output feeds the next). Throws
// std::invalid_argument naming the stage and the module that breaks it.
void check_stage_modules(const StageModules& stages, int64_t n_layers);

}  // namespace titan::parallel::pipeline
