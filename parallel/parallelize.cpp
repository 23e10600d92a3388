// parallel/parallelize.cpp — see parallelize.h. parallelize_model is the plan and its stages
// (apply_tp, apply_fsdp here; apply_ac in activation_checkpoint.cpp; the schedule); the
// ParallelModel mechanics they rely on are in parallel_model.cpp.
#include "parallel/parallelize.h"
#include "model/param_path.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>

#include "float8/block_scaled_linear.h"
#include "float8/float8_linear.h"
#include "float8/grouped_experts.h"
#include "parallel/expert_parallel/expert_parallel.h"
#include "parallel/tensor_parallel/async_tp.h"
#include "parallel/pipeline/pipeline_schedule.h"
#include "parallel/tensor_parallel/tensor_parallel.h"

namespace titan::parallel {
namespace {

using model::TpRule;
using model::TpStyle;

}  // namespace

void check_block_scaled_tp(model::Transformer& model, int tp) {
  if (tp <= 1) return;
  // An MoE layer's shared experts are sharded only in some layouts (MoeTp): not checked here.
  std::map<std::string, TpStyle> style_of;
  for (const TpRule& rule : model.tp_plan())
    if (!rule.experts_sharded) style_of[rule.module] = rule.style;
  for (const model::Linear* l : model.linears()) {
    const auto* c = dynamic_cast<const float8::BlockScaledLinearCompute*>(model::innermost(l->compute()));
    const auto found = style_of.find(l->fqn());
    if (!c || found == style_of.end()) continue;
    const TpStyle style = found->second;
    if (style != TpStyle::kColwise && style != TpStyle::kRowwise && style != TpStyle::kRowwisePartial &&
        style != TpStyle::kVocabParallelOutput)
      continue;
    const bool rows = style == TpStyle::kRowwise || style == TpStyle::kRowwisePartial;
    const int64_t full = rows ? l->in_features() : l->out_features();
    const int64_t block = c->block_alignment();
    if (full % (static_cast<int64_t>(tp) * block) != 0) {
      std::ostringstream os;
      os << l->fqn() << " (" << c->describe() << ", " << (rows ? "row" : "column") << "-parallel): "
         << (rows ? "in_features " : "out_features ") << full << " split over tensor_parallel_degree " << tp
         << " is not whole blocks of " << block << " per rank, so a block would straddle two ranks; "
         << "use a degree that divides " << full / block << " or filter the linear (filter_fqns)";
      throw std::invalid_argument(os.str());
    }
  }
}

namespace {

// The float8 compute at the bottom of `linear`'s chain, or nullptr.
float8::Float8LinearCompute* float8_compute(const model::Linear& linear) {
  return dynamic_cast<float8::Float8LinearCompute*>(model::innermost(linear.compute()));
}

// The float8 input cast that a gathered input's readers (a kGatherInput rule's) share when every
// one of them accepts a float8 tensorwise input of the same cast (See Note [Float8 operands from
// the producer]); nullopt: the input is gathered in high precision.
std::optional<std::pair<float8::CastConfig, bool>> shared_float8_input_cast(
    const std::map<std::string, model::Linear*>& linears, const std::vector<std::string>& readers) {
  std::optional<std::pair<float8::CastConfig, bool>> shared;
  for (const auto& r : readers) {
    const float8::Float8LinearCompute* c = float8_compute(*linears.at(r));
    if (!c || !c->accepts_float8_input(c->recipe().input.dtype)) return std::nullopt;
    const float8::CastConfig& cast = c->recipe().input;
    const bool pow2 = c->recipe().round_scales_to_power_of_2;
    if (shared && (shared->first.dtype != cast.dtype || shared->second != pow2)) return std::nullopt;
    shared = {cast, pow2};
  }
  return shared;
}

}  // namespace

void check_tp_degree(const model::ModelArgs& args, int tp, int64_t seq_len) {
  auto fail = [&](const std::string& what, int64_t value) {
    std::ostringstream os;
    os << "tensor parallel degree " << tp << " does not divide " << what << " (" << value
       << "); choose parallelism.tensor_parallel_degree among its divisors";
    throw std::invalid_argument(os.str());
  };
  for (const model::ShardedSize& size : model::family(args.family).tp_sharded_sizes(args))
    if (size.value % tp) fail(size.what, size.value);
  if (seq_len > 0 && seq_len % tp) fail("training.seq_len (sequence parallel)", seq_len);
}

// 1. Tensor + sequence parallel: the model's rules (model::Transformer::tp_plan, what each
// module of its family declares: See Note [A plan as data] in model/sharding_plan.h) applied to
// the modules this rank holds; an MoE layer's rules only when its experts are sharded (MoeTp).
// Each float8 linear is rebuilt with its TP sharding (See Note [Scales under TP]); a module
// whose readers all take a float8 tensorwise input gathers it in float8.
TensorParallelPlan apply_tp(model::Transformer& model, comm::Comm& tp, const ParallelOptions& options, MoeTp moe_tp,
                            const std::function<bool(const std::string&)>& holds) {
  TensorParallelPlan plan;
  std::map<std::string, model::Linear*> linears;
  for (model::Linear* l : model.linears()) linears[l->fqn()] = l;
  std::map<std::string, model::TransformerBlock*> blocks;
  for (model::TransformerBlock* b : model.blocks()) blocks[b->path] = b;
  // Float8 (tensorwise or the axiswise dims that reduce along the shard) amaxes over the group:
  // along which dim (0 rows, 1 columns, -1 none) this rank holds a shard of each operand.
  auto sharded = [&](model::Linear& linear, int input, int weight, int grad_output) {
    std::shared_ptr<model::LinearCompute> compute = linear.compute();
    if (const float8::Float8LinearCompute* c = float8_compute(linear))
      compute = std::make_shared<float8::Float8LinearCompute>(
          c->recipe(), c->emulate(), c->backend(),
          float8::TpSharding{[&tp](at::Tensor& amax) { tp.all_reduce(amax, comm::ReduceOp::kMax); },
                             input, weight, grad_output});
    return compute;
  };
  auto shard_weight = [&](const std::string& module, int dim) { plan.sharded_weights.emplace_back(module + ".weight", dim); };
  auto linear_at = [&](const TpRule& rule) -> model::Linear& {
    const auto found = linears.find(rule.module);
    TORCH_CHECK(found != linears.end(), "tensor parallel plan: '", rule.module, "' is not one of the model's linears");
    return *found->second;
  };
  int float8_gathers = 0;  // modules whose input is gathered in float8
  // See Note [Async TP]: chunked gathers / reduce-scatters around the block's linears.
  const int async_chunks = options.async_tp ? static_cast<int>(options.async_tp_chunks) : 0;
  // Which modules are column-sharded: a gathered input arrives in chunks (async TP) only where
  // every reader is (each chunk's GEMM then overlaps the next chunk's transfer); a replicated
  // reader (DeepSeek-V3's wq_a and wkv_a) needs the whole input, gathered at once.
  std::set<std::string> colwise;
  for (const TpRule& rule : model.tp_plan())
    if (rule.style == TpStyle::kColwise) colwise.insert(rule.module);
  std::set<std::string> moe_layers;
  auto apply = [&](const TpRule& rule, model::TransformerBlock* block) {
    switch (rule.style) {
      case TpStyle::kColwise: {
        model::Linear& l = linear_at(rule);
        l.set_compute(std::make_shared<tensor_parallel::ColwiseLinear>(sharded(l, -1, /*rows*/ 0, /*columns*/ 1)));
        shard_weight(rule.module, 0);
        break;
      }
      case TpStyle::kRowwise: {
        model::Linear& l = linear_at(rule);
        l.set_compute(std::make_shared<tensor_parallel::RowwiseLinear>(sharded(l, /*columns*/ 1, /*columns*/ 1, -1), tp, async_chunks));
        shard_weight(rule.module, 1);
        break;
      }
      case TpStyle::kRowwisePartial: {  // the module reduces the partial sums itself
        model::Linear& l = linear_at(rule);
        l.set_compute(sharded(l, /*columns*/ 1, /*columns*/ 1, -1));
        shard_weight(rule.module, 1);
        break;
      }
      case TpStyle::kReplicated:
        break;  // a replicated weight: reduce_grads sums its grads over TP
      case TpStyle::kGatherInput: {
        model::ModuleInputHook* hook = block ? block->input_hook(rule.module) : nullptr;
        TORCH_CHECK(hook, "tensor parallel plan: '", rule.module, "' has no input hook to gather its input in");
        const auto cast = options.float8_tp_input_all_gather ? shared_float8_input_cast(linears, rule.readers)
                                                             : std::nullopt;
        const bool chunked = async_chunks > 0 && std::all_of(rule.readers.begin(), rule.readers.end(),
                                                             [&](const std::string& r) { return colwise.count(r) > 0; });
        if (chunked)
          *hook = tensor_parallel::make_async_sequence_gather(tp, async_chunks,
                                            cast ? std::optional<tensor_parallel::Float8ChunkCast>({cast->first, cast->second})
                                                 : std::nullopt);
        else
          *hook = cast ? tensor_parallel::make_float8_sequence_gather(tp, cast->first, cast->second) : tensor_parallel::make_sequence_gather(tp);
        float8_gathers += cast ? 1 : 0;
        break;
      }
      case TpStyle::kGatherInputReduceOutput: {
        TORCH_CHECK(block && block->moe && block->moe->prefix == rule.module, "tensor parallel plan: '", rule.module,
                    "' is not an MoE layer (the one module that gathers its input and reduces its output)");
        block->moe->gather_input = [&tp](const at::Tensor& x) { return tensor_parallel::all_gather_seq(x, tp); };
        block->moe->reduce_output = [&tp](const at::Tensor& y) { return tensor_parallel::reduce_scatter_seq(y, tp); };
        block->moe->experts->output_summed_over = tp.size();  // a term every rank adds whole (See RoutedExperts)
        // Low-precision experts sharded on their hidden dim: float8 amaxes over the group too.
        block->moe->expert_computes = float8::expert_computes_under_tp(
            *block->moe, tp.size(), [&tp](at::Tensor& amax) { tp.all_reduce(amax, comm::ReduceOp::kMax); });
        break;
      }
      case TpStyle::kShardTensor:
        plan.sharded_weights.emplace_back(rule.module, static_cast<int>(rule.dim));
        break;
      case TpStyle::kVocabParallelEmbedding:
        model.set_embedding_compute("vocab_parallel", tensor_parallel::make_vocab_parallel_embedding(tp, model.args().vocab_size));
        model.set_sequence_share([&tp](const at::Tensor& full) { return tensor_parallel::sequence_chunk(full, tp); });
        shard_weight(rule.module, 0);
        break;
      case TpStyle::kVocabParallelOutput: {
        model::Linear& l = linear_at(rule);
        l.set_compute(std::make_shared<tensor_parallel::VocabParallelOutput>(sharded(l, -1, /*rows*/ 0, /*columns*/ 1), tp,
                                                            model.args().vocab_size, options.loss_parallel));
        // A tied output reads the embedding's weight, its vocabulary rows sharded alike: by the
        // embedding's entry when this rank holds it too, else here (the last pipeline stage's copy).
        if (!model.args().tie_embeddings) shard_weight(rule.module, 0);
        else if (!holds("tok_embeddings")) shard_weight("tok_embeddings", 0);
        break;
      }
    }
  };
  // A block's rules first, then the top level's (so the embedding's shard is recorded before a
  // tied output's would be); MoE layers' rules per MoeTp.
  for (const TpRule& rule : model.tp_plan()) {
    const std::string top = model::top_module(rule.module);
    if (!holds(top)) continue;
    const auto block = blocks.find(top);
    if (rule.experts_sharded) {
      moe_layers.insert(top);
      if (moe_tp == MoeTp::kSequence) continue;  // shared experts replicated; EP moves the rows
    }
    apply(rule, block == blocks.end() ? nullptr : block->second);
  }
  const size_t moe_count = moe_layers.size();
  plan.description = "tensor parallel " + std::to_string(tp.size()) + ": sequence parallel, loss " +
                     (options.loss_parallel ? "on vocab shards" : "on all-gathered logits") +
                     (float8_gathers ? ", " + std::to_string(float8_gathers) + " module inputs all-gathered in float8"
                                     : std::string()) +
                     (async_chunks ? ", async (" + std::to_string(async_chunks) + " chunks per sequence shard)"
                                   : std::string()) +
                     (moe_count == 0 ? std::string()
                      : moe_tp == MoeTp::kSequence
                          ? "; " + std::to_string(moe_count) + " MoE layers on sequence shards (EP over the tp ranks)"
                          : "; " + std::to_string(moe_count) +
                                " MoE layers on the gathered sequence, experts sharded on their hidden dim, output "
                                "reduce-scattered");
  return plan;
}

// 3. FSDP over dp_shard x cp (HSDP when dp_replicate > 1): one parameter group per block, plus the embedding and
// norm+output, in forward order; each group's wrapper is the outermost of its block (See Note
// [FSDP wraps AC] in activation_checkpoint.h). reshard_after_forward "default" frees every group
// after its forward except the last block and norm+output, which backward needs first anyway
// (torchtitan's choice). Float8 tensorwise linears' weights travel in float8 when asked.
FsdpPlan apply_fsdp(model::Transformer& model, comm::Comm& dp_shard_cp, comm::DeviceMesh& mesh,
                    const ParallelOptions& o, const std::vector<HeldParam>& params,
                    const std::function<bool(const std::string&)>& holds) {
  FsdpPlan plan;
  plan.fsdp = std::make_unique<Fsdp>(dp_shard_cp, o.compute_dtype, o.device, mesh.comm(comm::MeshDim::kTp),
                                     o.fsdp_overlap);
  std::map<std::string, const HeldParam*> by_fqn;
  for (const HeldParam& p : params) by_fqn[p.fqn] = &p;
  // Under pp a step runs many micro-batches through each stage, interleaved with the other
  // stages' work: each group is gathered once and its gradients reduce-scattered once, after
  // the last micro-batch (torchtitan keeps the gathered parameters under PP by default too).
  const bool pipelined = o.pipeline.has_value();
  plan.fsdp->set_defer_reduce_scatter(pipelined);
  const std::string reshard_policy = pipelined && o.reshard_after_forward == "default" ? "never" : o.reshard_after_forward;
  std::map<std::string, model::Linear*> by_weight;
  for (model::Linear* l : model.linears()) by_weight[l->fqn() + ".weight"] = l;
  // A tied embedding whose two uses are both on this rank (always without pp); under pp the
  // output's stage may hold its own copy (See Note [Tied embedding across stages]).
  const bool tied = model.args().tie_embeddings;
  const bool tied_here = tied && holds("tok_embeddings") && holds("output");
  // The embedding's gradient accumulations per backward: its lookup, the tied output's, and one
  // lookup per multi-token prediction depth (which runs after the blocks: See Note [Multi-token
  // prediction] in model/mtp.h); used more than once, its group stays gathered to the forward's end.
  const int embedding_uses = 1 + (tied_here ? 1 : 0) + static_cast<int>(model.args().mtp_layers);
  // The experts under EP: their own FSDP over efsdp (Note [Expert mesh] in mesh.h).
  comm::Comm* efsdp = mesh.comm(comm::MeshDim::kEfsdp);
  if (efsdp) {
    plan.expert_fsdp = std::make_unique<Fsdp>(*efsdp, o.compute_dtype, o.device, nullptr, o.fsdp_overlap);
    plan.expert_fsdp->set_defer_reduce_scatter(pipelined);
  }
  auto add_group = [&](Fsdp& fsdp, const std::string& name, const std::vector<std::string>& fqns, bool last) {
    std::vector<FsdpParamSpec> specs;
    for (const std::string& fqn : fqns) {
      const HeldParam& p = *by_fqn.at(fqn);
      FsdpParamSpec spec{p.fqn, p.slot, p.tp_shape};
      if (p.fqn == "tok_embeddings.weight") spec.uses = embedding_uses;
      auto l = by_weight.find(p.fqn);
      const float8::Float8LinearCompute* c = l == by_weight.end() ? nullptr : float8_compute(*l->second);
      if (o.float8_fsdp_all_gather && c && c->accepts_float8_weight(c->recipe().weight.dtype))
        spec.float8 = FsdpFloat8Weight{c->recipe().weight.dtype, c->recipe().round_scales_to_power_of_2,
                                       &l->second->weight_cast};
      specs.push_back(std::move(spec));
    }
    const bool reshard = reshard_policy == "always" || (reshard_policy == "default" && !last);
    const int g = fsdp.add_group(name, specs, reshard);
    // The wrapper of group g: "fsdp" frees its gathered parameters after forward, "fsdp(kept)"
    // keeps them for backward ("efsdp" for the experts' group).
    const std::string kind = &fsdp == plan.expert_fsdp.get() ? "efsdp" : "fsdp";
    return model::ForwardWrapper{reshard ? kind : kind + "(kept)",
                                 [&fsdp, g](const at::Tensor& x, const model::ForwardFn& inner) {
                                   return fsdp.run_group(g, x, inner);
                                 }};
  };
  Fsdp& fsdp = *plan.fsdp;
  // A tied embedding stays gathered from the embedding's forward to the output's backward (the
  // output reads it): the group is kept, as the last one is, and reduce-scatters after both uses.
  if (holds("tok_embeddings"))
    model.wrap_stage(model::Stage::kEmbedding,
                     add_group(fsdp, "tok_embeddings", {"tok_embeddings.weight"}, embedding_uses > 1));
  const std::vector<model::TransformerBlock*> blocks = model.blocks();
  for (model::TransformerBlock* block : blocks) {
    const std::string& name = block->path;
    if (!holds(name)) continue;
    std::vector<std::string> fqns, experts;
    for (const auto& p : params)
      if (p.fqn.compare(0, name.size() + 1, name + ".") == 0) (p.ep_size > 1 ? experts : fqns).push_back(p.fqn);
    const bool last = block == blocks.back();
    model.wrap_block(block->layer_id, add_group(fsdp, name, fqns, last));
    if (plan.expert_fsdp && !experts.empty())
      model.wrap_block(block->layer_id, add_group(*plan.expert_fsdp, name + ".moe.experts", experts, last));
  }
  if (holds("norm")) {
    // The output's weight: its own, the embedding's copy of this stage, or (tied_here) the
    // embedding's group, still gathered.
    const std::string output = !tied ? "output.weight" : tied_here ? "" : "tok_embeddings.weight";
    model.wrap_stage(model::Stage::kHead,
                     add_group(fsdp, output.empty() ? "norm" : "norm+output",
                               output.empty() ? std::vector<std::string>{"norm.weight"}
                                              : std::vector<std::string>{"norm.weight", output},
                               true));
  }
  std::ostringstream os;
  os << (mesh.size(comm::MeshDim::kDpReplicate) > 1 ? "HSDP " : "FSDP ") << dp_shard_cp.size() << ": "
     << fsdp.num_groups() << " groups (tok_embeddings, one per block, norm+output"
     << (pipelined ? "; this rank's stages only), gathered once per step, gradients reduce-scattered once per step"
                   : ")")
     << ", reshard_after_forward " << reshard_policy
     << ", largest gathered group " << fsdp.unsharded_bytes_max() << " bytes"
     << (o.fsdp_overlap ? ", overlapped (prefetch + deferred reduce-scatter)" : ", blocking");
  if (fsdp.num_float8_params() > 0)
    os << ", " << fsdp.num_float8_params() << " float8 linear weights gathered in float8";
  if (plan.expert_fsdp)
    os << "; the EP-sharded experts: FSDP " << efsdp->size() << " over efsdp, " << plan.expert_fsdp->num_groups()
       << " groups (one per MoE block), largest gathered group " << plan.expert_fsdp->unsharded_bytes_max() << " bytes";
  plan.description = os.str();
  return plan;
}

// The plan. Stages in torchtitan's order, each a no-op at degree 1.
std::unique_ptr<ParallelModel> parallelize_model(model::Transformer& model, comm::DeviceMesh& mesh,
                                                 const ParallelOptions& options) {
  auto pm = std::make_unique<ParallelModel>(model, mesh, options);
  auto holds = [&pm](const std::string& module) { return pm->holds(module); };
  // 1. Tensor + sequence parallel first: it decides the local shapes FSDP shards and rebuilds
  //    the float8 computes with their TP sharding.
  if (comm::Comm* tp = mesh.comm(comm::MeshDim::kTp)) {
    check_tp_degree(model.args(), tp->size(), options.seq_len / mesh.size(comm::MeshDim::kCp));
    const comm::ParallelDims& d = mesh.dims();
    const MoeTp moe_tp = d.ep > 1 && d.etp == 1 ? MoeTp::kSequence : MoeTp::kShardExperts;
    const TensorParallelPlan plan = apply_tp(model, *tp, options, moe_tp, holds);
    if (moe_tp == MoeTp::kSequence) pm->count_experts_over_tp();
    for (const auto& [fqn, dim] : plan.sharded_weights) pm->shard_over_tp(fqn, dim, tp->size());
    pm->add_plan_line(plan.description);
  }
  // 1b. Context parallel: attention exchanges K/V (or heads) over cp; everything else is per token
  //     and runs on the rank's share of the sequence (See Note [Context parallelism]).
  if (comm::Comm* cp = mesh.comm(comm::MeshDim::kCp)) {
    context_parallel::check_cp_degree(model.args(), cp->size(), mesh.size(comm::MeshDim::kTp), options.seq_len,
                                      options.cp_rotate_method);
    context_parallel::apply_cp(model, *cp, options.cp_rotate_method, holds);
    pm->add_plan_line("context parallel " + std::to_string(cp->size()) + ": rank " + std::to_string(cp->rank()) +
                      " computes sequence chunks " + std::to_string(cp->rank()) + " and " +
                      std::to_string(2 * cp->size() - 1 - cp->rank()) + " of " + std::to_string(2 * cp->size()) +
                      "; attention " + context_parallel::cp_rotate_method_name(options.cp_rotate_method));
  }
  // 1c. Expert parallel: each MoE layer's experts sharded over ep, tokens moved by all-to-all
  //     (See Note [Expert parallelism]); FSDP below leaves those weights to their EP ranks.
  if (comm::Comm* ep = mesh.comm(comm::MeshDim::kEp)) {
    const expert_parallel::ExpertParallelPlan plan =
        expert_parallel::apply_ep(model, *ep, mesh.size(comm::MeshDim::kEfsdp), holds);
    for (const std::string& fqn : plan.sharded_experts) pm->shard_over_ep(fqn, ep->size());
    pm->add_plan_line(plan.description);
  }
  // 2. Activation checkpointing wraps each checkpointed block's forward...
  apply_ac(model, options.ac);
  pm->add_plan_line("activation checkpointing: " + describe_ac(options.ac));
  // 3. ...and FSDP wraps that, so its gathers bracket the block and its backward hook
  //    re-gathers before AC recomputes (See Note [FSDP wraps AC]).
  if (comm::Comm* shard = mesh.comm(comm::MeshDim::kDpShardCp)) {
    FsdpPlan plan = apply_fsdp(model, *shard, mesh, options, pm->held_params(), holds);
    pm->attach_fsdp(std::move(plan.fsdp), std::move(plan.expert_fsdp));
    pm->add_plan_line(plan.description);
  }
  if (mesh.size(comm::MeshDim::kDpReplicate) > 1)
    pm->add_plan_line("data-parallel replicas " + std::to_string(mesh.size(comm::MeshDim::kDpReplicate)) +
                      ": gradients all-reduced across them once per step");
  // 3b. A tied embedding split across pipeline stages: the two copies' gradients summed.
  pm->tie_embedding_across_stages();
  // 4. This rank's master parameters (the ones FSDP does not own) and the model's buffers.
  pm->finalize();
  return pm;
}

std::unique_ptr<pipeline::Schedule> build_schedule(model::Transformer& model, ParallelModel& parallel,
                                                   comm::DeviceMesh& mesh, const ParallelOptions& options) {
  if (!options.pipeline)
    return std::make_unique<pipeline::SingleStageSchedule>(model, parallel, mesh, options.microbatches,
                                                           options.device);
  int64_t boundary_seq = options.seq_len / mesh.size(comm::MeshDim::kCp);
  if (mesh.size(comm::MeshDim::kTp) > 1) boundary_seq /= mesh.size(comm::MeshDim::kTp);  // sequence parallel
  const bool split_weights = options.ac.mode == AcMode::kNone;  // See Note [Pipeline execution]
  return std::make_unique<pipeline::PipelineSchedule>(model, parallel, mesh, *options.pipeline, options.device,
                                                      options.compute_dtype, boundary_seq, split_weights);
}

}  // namespace titan::parallel
