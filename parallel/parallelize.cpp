// parallel/parallelize.cpp — see parallelize.h. parallelize_llama is the plan; the rest of the
// file is the ParallelModel mechanics it relies on.
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

void check_tp_shapes(const model::ModelArgs& args, int tp, int64_t seq_len, int rank) {
  auto fail = [&](const std::string& what, int64_t value) {
    std::ostringstream os;
    os << "[rank " << rank << "] tensor parallel degree " << tp << " does not divide " << what
       << " (" << value << "); choose parallelism.tensor_parallel_degree among its divisors";
    throw std::invalid_argument(os.str());
  };
  if (args.n_heads % tp) fail("the number of attention heads n_heads", args.n_heads);
  if (args.kv_heads() % tp) fail("the number of kv heads n_kv_heads", args.kv_heads());
  if (args.ffn_hidden_dim() % tp) fail("the feed-forward hidden dim", args.ffn_hidden_dim());
  if (seq_len > 0 && seq_len % tp) fail("training.seq_len (sequence parallel)", seq_len);
}

// See Note [Float8 input from a TP all-gather] in float8/float8_linear.h: when every linear
// reading module `name`'s gathered input is float8 with a tensorwise dynamic input cast, they
// share one handoff (returned); otherwise nullptr (the input is gathered in high precision).
std::shared_ptr<float8::Float8InputHandoff> float8_input_handoff(
    const std::map<std::string, model::Linear*>& linears, const std::string& name,
    const std::vector<std::string>& readers) {
  std::vector<float8::Float8LinearCompute*> computes;
  for (const auto& r : readers) {
    auto* c = dynamic_cast<float8::Float8LinearCompute*>(linears.at(name + "." + r)->compute().get());
    if (!c) return nullptr;
    const float8::Float8Recipe& recipe = c->recipe();
    if (recipe.delayed || recipe.input.granularity != float8::ScalingGranularity::Tensorwise ||
        recipe.grad_weight_high_precision)
      return nullptr;
    computes.push_back(c);
  }
  auto handoff = std::make_shared<float8::Float8InputHandoff>();
  for (auto* c : computes) c->use_input_from(handoff);
  return handoff;
}

}  // namespace

