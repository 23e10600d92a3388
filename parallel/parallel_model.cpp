// parallel/parallel_model.cpp — see parallel_model.h: ParallelModel, the handle parallelize_model
// returns: this rank's masters and where they lie in the full parameters, the loss, full
// parameters for export, float8's and MoE's post-step work (its gradients: gradients.cpp).
#include "parallel/parallel_model.h"
#include "model/param_path.h"

#include <ATen/core/Reduction.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <sstream>
#include <stdexcept>

#include "float8/float8_linear.h"
#include "model/mtp.h"
#include "parallel/tensor_parallel/tensor_parallel.h"

namespace titan::parallel {

ParallelModel::ParallelModel(model::Transformer& model, comm::DeviceMesh& mesh, ParallelOptions options)
    : model_(model), mesh_(mesh), options_(std::move(options)) {
  if (options_.pipeline) {
    for (int s : options_.pipeline->stages_of(mesh_.local_rank(comm::MeshDim::kPp)))
      held_parts_.push_back(options_.pipeline->stage_parts[static_cast<size_t>(s)]);
  } else {
    held_parts_.push_back(model::ModelPart{});
  }
  model_.visit_params([&](const std::string& fqn, at::Tensor& slot) {
    TORCH_CHECK(slot.is_meta(), "parallelize_model: parameter ", fqn,
                " is already materialized; build the model on the meta device");
    all_names_.push_back(fqn);
    all_shapes_.push_back(slot.sizes().vec());
    if (!holds_param(fqn)) return;  // another pipeline stage's
    HeldParam p;
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

bool ParallelModel::holds_param(const std::string& fqn) const {
  if (holds(model::top_module(fqn))) return true;
  return fqn == "tok_embeddings.weight" && model_.args().tie_embeddings && holds("output");
}

bool ParallelModel::tied_copy() const {
  return model_.args().tie_embeddings && holds("output") && !holds("tok_embeddings");
}

void ParallelModel::tie_embedding_across_stages() {
  comm::Comm* pp = mesh_.comm(comm::MeshDim::kPp);
  if (!pp || !model_.args().tie_embeddings) return;
  const pipeline::PipelinePlan& plan = *options_.pipeline;
  const int first = plan.stage_rank.front(), last = plan.stage_rank.back();
  if (first != last && (pp->rank() == first || pp->rank() == last))
    tied_embedding_pair_ = pp->new_group({first, last}, pp->name() + "/tied_embedding");
  add_plan_line("tied embedding: held by pp rank " + std::to_string(first) + " (embedding) and pp rank " +
                std::to_string(last) + " (output)" +
                (first == last ? ", one tensor" : ", gradients summed between them once per step"));
}

std::vector<std::string> ParallelModel::all_param_names() const { return all_names_; }

std::vector<int64_t> ParallelModel::full_shape(const std::string& fqn) const {
  for (size_t i = 0; i < all_names_.size(); ++i)
    if (all_names_[i] == fqn) return all_shapes_[i];
  throw std::runtime_error("the model has no parameter '" + fqn + "'");
}

HeldParam& ParallelModel::param(const std::string& fqn) {
  for (auto& p : params_)
    if (p.fqn == fqn) return p;
  throw std::runtime_error("the model has no parameter '" + fqn + "'");
}

void ParallelModel::finalize() {
  const int tp = mesh_.size(comm::MeshDim::kTp);
  for (Fsdp* fsdp : {fsdp_.get(), expert_fsdp_.get()}) {
    if (!fsdp) continue;
    const std::vector<std::string> fqns = fsdp->master_fqns();
    const std::vector<at::Tensor> masters = fsdp->masters();
    names_.insert(names_.end(), fqns.begin(), fqns.end());
    masters_.insert(masters_.end(), masters.begin(), masters.end());
    for (const std::string& name : fqns) param(name).fsdp_sharded = true;
  }
  // The parameters FSDP does not own (all of them without FSDP; the EP-sharded experts with it).
  for (auto& p : params_) {
    if (p.fsdp_sharded) continue;
    p.master = at::zeros(p.tp_shape, at::TensorOptions().dtype(at::kFloat).device(options_.device));
    p.master.requires_grad_(true);
    names_.push_back(p.fqn);
    masters_.push_back(p.master);
  }
  TORCH_CHECK(names_.size() == params_.size(), "the plan holds ", names_.size(), " of ", params_.size(), " parameters");
  // See Note [Compute copies]: which masters get a leaf copy.
  const bool low_precision = options_.compute_dtype != at::kFloat;
  const bool one_backward = options_.microbatches == 1;
  const bool replicas = mesh_.size(comm::MeshDim::kDpReplicate) > 1;
  for (const auto& name : names_) {
    HeldParam& p = param(name);
    // (An EP-sharded expert is never replicated over TP: with ETP = 1 the tp ranks are EP ranks.)
    tp_replicated_.push_back(tp > 1 && p.tp_dim < 0 && p.ep_size == 1);
    const bool summed = tp_replicated_.back() || replicas || (tied_embedding_pair_ && name == "tok_embeddings.weight");
    if (low_precision && one_backward && !p.fsdp_sharded && !summed)
      p.compute_copy = at::empty(p.tp_shape, at::TensorOptions().dtype(options_.compute_dtype).device(options_.device))
                           .requires_grad_(true);
    compute_copies_.push_back(p.compute_copy);
  }
  model_.materialize_buffers(options_.device);
}

at::Tensor ParallelModel::tp_local(const HeldParam& p, const at::Tensor& full) const {
  if (p.tp_dim < 0) return full;
  return tensor_parallel::padded_chunk(full, p.tp_dim, mesh_.local_rank(comm::MeshDim::kTp), mesh_.size(comm::MeshDim::kTp));
}

void ParallelModel::load_full(const std::string& fqn, const at::Tensor& full) {
  at::NoGradGuard no_grad;
  HeldParam& p = param(fqn);
  if (full.sizes().vec() != p.full_shape) {
    std::ostringstream os;
    os << "parameter '" << fqn << "' has shape " << full.sizes() << " but the model expects "
       << c10::IntArrayRef(p.full_shape);
    throw std::runtime_error(os.str());
  }
  at::Tensor local = tp_local(p, full.to(at::kFloat));
  if (p.ep_size > 1) local = local.narrow(0, mesh_.local_rank(comm::MeshDim::kEp) * p.tp_shape[0], p.tp_shape[0]);
  if (p.fsdp_sharded)
    (p.ep_size > 1 ? expert_fsdp_ : fsdp_)->load_full(fqn, local);
  else
    p.master.copy_(local);
  copies_stale_ = true;
}

at::Tensor ParallelModel::full_param(const std::string& fqn) {
  at::NoGradGuard no_grad;
  if (comm::Comm* pp = mesh_.comm(comm::MeshDim::kPp)) {  // the stage that holds it gathers, then broadcasts
    const pipeline::PipelinePlan& plan = *options_.pipeline;
    int owner = -1;
    for (int s = 0; s < plan.num_stages() && owner < 0; ++s)
      if (plan.stage_parts[static_cast<size_t>(s)].holds(model::top_module(fqn)))
        owner = plan.stage_rank[static_cast<size_t>(s)];
    TORCH_CHECK(owner >= 0, "no pipeline stage holds parameter '", fqn, "'");
    at::Tensor full = owner == pp->rank()
                          ? local_full_param(fqn)
                          : at::empty(full_shape(fqn), at::TensorOptions().dtype(at::kFloat).device(options_.device));
    pp->broadcast(full, owner);
    return full;
  }
  return local_full_param(fqn);
}

size_t ParallelModel::master_index(const std::string& fqn) const {
  size_t i = 0;
  while (i < names_.size() && names_[i] != fqn) ++i;
  TORCH_CHECK(i < names_.size(), "the model has no parameter '", fqn, "'");
  return i;
}

at::Tensor ParallelModel::local_full_param(const std::string& fqn) {
  const size_t i = master_index(fqn);
  const HeldParam* p = &param(fqn);
  at::Tensor local = masters_[i].detach().contiguous();
  const comm::MeshDim fsdp_dim = p->ep_size > 1 ? comm::MeshDim::kEfsdp : comm::MeshDim::kDpShardCp;
  if (comm::Comm* shard = p->fsdp_sharded ? mesh_.comm(fsdp_dim) : nullptr) {  // [d0p/N, ...] -> [d0, ...]
    at::Tensor out = at::empty({shard->size() * local.numel()}, local.options());
    shard->all_gather_into_tensor(out, local.view({-1}));
    std::vector<int64_t> padded = p->tp_shape;
    padded[0] = local.size(0) * shard->size();
    local = out.view(padded).narrow(0, 0, p->tp_shape[0]).contiguous();
  }
  if (comm::Comm* ep = p->ep_size > 1 ? mesh_.comm(comm::MeshDim::kEp) : nullptr) {  // whole experts per rank
    at::Tensor out = at::empty({ep->size() * local.numel()}, local.options());
    ep->all_gather_into_tensor(out, local.contiguous().view({-1}));
    std::vector<int64_t> shape = local.sizes().vec();
    shape[0] *= ep->size();
    local = out.view(shape);
  }
  if (comm::Comm* tp = p->tp_dim >= 0 ? mesh_.comm(comm::MeshDim::kTp) : nullptr) {  // TP chunks along tp_dim
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
  const int tp = mesh_.size(comm::MeshDim::kTp), tp_rank = mesh_.local_rank(comm::MeshDim::kTp);
  const bool replica0 = mesh_.local_rank(comm::MeshDim::kDpReplicate) == 0;
  const int ep_rank = mesh_.local_rank(comm::MeshDim::kEp);
  std::vector<ShardRegion> regions;
  for (const std::string& name : names_) {
    const HeldParam* p = nullptr;
    for (const auto& q : params_)
      if (q.fqn == name) p = &q;
    ShardRegion r;
    r.fqn = name;
    r.global_shape = p->full_shape;
    r.offsets.assign(p->full_shape.size(), 0);
    r.lengths = p->full_shape;
    // FSDP's group: dp_shard x cp, or efsdp for the EP-sharded experts.
    const comm::MeshDim fsdp_dim = p->ep_size > 1 ? comm::MeshDim::kEfsdp : comm::MeshDim::kDpShardCp;
    const int shards = p->fsdp_sharded ? mesh_.size(fsdp_dim) : 1;
    const int shard_rank = p->fsdp_sharded ? mesh_.local_rank(fsdp_dim) : 0;
    if (p->ep_size > 1) {  // EP: this rank's whole experts, then FSDP's chunk of them (or all, efsdp 1)
      const ShardLayout layout = shard_layout(p->tp_shape[0], shard_rank, shards);
      r.offsets[0] = ep_rank * p->tp_shape[0] + shard_rank * layout.shard_rows;
      r.lengths[0] = layout.valid_rows;
      if (p->tp_dim > 0) {  // ETP = TP: and the tp rank's chunk of the hidden dim
        const auto d = static_cast<size_t>(p->tp_dim);
        r.offsets[d] = tp_rank * p->tp_shape[d];
        r.lengths[d] = tensor_parallel::valid_in_chunk(p->full_shape[d], tp_rank, tp);
      }
      r.owner = replica0 && r.numel() > 0;
      regions.push_back(std::move(r));
      continue;
    }
    // TP: chunk tp_rank of the padded dim; its real elements are a prefix.
    int64_t dim0_real = p->tp_shape[0];  // real rows of the TP-local tensor
    if (p->tp_dim >= 0) {
      const auto d = static_cast<size_t>(p->tp_dim);
      r.offsets[d] = tp_rank * p->tp_shape[d];
      r.lengths[d] = tensor_parallel::valid_in_chunk(p->full_shape[d], tp_rank, tp);
      if (d == 0) dim0_real = r.lengths[0];
    }
    // FSDP: dim-0 chunk shard_rank of the TP-local tensor (its padding included).
    const ShardLayout layout = shard_layout(p->tp_shape[0], shard_rank, shards);
    const int64_t first = shard_rank * layout.shard_rows;
    r.offsets[0] += first;
    r.lengths[0] = std::max<int64_t>(0, std::min(dim0_real, first + layout.shard_rows) - first);
    r.owner = replica0 && (p->tp_dim >= 0 || tp_rank == 0) && r.numel() > 0 &&
              !(tied_copy() && name == "tok_embeddings.weight");  // the embedding's stage writes it
    regions.push_back(std::move(r));
  }
  return regions;
}

void ParallelModel::after_load() {
  if (fsdp_ && options_.float8_precompute_fsdp_scales) fsdp_->precompute_float8_scales();
  copies_stale_ = true;
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
  if (expert_fsdp_) expert_fsdp_->attach_params();
  copies_stale_ = true;
  bind_compute_params();
}

void ParallelModel::bind_compute_params() {
  for (auto& p : params_) {
    if (p.fsdp_sharded) continue;  // FSDP's gathers produce compute-dtype views of its own
    if (p.compute_copy.defined()) {  // See Note [Compute copies]: rewritten by the optimizer
      if (copies_stale_) {
        at::NoGradGuard no_grad;
        p.compute_copy.copy_(p.master);
      }
      *p.slot = p.compute_copy;
    } else {
      *p.slot = options_.compute_dtype == at::kFloat ? p.master : p.master.to(options_.compute_dtype);
    }
  }
  copies_stale_ = false;
}

at::Tensor ParallelModel::gradient(size_t i) const {
  return compute_copies_[i].defined() ? compute_copies_[i].grad() : masters_[i].grad();
}

at::Tensor ParallelModel::loss_sum(const at::Tensor& logits, const at::Tensor& labels, const at::Tensor& documents) {
  comm::Comm* tp = mesh_.comm(comm::MeshDim::kTp);
  const model::ModelArgs& args = model_.args();
  // Labels of kIgnoreIndex add nothing (multi-token prediction's rolled-off positions).
  const model::CrossEntropySum ce_sum = [&](const at::Tensor& l, const at::Tensor& y) {
    if (tp && options_.loss_parallel)
      return tensor_parallel::vocab_parallel_cross_entropy_sum(l.flatten(0, 1), y.flatten(), args.vocab_size, *tp);
    return at::cross_entropy_loss(l.flatten(0, 1).to(at::kFloat), y.flatten(), /*weight=*/std::nullopt,
                                  at::Reduction::Sum, model::kIgnoreIndex);
  };
  // A causal model's rows are one sequence: documents bound the rolls only when block-causal.
  const model::MtpLossSum sum = model::mtp_loss_sum(logits, labels, args.block_causal ? documents : at::Tensor(),
                                                    args.mtp_layers, args.mtp_loss_weight, ce_sum);
  // The step's depths' loss for the metrics line: training micro-batches only (validation runs
  // without gradients).
  if (sum.depths_mean.defined() && at::GradMode::is_enabled()) mtp_loss_sum_ += sum.depths_mean.item<double>();
  return sum.total;
}

double ParallelModel::take_mtp_loss_sum() {
  const double sum = sum_over_dp_cp(mtp_loss_sum_);
  mtp_loss_sum_ = 0;
  return sum;
}

void ParallelModel::after_optimizer_step() {
  if (fsdp_ && options_.float8_precompute_fsdp_scales) fsdp_->precompute_float8_scales();
  // tensorwise_delayed: every linear's amax history advances once per step, with ONE
  // all-reduce(max) over all ranks so every replica scales identically.
  std::function<void(at::Tensor&)> all_reduce_max;
  if (comm::Comm* world = mesh_.world()) all_reduce_max = [world](at::Tensor& t) { world->all_reduce(t, comm::ReduceOp::kMax); };
  float8::sync_amax_history(float8::float8_computes(model_.linears()), all_reduce_max);
}

std::vector<double> ParallelModel::balance_experts() {
  std::vector<model::moe::MoE*> layers;
  for (model::TransformerBlock* block : model_.blocks())
    if (block->moe) layers.push_back(block->moe.get());
  if (layers.empty()) return {};
  std::vector<at::Tensor> counts;
  for (model::moe::MoE* layer : layers) counts.push_back(layer->tokens_per_expert);
  at::Tensor all = at::stack(counts).contiguous();  // [layers, E]
  if (comm::Comm* dp = mesh_.comm(comm::MeshDim::kDpCp)) dp->all_reduce(all, comm::ReduceOp::kSum);
  if (comm::Comm* tp = expert_counts_over_tp_ ? mesh_.comm(comm::MeshDim::kTp) : nullptr)
    tp->all_reduce(all, comm::ReduceOp::kSum);  // each tp rank routed its own sequence shard
  // Under pp each layer's counts are on its stage's ranks (zero elsewhere): summed over pp too,
  // every rank moves every layer's bias the same way, so expert_bias is identical on all ranks
  // (rank 0 saves it) and every rank's line shows every layer's load.
  if (comm::Comm* pp = mesh_.comm(comm::MeshDim::kPp)) pp->all_reduce(all, comm::ReduceOp::kSum);
  std::vector<double> imbalance;
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < layers.size(); ++i) {
    const at::Tensor c = all.select(0, static_cast<int64_t>(i));
    const double mean = c.mean().item<double>();
    imbalance.push_back(mean > 0 ? c.max().item<double>() / mean : 1.0);
    const std::optional<double>& coeff = layers[i]->args.load_balance_coeff;
    if (layers[i]->expert_bias.defined() && *coeff > 0) model::moe::update_expert_bias(layers[i]->expert_bias, c, *coeff);
    layers[i]->tokens_per_expert.zero_();
  }
  return imbalance;
}

void ParallelModel::discard_step_statistics() {
  at::NoGradGuard no_grad;
  for (model::TransformerBlock* block : model_.blocks())
    if (block->moe) block->moe->tokens_per_expert.zero_();
  float8::discard_pending_amax(float8::float8_computes(model_.linears()));
}

void ParallelModel::shard_over_ep(const std::string& fqn, int ep_size) {
  HeldParam& p = param(fqn);
  TORCH_CHECK(p.full_shape[0] % ep_size == 0, "expert parallel: ", fqn, " has ", p.full_shape[0],
              " experts, not a multiple of ", ep_size);
  p.ep_size = ep_size;
  p.tp_shape[0] = p.full_shape[0] / ep_size;
}

void ParallelModel::shard_over_tp(const std::string& fqn, int dim, int tp_size) {
  HeldParam& p = param(fqn);
  p.tp_dim = dim;
  const size_t d = static_cast<size_t>(dim);
  p.tp_shape[d] = tensor_parallel::padded_size(p.full_shape[d], tp_size) / tp_size;
}

std::vector<std::string> ParallelModel::describe() const {
  std::vector<std::string> lines = {"mesh " + mesh_.dims().describe()};
  lines.insert(lines.end(), log_.begin(), log_.end());
  for (const std::string& line : model_.describe([this](const std::string& m) { return holds(m); }))
    lines.push_back("  " + line);
  return lines;
}

}  // namespace titan::parallel
