// parallel/parallelize.cpp — see parallelize.h. parallelize_llama is the plan and its three
// stages (apply_tp, apply_fsdp here; apply_ac in activation_checkpoint.cpp); the rest of the
// file is the ParallelModel mechanics they rely on.
#include "parallel/parallelize.h"

#include <ATen/core/Reduction.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_norm.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <map>
#include <sstream>
#include <stdexcept>

#include "float8/float8_linear.h"
#include "parallel/async_tp.h"
#include "parallel/pipeline_runner.h"
#include "parallel/tensor_parallel.h"

namespace titan::parallel {
namespace {

enum class TpStyle {
  kColwise,                 // weight rows sharded; input replicated (gathered by the module)
  kRowwise,                 // weight cols sharded; output reduce-scattered to sequence shards
  kSequenceParallel,        // runs on sequence shards; weight replicated, grads summed over TP
  kGatherInput,             // PrepareModuleInput: sequence shards -> replicated, once
  kVocabParallelEmbedding,  // vocab rows sharded; output sequence-sharded
  kVocabParallelOutput,     // vocab rows sharded; loss on vocab shards unless disabled
};

// torchtitan's Llama TP plan. Per transformer block (names relative to "layers.<i>."):
const std::vector<std::pair<std::string, TpStyle>> kBlockTpPlan = {
    {"attention_norm", TpStyle::kSequenceParallel},
    {"attention", TpStyle::kGatherInput},
    {"attention.wq", TpStyle::kColwise},
    {"attention.wk", TpStyle::kColwise},
    {"attention.wv", TpStyle::kColwise},
    {"attention.wo", TpStyle::kRowwise},
    {"ffn_norm", TpStyle::kSequenceParallel},
    {"feed_forward", TpStyle::kGatherInput},
    {"feed_forward.w1", TpStyle::kColwise},
    {"feed_forward.w2", TpStyle::kRowwise},
    {"feed_forward.w3", TpStyle::kColwise},
};
// Outside the blocks:
const std::vector<std::pair<std::string, TpStyle>> kModelTpPlan = {
    {"tok_embeddings", TpStyle::kVocabParallelEmbedding},
    {"norm", TpStyle::kSequenceParallel},
    {"output", TpStyle::kVocabParallelOutput},
};

// The float8 compute at the bottom of `linear`'s chain, or nullptr.
float8::Float8LinearCompute* float8_compute(const model::Linear& linear) {
  return dynamic_cast<float8::Float8LinearCompute*>(model::innermost(linear.compute()));
}

// The float8 input cast that module `name`'s readers (wq/wk/wv or w1/w3) share when every one
// of them accepts a float8 tensorwise input of the same cast (See Note [Float8 operands from the
// producer]); nullopt: the input is gathered in high precision.
std::optional<std::pair<float8::CastConfig, bool>> shared_float8_input_cast(
    const std::map<std::string, model::Linear*>& linears, const std::string& name,
    const std::vector<std::string>& readers) {
  std::optional<std::pair<float8::CastConfig, bool>> shared;
  for (const auto& r : readers) {
    const float8::Float8LinearCompute* c = float8_compute(*linears.at(name + "." + r));
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
  if (args.n_heads % tp) fail("the number of attention heads n_heads", args.n_heads);
  if (args.kv_heads() % tp) fail("the number of kv heads n_kv_heads", args.kv_heads());
  if (args.ffn_hidden_dim() % tp) fail("the feed-forward hidden dim", args.ffn_hidden_dim());
  if (seq_len > 0 && seq_len % tp) fail("training.seq_len (sequence parallel)", seq_len);
}

// 1. Tensor + sequence parallel: torchtitan's Llama plan as a table. Each float8 linear is
// rebuilt with its TP sharding (See Note [Scales under TP]); a module whose readers all take a
// float8 tensorwise input gathers it in float8.
void apply_tp(ParallelModel& pm, Comm& tp) {
  model::Llama& model = pm.model_;
  std::map<std::string, model::Linear*> linears;
  for (model::Linear* l : model.linears()) linears[l->fqn()] = l;
  // Float8 (tensorwise or the axiswise dims that reduce along the shard) amaxes over the group:
  // along which dim (0 rows, 1 columns, -1 none) this rank holds a shard of each operand.
  auto sharded = [&](model::Linear& linear, int input, int weight, int grad_output) {
    std::shared_ptr<model::LinearCompute> compute = linear.compute();
    if (const float8::Float8LinearCompute* c = float8_compute(linear))
      compute = std::make_shared<float8::Float8LinearCompute>(
          c->recipe(), c->emulate(), c->backend(),
          float8::TpSharding{[&tp](at::Tensor& amax) { tp.all_reduce(amax, ReduceOp::kMax); },
                             input, weight, grad_output});
    return compute;
  };
  auto shard_weight = [&](const std::string& module, int dim) {
    ParallelModel::Param& p = pm.param(module + ".weight");
    p.tp_dim = dim;
    p.tp_shape[static_cast<size_t>(dim)] = padded_size(p.full_shape[static_cast<size_t>(dim)], tp.size()) / tp.size();
  };
  int float8_gathers = 0;  // modules whose input is gathered in float8
  // See Note [Async TP]: chunked gathers / reduce-scatters around the block's linears.
  const int async_chunks = pm.options_.async_tp ? static_cast<int>(pm.options_.async_tp_chunks) : 0;
  auto apply = [&](const std::string& name, TpStyle style, model::TransformerBlock* block) {
    switch (style) {
      case TpStyle::kColwise: {
        model::Linear& l = *linears.at(name);
        l.set_compute(std::make_shared<ColwiseLinear>(sharded(l, -1, /*rows*/ 0, /*columns*/ 1)));
        shard_weight(name, 0);
        break;
      }
      case TpStyle::kRowwise: {
        model::Linear& l = *linears.at(name);
        l.set_compute(std::make_shared<RowwiseLinear>(sharded(l, /*columns*/ 1, /*columns*/ 1, -1), tp, async_chunks));
        shard_weight(name, 1);
        break;
      }
      case TpStyle::kSequenceParallel:
        break;  // replicated weight on sequence shards: reduce_grads sums its grads over TP
      case TpStyle::kGatherInput: {
        const bool attention = name.size() >= 9 && name.compare(name.size() - 9, 9, "attention") == 0;
        model::ModuleInputHook& hook =
            attention ? block->attention.prepare_input : block->feed_forward.prepare_input;
        const auto cast = pm.options_.float8_tp_input_all_gather
                              ? shared_float8_input_cast(linears, name,
                                                         attention ? std::vector<std::string>{"wq", "wk", "wv"}
                                                                   : std::vector<std::string>{"w1", "w3"})
                              : std::nullopt;
        if (async_chunks > 0)
          hook = make_async_sequence_gather(tp, async_chunks,
                                            cast ? std::optional<Float8ChunkCast>({cast->first, cast->second})
                                                 : std::nullopt);
        else
          hook = cast ? make_float8_sequence_gather(tp, cast->first, cast->second) : make_sequence_gather(tp);
        float8_gathers += cast ? 1 : 0;
        break;
      }
      case TpStyle::kVocabParallelEmbedding:
        model.set_embedding_compute("vocab_parallel", make_vocab_parallel_embedding(tp, model.args().vocab_size));
        shard_weight(name, 0);
        break;
      case TpStyle::kVocabParallelOutput: {
        model::Linear& l = *linears.at(name);
        l.set_compute(std::make_shared<VocabParallelOutput>(sharded(l, -1, /*rows*/ 0, /*columns*/ 1), tp,
                                                            model.args().vocab_size, pm.options_.loss_parallel));
        shard_weight(name, 0);
        break;
      }
    }
  };
  for (model::TransformerBlock* block : model.blocks())
    if (pm.holds("layers." + std::to_string(block->layer_id)))
      for (const auto& [name, style] : kBlockTpPlan)
        apply("layers." + std::to_string(block->layer_id) + "." + name, style, block);
  for (const auto& [name, style] : kModelTpPlan)
    if (pm.holds(name)) apply(name, style, nullptr);
  pm.log_.push_back("tensor parallel " + std::to_string(tp.size()) + ": sequence parallel, loss " +
                    (pm.options_.loss_parallel ? "on vocab shards" : "on all-gathered logits") +
                    (float8_gathers ? ", " + std::to_string(float8_gathers) + " module inputs all-gathered in float8"
                                    : std::string()) +
                    (async_chunks ? ", async (" + std::to_string(async_chunks) + " chunks per sequence shard)"
                                  : std::string()));
}

// 3. FSDP over dp_shard x cp (HSDP when dp_replicate > 1): one parameter group per block, plus the embedding and
// norm+output, in forward order; each group's wrapper is the outermost of its block (See Note
// [FSDP wraps AC] in activation_checkpoint.h). reshard_after_forward "default" frees every group
// after its forward except the last block and norm+output, which backward needs first anyway
// (torchtitan's choice). Float8 tensorwise linears' weights travel in float8 when asked.
void apply_fsdp(ParallelModel& pm, Comm& dp_shard_cp) {
  model::Llama& model = pm.model_;
  const ParallelOptions& o = pm.options_;
  pm.fsdp_ = std::make_unique<Fsdp>(dp_shard_cp, o.compute_dtype, o.device, pm.mesh_.comm(MeshDim::kTp),
                                    o.fsdp_overlap);
  // Under pp a step runs many micro-batches through each stage, interleaved with the other
  // stages' work: each group is gathered once and its gradients reduce-scattered once, after
  // the last micro-batch (torchtitan keeps the gathered parameters under PP by default too).
  const bool pipelined = o.pipeline.has_value();
  pm.fsdp_->set_defer_reduce_scatter(pipelined);
  const std::string reshard_policy = pipelined && o.reshard_after_forward == "default" ? "never" : o.reshard_after_forward;
  Fsdp& fsdp = *pm.fsdp_;
  std::map<std::string, model::Linear*> by_weight;
  for (model::Linear* l : model.linears()) by_weight[l->fqn() + ".weight"] = l;
  auto add_group = [&](const std::string& name, const std::vector<std::string>& fqns, bool last) {
    std::vector<FsdpParamSpec> specs;
    for (const std::string& fqn : fqns) {
      ParallelModel::Param& p = pm.param(fqn);
      FsdpParamSpec spec{p.fqn, p.slot, p.tp_shape};
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
    // keeps them for backward.
    return model::ForwardWrapper{reshard ? "fsdp" : "fsdp(kept)",
                                 [&fsdp, g](const at::Tensor& x, const model::ForwardFn& inner) {
                                   return fsdp.run_group(g, x, inner);
                                 }};
  };
  if (pm.holds("tok_embeddings"))
    model.wrap_stage(model::Stage::kEmbedding, add_group("tok_embeddings", {"tok_embeddings.weight"}, false));
  const int64_t n_layers = model.args().n_layers;
  for (model::TransformerBlock* block : model.blocks()) {
    const std::string name = "layers." + std::to_string(block->layer_id);
    if (!pm.holds(name)) continue;
    std::vector<std::string> fqns;
    for (const auto& p : pm.params_)
      if (p.fqn.compare(0, name.size() + 1, name + ".") == 0) fqns.push_back(p.fqn);
    model.wrap_block(block->layer_id, add_group(name, fqns, block->layer_id == n_layers - 1));
  }
  if (pm.holds("norm"))
    model.wrap_stage(model::Stage::kHead, add_group("norm+output", {"norm.weight", "output.weight"}, true));
  std::ostringstream os;
  os << (pm.mesh_.size(MeshDim::kDpReplicate) > 1 ? "HSDP " : "FSDP ") << dp_shard_cp.size() << ": "
     << fsdp.num_groups() << " groups (tok_embeddings, one per block, norm+output"
     << (pipelined ? "; this rank's stages only), gathered once per step, gradients reduce-scattered once per step"
                   : ")")
     << ", reshard_after_forward " << reshard_policy
     << ", largest gathered group " << fsdp.unsharded_bytes_max() << " bytes"
     << (o.fsdp_overlap ? ", overlapped (prefetch + deferred reduce-scatter)" : ", blocking");
  if (fsdp.num_float8_params() > 0)
    os << ", " << fsdp.num_float8_params() << " float8 linear weights gathered in float8";
  pm.log_.push_back(os.str());
}

// The plan. Stages in torchtitan's order, each a no-op at degree 1.
std::unique_ptr<ParallelModel> parallelize_llama(model::Llama& model, DeviceMesh& mesh,
                                                 const ParallelOptions& options) {
  auto pm = std::make_unique<ParallelModel>(model, mesh, options);
  // 1. Tensor + sequence parallel first: it decides the local shapes FSDP shards and rebuilds
  //    the float8 computes with their TP sharding.
  if (Comm* tp = mesh.comm(MeshDim::kTp)) {
    check_tp_degree(model.args(), tp->size(), options.seq_len);
    apply_tp(*pm, *tp);
  }
  // 2. Activation checkpointing wraps each checkpointed block's forward...
  apply_ac(model, options.ac);
  pm->log_.push_back("activation checkpointing: " + describe_ac(options.ac));
  // 3. ...and FSDP wraps that, so its gathers bracket the block and its backward hook
  //    re-gathers before AC recomputes (See Note [FSDP wraps AC]).
  if (Comm* shard = mesh.comm(MeshDim::kDpShardCp)) apply_fsdp(*pm, *shard);
  if (mesh.size(MeshDim::kDpReplicate) > 1)
    pm->log_.push_back("data-parallel replicas " + std::to_string(mesh.size(MeshDim::kDpReplicate)) +
                       ": gradients all-reduced across them once per step");
  // 4. This rank's master parameters (the ones FSDP does not own) and the model's buffers.
  pm->finalize();
  // 5. The micro-batch schedule: the pipeline's order over this rank's stages, or without
  //    pipeline parallelism the whole model as one stage (gradient accumulation).
  if (options.pipeline) {
    for (const std::string& line : options.pipeline->describe()) pm->log_.push_back(line);
    int64_t boundary_seq = options.seq_len / mesh.size(MeshDim::kCp);
    if (mesh.size(MeshDim::kTp) > 1) boundary_seq /= mesh.size(MeshDim::kTp);  // sequence parallel
    const bool split_weights = options.ac.mode == AcMode::kNone;  // See Note [Pipeline execution]
    pm->schedule_ = std::make_unique<PipelineSchedule>(model, *pm, mesh, *options.pipeline, options.device,
                                                       options.compute_dtype, boundary_seq, split_weights);
  } else {
    pm->schedule_ = std::make_unique<SingleStageSchedule>(model, *pm, mesh, options.microbatches, options.device);
  }
  pm->log_.push_back(pm->schedule_->describe());
  return pm;
}

// ---------------------------------------------------------------- ParallelModel

namespace {
// "layers.3.attention.wq.weight" -> "layers.3"; "norm.weight" -> "norm".
std::string module_of(const std::string& fqn) {
  const size_t dot = fqn.find('.');
  if (fqn.compare(0, 7, "layers.") == 0) return fqn.substr(0, fqn.find('.', 7));
  return fqn.substr(0, dot);
}
}  // namespace

ParallelModel::ParallelModel(model::Llama& model, DeviceMesh& mesh, ParallelOptions options)
    : model_(model), mesh_(mesh), options_(std::move(options)) {
  if (options_.pipeline) {
    for (int s : options_.pipeline->stages_of(mesh_.local_rank(MeshDim::kPp)))
      held_parts_.push_back(options_.pipeline->stage_parts[static_cast<size_t>(s)]);
  } else {
    held_parts_.push_back(model::ModelPart{});
  }
  model_.visit_params([&](const std::string& fqn, at::Tensor& slot) {
    TORCH_CHECK(slot.is_meta(), "parallelize_llama: parameter ", fqn,
                " is already materialized; build the model on the meta device");
    all_names_.push_back(fqn);
    all_shapes_.push_back(slot.sizes().vec());
    if (!holds(module_of(fqn))) return;  // another pipeline stage's
    Param p;
    p.fqn = fqn;
    p.slot = &slot;
    p.full_shape = slot.sizes().vec();
    p.tp_shape = p.full_shape;
    params_.push_back(std::move(p));
  });
}

ParallelModel::~ParallelModel() = default;

bool ParallelModel::holds(const std::string& module) const {
  for (const auto& part : held_parts_)
    if (part.holds(module)) return true;
  return false;
}

bool ParallelModel::holds_param(const std::string& fqn) const { return holds(module_of(fqn)); }

std::vector<std::string> ParallelModel::all_param_names() const { return all_names_; }

std::vector<int64_t> ParallelModel::full_shape(const std::string& fqn) const {
  for (size_t i = 0; i < all_names_.size(); ++i)
    if (all_names_[i] == fqn) return all_shapes_[i];
  throw std::runtime_error("the model has no parameter '" + fqn + "'");
}

ParallelModel::Param& ParallelModel::param(const std::string& fqn) {
  for (auto& p : params_)
    if (p.fqn == fqn) return p;
  throw std::runtime_error("the model has no parameter '" + fqn + "'");
}

void ParallelModel::finalize() {
  const int tp = mesh_.size(MeshDim::kTp);
  std::map<std::string, const Param*> by_fqn;
  for (const auto& p : params_) by_fqn[p.fqn] = &p;
  if (fsdp_) {
    names_ = fsdp_->master_fqns();
    masters_ = fsdp_->masters();
    TORCH_CHECK(names_.size() == params_.size(), "FSDP groups cover ", names_.size(), " of ",
                params_.size(), " parameters");
  } else {
    for (auto& p : params_) {
      p.master = at::zeros(p.tp_shape, at::TensorOptions().dtype(at::kFloat).device(options_.device));
      p.master.requires_grad_(true);
      names_.push_back(p.fqn);
      masters_.push_back(p.master);
    }
  }
  for (const auto& name : names_) tp_replicated_.push_back(tp > 1 && by_fqn.at(name)->tp_dim < 0);
  model_.materialize_buffers(options_.device);
}

at::Tensor ParallelModel::tp_local(const Param& p, const at::Tensor& full) const {
  if (p.tp_dim < 0) return full;
  return padded_chunk(full, p.tp_dim, mesh_.local_rank(MeshDim::kTp), mesh_.size(MeshDim::kTp));
}

void ParallelModel::load_full(const std::string& fqn, const at::Tensor& full) {
  at::NoGradGuard no_grad;
  Param& p = param(fqn);
  if (full.sizes().vec() != p.full_shape) {
    std::ostringstream os;
    os << "parameter '" << fqn << "' has shape " << full.sizes() << " but the model expects "
       << c10::IntArrayRef(p.full_shape);
    throw std::runtime_error(os.str());
  }
  at::Tensor local = tp_local(p, full.to(at::kFloat));
  if (fsdp_)
    fsdp_->load_full(fqn, local);
  else
    p.master.copy_(local);
}

at::Tensor ParallelModel::full_param(const std::string& fqn) {
  at::NoGradGuard no_grad;
  if (Comm* pp = mesh_.comm(MeshDim::kPp)) {  // the stage that holds it gathers, then broadcasts
    const PipelinePlan& plan = *options_.pipeline;
    int owner = -1;
    for (int s = 0; s < plan.num_stages() && owner < 0; ++s)
      if (plan.stage_parts[static_cast<size_t>(s)].holds(module_of(fqn))) owner = plan.stage_rank[static_cast<size_t>(s)];
    TORCH_CHECK(owner >= 0, "no pipeline stage holds parameter '", fqn, "'");
    at::Tensor full = owner == pp->rank()
                          ? local_full_param(fqn)
                          : at::empty(full_shape(fqn), at::TensorOptions().dtype(at::kFloat).device(options_.device));
    pp->broadcast(full, owner);
    return full;
  }
  return local_full_param(fqn);
}

at::Tensor ParallelModel::local_full_param(const std::string& fqn) {
  size_t i = 0;
  while (i < names_.size() && names_[i] != fqn) ++i;
  TORCH_CHECK(i < names_.size(), "the model has no parameter '", fqn, "'");
  const Param* p = &param(fqn);
  at::Tensor local = masters_[i].detach().contiguous();
  if (Comm* shard = fsdp_ ? mesh_.comm(MeshDim::kDpShardCp) : nullptr) {  // [d0p/N, ...] -> [d0, ...]
    at::Tensor out = at::empty({shard->size() * local.numel()}, local.options());
    shard->all_gather_into_tensor(out, local.view({-1}));
    std::vector<int64_t> padded = p->tp_shape;
    padded[0] = local.size(0) * shard->size();
    local = out.view(padded).narrow(0, 0, p->tp_shape[0]).contiguous();
  }
  if (Comm* tp = p->tp_dim >= 0 ? mesh_.comm(MeshDim::kTp) : nullptr) {  // TP chunks along tp_dim
    at::Tensor out = at::empty({tp->size() * local.numel()}, local.options());
    tp->all_gather_into_tensor(out, local.view({-1}));
    std::vector<int64_t> shape = local.sizes().vec();
    shape.insert(shape.begin(), tp->size());
    local = at::cat(out.view(shape).unbind(0), p->tp_dim)
                .narrow(p->tp_dim, 0, p->full_shape[static_cast<size_t>(p->tp_dim)])
                .contiguous();
  }
  return local;
}

int64_t ShardRegion::numel() const {
  int64_t n = 1;
  for (int64_t l : lengths) n *= l;
  return n;
}

at::Tensor region_view(const at::Tensor& local, const ShardRegion& region) {
  TORCH_CHECK(local.dim() == static_cast<int64_t>(region.lengths.size()), "region_view: ", region.fqn,
              " has ", region.lengths.size(), " dims, the tensor ", local.dim());
  at::Tensor view = local;
  for (size_t d = 0; d < region.lengths.size(); ++d)
    view = view.narrow(static_cast<int64_t>(d), 0, region.lengths[d]);
  return view;
}

std::vector<ShardRegion> ParallelModel::shard_regions() const {
  const int tp = mesh_.size(MeshDim::kTp), tp_rank = mesh_.local_rank(MeshDim::kTp);
  const int shards = fsdp_ ? mesh_.size(MeshDim::kDpShardCp) : 1;
  const int shard_rank = fsdp_ ? mesh_.local_rank(MeshDim::kDpShardCp) : 0;
  const bool replica0 = mesh_.local_rank(MeshDim::kDpReplicate) == 0;
  std::vector<ShardRegion> regions;
  for (const std::string& name : names_) {
    const Param* p = nullptr;
    for (const auto& q : params_)
      if (q.fqn == name) p = &q;
    ShardRegion r;
    r.fqn = name;
    r.global_shape = p->full_shape;
    r.offsets.assign(p->full_shape.size(), 0);
    r.lengths = p->full_shape;
    // TP: chunk tp_rank of the padded dim; its real elements are a prefix.
    int64_t dim0_real = p->tp_shape[0];  // real rows of the TP-local tensor
    if (p->tp_dim >= 0) {
      const auto d = static_cast<size_t>(p->tp_dim);
      r.offsets[d] = tp_rank * p->tp_shape[d];
      r.lengths[d] = valid_in_chunk(p->full_shape[d], tp_rank, tp);
      if (d == 0) dim0_real = r.lengths[0];
    }
    // FSDP: dim-0 chunk shard_rank of the TP-local tensor (its padding included).
    const ShardLayout layout = shard_layout(p->tp_shape[0], shard_rank, shards);
    const int64_t first = shard_rank * layout.shard_rows;
    r.offsets[0] += first;
    r.lengths[0] = std::max<int64_t>(0, std::min(dim0_real, first + layout.shard_rows) - first);
    r.owner = replica0 && (p->tp_dim >= 0 || tp_rank == 0) && r.numel() > 0;
    regions.push_back(std::move(r));
  }
  return regions;
}

void ParallelModel::after_load() {
  if (fsdp_ && options_.float8_precompute_fsdp_scales) fsdp_->precompute_float8_scales();
  bind_compute_params();
}

void ParallelModel::init_weights(uint64_t seed) {
  at::NoGradGuard no_grad;
  // Each master's real elements are one box of the full parameter (Note [Checkpoint shards]):
  // only that box is generated (Note [Counter-based init] in model/init_philox.h); the padding
  // keeps the zeros the masters were allocated with (finalize, Fsdp), which nothing else writes.
  // HSDP replicas and TP-replicated weights compute the same box independently.
  const std::vector<ShardRegion> regions = shard_regions();
  for (size_t i = 0; i < masters_.size(); ++i) {
    const ShardRegion& region = regions[i];
    model::fill_init_box(region_view(masters_[i], region), model_.init_spec(region.fqn), seed,
                         region.fqn, region.global_shape, region.offsets);
  }
  if (fsdp_) fsdp_->attach_params();
  bind_compute_params();
}

void ParallelModel::bind_compute_params() {
  if (fsdp_) return;  // FSDP's gathers produce compute-dtype views
  for (auto& p : params_)
    *p.slot = options_.compute_dtype == at::kFloat ? p.master : p.master.to(options_.compute_dtype);
}

at::Tensor ParallelModel::loss_sum(const at::Tensor& logits, const at::Tensor& labels) {
  Comm* tp = mesh_.comm(MeshDim::kTp);
  if (tp && options_.loss_parallel)
    return vocab_parallel_cross_entropy_sum(logits.flatten(0, 1), labels.flatten(),
                                            model_.args().vocab_size, *tp);
  return at::cross_entropy_loss(logits.flatten(0, 1).to(at::kFloat), labels.flatten(),
                                /*weight=*/std::nullopt, at::Reduction::Sum);
}

void ParallelModel::after_optimizer_step() {
  if (fsdp_ && options_.float8_precompute_fsdp_scales) fsdp_->precompute_float8_scales();
  // tensorwise_delayed: every linear's amax history advances once per step, with ONE
  // all-reduce(max) over all ranks so every replica scales identically.
  std::function<void(at::Tensor&)> all_reduce_max;
  if (Comm* world = mesh_.world()) all_reduce_max = [world](at::Tensor& t) { world->all_reduce(t, ReduceOp::kMax); };
  float8::sync_amax_history(float8::float8_computes(model_.linears()), all_reduce_max);
}

void ParallelModel::after_backward() {
  if (fsdp_) fsdp_->finish_backward();
}

namespace {
// One all-reduce (sum) over `comm` for a list of gradients: flattened into one buffer.
void all_reduce_grads(const std::vector<at::Tensor>& grads, Comm& comm) {
  if (grads.empty()) return;
  std::vector<at::Tensor> flat;
  for (const auto& g : grads) flat.push_back(g.reshape({-1}));
  at::Tensor buffer = at::cat(flat);
  comm.all_reduce(buffer, ReduceOp::kSum);
  int64_t offset = 0;
  for (const auto& g : grads) {
    g.copy_(buffer.narrow(0, offset, g.numel()).view(g.sizes()));
    offset += g.numel();
  }
}
}  // namespace

void ParallelModel::reduce_grads() {
  at::NoGradGuard no_grad;
  // Sequence-parallel norms see only their sequence shard: their gradients are partial sums.
  if (Comm* tp = mesh_.comm(MeshDim::kTp)) {
    std::vector<at::Tensor> grads;
    for (size_t i = 0; i < masters_.size(); ++i)
      if (tp_replicated_[i] && masters_[i].grad().defined()) grads.push_back(masters_[i].grad());
    all_reduce_grads(grads, *tp);
  }
  // HSDP / replicated data parallel: replicas sum their (already shard-reduced) gradients.
  // Once per step after accumulation: the sum is linear, so this equals per-backward reduction.
  if (Comm* rep = mesh_.comm(MeshDim::kDpReplicate)) {
    std::vector<at::Tensor> grads;
    for (const auto& m : masters_)
      if (m.grad().defined()) grads.push_back(m.grad());
    all_reduce_grads(grads, *rep);
  }
}

double ParallelModel::clip_grad_norm(double max_norm) {
  // Each gradient element must be counted once over the mesh: FSDP shards and TP shards are
  // disjoint; HSDP replicas count only on replica 0, TP-replicated weights only on TP rank 0.
  const bool replica0 = mesh_.local_rank(MeshDim::kDpReplicate) == 0;
  const bool tp0 = mesh_.local_rank(MeshDim::kTp) == 0;
  std::vector<at::Tensor> grads;
  std::vector<bool> counted;
  for (size_t i = 0; i < masters_.size(); ++i) {
    if (!masters_[i].grad().defined()) continue;
    grads.push_back(masters_[i].grad());
    counted.push_back(replica0 && (!tp_replicated_[i] || tp0));
  }
  return parallel::clip_grad_norm(grads, counted, max_norm, mesh_.world());
}

double clip_grad_norm(const std::vector<at::Tensor>& grads, const std::vector<bool>& counted,
                      double max_norm, Comm* world) {
  TORCH_CHECK(grads.size() == counted.size(), "clip_grad_norm: ", grads.size(), " gradients but ",
              counted.size(), " flags");
  at::NoGradGuard no_grad;
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  at::Tensor sum_sq = at::zeros({1}, f64.device(grads.empty() ? c10::Device(c10::kCPU) : grads[0].device()));
  if (!grads.empty()) {
    std::vector<double> weights(counted.begin(), counted.end());  // 1 or 0: exact products
    at::Tensor w = at::tensor(weights, f64).to(grads[0].device());
    sum_sq = (at::stack(at::_foreach_norm(grads, 2)).to(at::kDouble).pow(2) * w).sum().reshape({1});
  }
  if (world) world->all_reduce(sum_sq, ReduceOp::kSum);
  const double total = std::sqrt(sum_sq.item<double>());
  const double coef = max_norm / (total + 1e-6);
  if (coef < 1.0 && !grads.empty()) at::_foreach_mul_(grads, coef);
  return total;
}

double ParallelModel::sum_over_dp_cp(double local) {
  Comm* dp = mesh_.comm(MeshDim::kDpCp);
  if (!dp) return local;
  at::Tensor t = at::tensor({local}, at::TensorOptions().dtype(at::kDouble)).to(options_.device);
  dp->all_reduce(t, ReduceOp::kSum);
  return t.item<double>();
}

std::vector<std::string> ParallelModel::describe() const {
  std::vector<std::string> lines = {"mesh " + mesh_.dims().describe()};
  lines.insert(lines.end(), log_.begin(), log_.end());
  for (const std::string& line : model_.describe([this](const std::string& m) { return holds(m); }))
    lines.push_back("  " + line);
  return lines;
}

}  // namespace titan::parallel