// The plan. Stages in torchtitan's order; each reads as a table.
std::unique_ptr<ParallelModel> parallelize_llama(model::Llama& model, DeviceMesh& mesh,
                                                 const ParallelOptions& options) {
  auto pm = std::make_unique<ParallelModel>(model, mesh, options);
  std::map<std::string, size_t> param_index;
  for (size_t i = 0; i < pm->params_.size(); ++i) param_index[pm->params_[i].fqn] = i;
  auto set_tp_dim = [&](const std::string& module, int dim) {
    pm->params_.at(param_index.at(module + ".weight")).tp_dim = dim;
  };
  std::map<std::string, model::Linear*> linears;
  for (model::Linear* l : model.linears()) linears[l->fqn()] = l;

  // 1. Tensor + sequence parallel.
  int float8_gathers = 0;  // modules whose input is gathered in float8
  if (Comm* tp = mesh.comm(MeshDim::kTp)) {
    check_tp_shapes(model.args(), tp->size(), options.seq_len, mesh.rank());
    // See Note [Scales under TP] in float8/float8_linear.h: along which dim (0 rows, 1 columns,
    // -1 none) this rank holds a shard of each operand of linear `name`.
    auto shard_float8_scales = [&](const std::string& name, int input, int weight, int grad_output) {
      if (auto* c = dynamic_cast<float8::Float8LinearCompute*>(linears.at(name)->compute().get()))
        c->set_tp_sharding([tp](at::Tensor& amax) { tp->all_reduce(amax, ReduceOp::kMax); }, input,
                           weight, grad_output);
    };
    auto apply = [&](const std::string& name, TpStyle style, model::TransformerBlock* block) {
      switch (style) {
        case TpStyle::kColwise:
          shard_float8_scales(name, /*input=*/-1, /*weight: rows=*/0, /*grad_output: columns=*/1);
          linears.at(name)->set_compute(std::make_shared<ColwiseLinear>(linears.at(name)->compute()));
          set_tp_dim(name, 0);
          break;
        case TpStyle::kRowwise:
          shard_float8_scales(name, /*input: columns=*/1, /*weight: columns=*/1, /*grad_output=*/-1);
          linears.at(name)->set_compute(std::make_shared<RowwiseLinear>(linears.at(name)->compute(), *tp));
          set_tp_dim(name, 1);
          break;
        case TpStyle::kSequenceParallel:
          break;  // replicated weight on sequence shards: reduce_grads sums its grads over TP
        case TpStyle::kGatherInput: {
          const bool attention = name.size() >= 9 && name.compare(name.size() - 9, 9, "attention") == 0;
          model::ModuleInputHook& hook =
              attention ? block->attention.prepare_input : block->feed_forward.prepare_input;
          const std::vector<std::string> readers =
              attention ? std::vector<std::string>{"wq", "wk", "wv"} : std::vector<std::string>{"w1", "w3"};
          auto handoff = options.float8_tp_input_all_gather ? float8_input_handoff(linears, name, readers)
                                                            : nullptr;
          if (handoff) {
            hook = make_float8_sequence_gather(*tp, handoff);
            ++float8_gathers;
          } else {
            hook = make_sequence_gather(*tp);
          }
          break;
        }
        case TpStyle::kVocabParallelEmbedding:
          model.set_embedding_compute(make_vocab_parallel_embedding(*tp, model.args().vocab_size));
          set_tp_dim(name, 0);
          break;
        case TpStyle::kVocabParallelOutput:
          shard_float8_scales(name, /*input=*/-1, /*weight: rows=*/0, /*grad_output: columns=*/1);
          linears.at(name)->set_compute(std::make_shared<VocabParallelOutput>(
              linears.at(name)->compute(), *tp, model.args().vocab_size, options.loss_parallel));
          set_tp_dim(name, 0);
          break;
      }
    };
    for (model::TransformerBlock* block : model.blocks())
      for (const auto& [name, style] : kBlockTpPlan)
        apply("layers." + std::to_string(block->layer_id) + "." + name, style, block);
    for (const auto& [name, style] : kModelTpPlan) apply(name, style, nullptr);
    pm->log_.push_back("tensor parallel " + std::to_string(tp->size()) +
                       ": sequence parallel, loss " +
                       (options.loss_parallel ? "on vocab shards" : "on all-gathered logits") +
                       (float8_gathers ? ", " + std::to_string(float8_gathers) +
                                             " module inputs all-gathered in float8"
                                       : std::string()));
  }

  // 2. Activation checkpointing: applied by the trainer right after this function, as the
  //    OUTER BlockRunner around FSDP's (See Note [AC composes outermost] in
  //    parallel/activation_checkpoint.h). FSDP handles the recompute inside backward (See Note
  //    [FSDP under activation checkpointing] in fsdp.cpp); a runner installed before this
  //    function would instead be wrapped by FSDP (`inner` below).

  // 3. FSDP (HSDP when dp_replicate > 1): groups in forward order. reshard_after_forward
  //    "default" frees every group after its forward except the last block and norm+output,
  //    which backward needs first anyway (torchtitan's choice).
  if (mesh.size(MeshDim::kDpShard) > 1) {
    const std::string& policy = options.reshard_after_forward;
    const int64_t n_layers = model.args().n_layers;
    auto reshard = [&](bool last) { return policy == "always" || (policy == "default" && !last); };
    pm->fsdp_groups_.push_back({"tok_embeddings", {"tok_embeddings.weight"}});
    pm->fsdp_reshard_.push_back(reshard(false));
    for (model::TransformerBlock* block : model.blocks()) {
      const std::string prefix = "layers." + std::to_string(block->layer_id) + ".";
      std::vector<std::string> fqns;
      for (const auto& p : pm->params_)
        if (p.fqn.compare(0, prefix.size(), prefix) == 0) fqns.push_back(p.fqn);
      pm->fsdp_groups_.push_back({"layers." + std::to_string(block->layer_id), fqns});
      pm->fsdp_reshard_.push_back(reshard(block->layer_id == n_layers - 1));
    }
    pm->fsdp_groups_.push_back({"norm+output", {"norm.weight", "output.weight"}});
    pm->fsdp_reshard_.push_back(reshard(true));
  }
  pm->finalize();
  if (pm->fsdp_) {
    Fsdp* fsdp = pm->fsdp_.get();
    const int head = fsdp->num_groups() - 1;
    model.set_stage_runner([fsdp, head](model::Stage stage, const at::Tensor& x,
                                        const std::function<at::Tensor(const at::Tensor&)>& run) {
      return fsdp->run_group(stage == model::Stage::kEmbedding ? 0 : head, x, run);
    });
    model::BlockRunner inner = model.block_runner();  // activation checkpointing, if installed
    model.set_block_runner([fsdp, inner](int64_t layer_id, const at::Tensor& h,
                                         const std::function<at::Tensor(const at::Tensor&)>& run) {
      return fsdp->run_group(static_cast<int>(layer_id) + 1, h, [&](const at::Tensor& x) {
        return inner ? inner(layer_id, x, run) : run(x);
      });
    });
    std::ostringstream os;
    os << (mesh.size(MeshDim::kDpReplicate) > 1 ? "HSDP " : "FSDP ")
       << mesh.size(MeshDim::kDpShard) << ": " << fsdp->num_groups()
       << " groups, reshard_after_forward " << options.reshard_after_forward
       << ", largest gathered group " << fsdp->unsharded_bytes_max() << " bytes";
    if (fsdp->num_float8_params() > 0)
      os << ", " << fsdp->num_float8_params() << " float8 linear weights gathered in float8";
    pm->log_.push_back(os.str());
  }
  if (mesh.size(MeshDim::kDpReplicate) > 1)
    pm->log_.push_back("data-parallel replicas " + std::to_string(mesh.size(MeshDim::kDpReplicate)) +
                       ": gradients all-reduced across them once per step");
  return pm;
}

