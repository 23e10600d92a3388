// parallel/expert_parallel/expert_parallel.h — expert parallelism (EP): the experts of every MoE
// layer sharded over the ranks of an EP group, each token's routed rows sent to the rank that
// holds its expert and the results sent back (torchtitan's ExpertParallel).
//
// Note [Expert parallelism]: with n EP ranks and E experts, rank r holds experts
// [r E/n, (r+1) E/n) (the stacked expert weights sharded on dim 0). A layer's routed rows arrive
// sorted by global expert (model/moe/moe.h, Note [MoE forward]) with their counts per expert:
//   1. the counts: one all-to-all of the [E] counts in slices of E/n, so each rank learns how many
//      rows every source sends to each of its local experts ([n, E/n]);
//   2. dispatch: one all-to-all of the rows with those split sizes (rank j gets the rows of its
//      experts; they arrive grouped by source rank, then by local expert);
//   3. a local permutation grouping them by local expert (then by source), the local experts
//      over their groups, and the inverse permutation;
//   4. combine: the inverse all-to-all, so each row returns to its token's rank in the order it
//      left. It is asynchronous: the layer's shared experts (which need only the layer's input)
//      run while the rows travel, and in backward their gradient runs while the combine's
//      gradient travels back. Autograd runs the exchanges in reverse (an all-to-all's adjoint is
//      the all-to-all with the split sizes swapped); an expert's weight gradient sums every
//      rank's rows.
//
// Note [Float8 dispatch] (quantize.grouped_mm.float8.float8_dispatch, beyond torchtitan 0.2.2; as
// Megatron's float8 dispatch): with float8 rowwise experts, step 2 sends each routed row cast to
// e4m3 with one power-of-2 float32 scale per row (the cast the experts' gate and up GEMMs make of
// their input) as D + 4 bytes instead of 2 D (bf16) or 4 D (float32): about half a bf16 dispatch.
// Those GEMMs read the arrived bytes and scales as their input cast, with no cast of their own;
// the rows' dequantized values are what their backward re-casts per column for the weight
// gradients. A row's cast depends on that row alone, so the forward is bit for bit a high-precision
// dispatch cast on arrival; the weight gradients read the rows as their float8 values, so the
// whole step is bit for bit a high-precision dispatch of the rows cast and dequantized at the
// source (a straight-through cast: the experts' own cast of such values gives the same values).
// The combine and every gradient travel in high precision. Per-op AC keeps the arrived bytes as
// the exchange's output.
// The router and everything outside the experts stay as they are on every rank. Per-op AC keeps
// each exchange's output ("ep_all_to_all"), so a recompute repeats no communication; there the
// combine runs whole (a kept op is one call) and the shared experts after it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/moe/moe.h"

namespace titan::model {
class Transformer;
}
namespace titan::parallel::comm {
class Comm;
}

namespace titan::parallel::expert_parallel {

// The experts of one MoE layer over the EP group `ep` (See Note [Expert parallelism]): rows
// [T, D] sorted by global expert with counts[e] rows for expert e (E = counts.size(), a multiple of
// ep.size()); `experts`: this rank's E/n experts (model/moe/experts.h). Returns [T, D], each row the
// output of its expert, in the order of `rows`. Differentiable in rows and the local weights.
// `while_combining` (may be empty) runs once, while the combine's all-to-all is in flight.
// `computes`: the experts' low-precision products (Note [Low-precision experts] in model/moe/moe.h),
// applied to each local expert's rows from every source rank as one group.
at::Tensor expert_parallel_experts(const at::Tensor& rows, const std::vector<int64_t>& counts,
                                   const model::moe::RoutedExperts& experts, comm::Comm& ep,
                                   const std::function<void()>& while_combining = {},
                                   const model::moe::ExpertComputes& computes = {});

// This rank's experts of E over an EP group of n: [first, first + E/n). Throws std::invalid_argument
// naming parallelism.expert_parallel_degree when n does not divide E.
int64_t local_experts_begin(int64_t num_experts, int ep_size, int ep_rank);

// What apply_ep decided: the stacked expert weights now sharded on dim 0 over the EP group
// (the plan's ParallelModel::shard_over_ep), and the plan line.
struct ExpertParallelPlan {
  std::vector<std::string> sharded_experts;  // "layers.<i>.moe.experts.w1", ...
  std::string description;
};
// The plan's expert-parallel stage: every MoE layer this rank holds (`holds("layers.<i>")`) runs
// its experts through expert_parallel_experts over `ep`. `efsdp`: the ranks holding the same
// experts (their gradients are summed over them, Note [Expert mesh] in parallel/comm/mesh.h).
ExpertParallelPlan apply_ep(model::Transformer& model, comm::Comm& ep, int efsdp,
                            const std::function<bool(const std::string&)>& holds);

}  // namespace titan::parallel::expert_parallel