// ---------------------------------------------------------------- ParallelModel

ParallelModel::ParallelModel(model::Llama& model, DeviceMesh& mesh, ParallelOptions options)
    : model_(model), mesh_(mesh), options_(std::move(options)) {
  model_.visit_params([&](const std::string& fqn, at::Tensor& slot) {
    TORCH_CHECK(slot.is_meta(), "parallelize_llama: parameter ", fqn,
                " is already materialized; build the model on the meta device");
    Param p;
    p.fqn = fqn;
    p.slot = &slot;
    p.full_shape = slot.sizes().vec();
    params_.push_back(std::move(p));
  });
}

ParallelModel::~ParallelModel() = default;

void ParallelModel::finalize() {
  const int tp = mesh_.size(MeshDim::kTp);
  for (auto& p : params_) {
    p.tp_shape = p.full_shape;
    if (p.tp_dim >= 0)
      p.tp_shape[static_cast<size_t>(p.tp_dim)] = padded_size(p.full_shape[static_cast<size_t>(p.tp_dim)], tp) / tp;
  }
  std::map<std::string, const Param*> by_fqn;
  for (const auto& p : params_) by_fqn[p.fqn] = &p;
  if (!fsdp_groups_.empty()) {
    fsdp_ = std::make_unique<Fsdp>(*mesh_.comm(MeshDim::kDpShard), options_.compute_dtype, options_.device);
    if (tp > 1) fsdp_->reduce_float8_amax_over(mesh_.comm(MeshDim::kTp));
    for (size_t g = 0; g < fsdp_groups_.size(); ++g) {
      std::vector<FsdpParamSpec> specs;
      for (const auto& fqn : fsdp_groups_[g].second) {
        const Param* p = by_fqn.at(fqn);
        auto f8 = options_.float8_all_gather_weights.find(fqn);
        specs.push_back({p->fqn, p->slot, p->tp_shape,
                         f8 == options_.float8_all_gather_weights.end()
                             ? std::nullopt
                             : std::optional<FsdpFloat8Weight>(f8->second)});
      }
      fsdp_->add_group(fsdp_groups_[g].first, specs, fsdp_reshard_[g]);
    }
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
  for (auto& p : params_) {
    if (p.fqn != fqn) continue;
    TORCH_CHECK(full.sizes().vec() == p.full_shape, "parameter ", fqn, ": got shape ",
                full.sizes(), ", the model expects ", c10::IntArrayRef(p.full_shape));
    at::Tensor local = tp_local(p, full.to(at::kFloat));
    if (fsdp_)
      fsdp_->load_full(fqn, local);
    else
      p.master.copy_(local);
    return;
  }
  TORCH_CHECK(false, "the model has no parameter '", fqn, "'");
}

at::Tensor ParallelModel::full_param(const std::string& fqn) {
  at::NoGradGuard no_grad;
  size_t i = 0;
  while (i < names_.size() && names_[i] != fqn) ++i;
  TORCH_CHECK(i < names_.size(), "the model has no parameter '", fqn, "'");
  const Param* p = nullptr;
  for (const auto& q : params_)
    if (q.fqn == fqn) p = &q;
  at::Tensor local = masters_[i].detach().contiguous();
  if (Comm* shard = fsdp_ ? mesh_.comm(MeshDim::kDpShard) : nullptr) {  // [d0p/N, ...] -> [d0, ...]
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

void ParallelModel::init_weights(uint64_t seed) {
  model_.init_weights(seed, [&](const std::string& fqn, at::Tensor&, const at::Tensor& full) {
    load_full(fqn, full);  // the full value is dropped right after
  });
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

void ParallelModel::precompute_float8_scales() {
  if (fsdp_) fsdp_->precompute_float8_scales();
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
  at::NoGradGuard no_grad;
  // Each gradient element must be counted once over the mesh: FSDP shards and TP shards are
  // disjoint; HSDP replicas count only on replica 0, TP-replicated weights only on TP rank 0.
  const bool replica0 = mesh_.local_rank(MeshDim::kDpReplicate) == 0;
  const bool tp0 = mesh_.local_rank(MeshDim::kTp) == 0;
  std::vector<at::Tensor> grads;
  std::vector<double> weights;
  for (size_t i = 0; i < masters_.size(); ++i) {
    if (!masters_[i].grad().defined()) continue;
    grads.push_back(masters_[i].grad());
    weights.push_back(replica0 && (!tp_replicated_[i] || tp0) ? 1.0 : 0.0);
  }
  // Per-tensor norms in float32 (as torch), squares summed in float64: see clip_grad_norm.
  at::Tensor sum_sq = at::zeros({1}, at::TensorOptions().dtype(at::kDouble).device(options_.device));
  if (!grads.empty()) {
    at::Tensor w = at::tensor(weights, at::TensorOptions().dtype(at::kDouble)).to(options_.device);
    sum_sq = (at::stack(at::_foreach_norm(grads, 2)).to(at::kDouble).pow(2) * w).sum().reshape({1});
  }
  mesh_.world().all_reduce(sum_sq, ReduceOp::kSum);
  const double total = std::sqrt(sum_sq.item<double>());
  const double coef = max_norm / (total + 1e-6);
  if (coef < 1.0 && !grads.empty()) at::_foreach_mul_(grads, coef);
  return total;
}

double ParallelModel::sum_over_dp(double local) {
  Comm* dp = mesh_.comm(MeshDim::kDp);
  if (!dp) return local;
  at::Tensor t = at::tensor({local}, at::TensorOptions().dtype(at::kDouble)).to(options_.device);
  dp->all_reduce(t, ReduceOp::kSum);
  return t.item<double>();
}

std::string ParallelModel::describe() const {
  std::ostringstream os;
  os << mesh_.dims().describe();
  for (const auto& line : log_) os << "; " << line;
  return os.str();
}

}  // namespace titan::parallel
