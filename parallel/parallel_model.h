// parallel/parallel_model.h — ParallelModel: the parallelized model as the trainer drives it:
// this rank's float32 master parameters (its shards, all of them for one process) for the
// optimizer; what a schedule calls around each micro-batch (bind, loss, after backward: the
// pipeline::MicrobatchHooks it implements); the step's gradient finish (FSDP's pending
// reduce-scatters, TP/HSDP reductions, the loss over dp x cp); a global grad norm; the float8
// work after the optimizer step; full parameters for checkpoints and export.
//
// parallelize_model (parallel/parallelize.h) builds it: each stage of the plan decides, then
// hands its decisions to it through the setters below (shard_over_tp, attach_fsdp, add_plan_line).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>
#include <string>
#include <vector>

#include "model/transformer.h"
#include "parallel/comm/mesh.h"
#include "parallel/fsdp.h"
#include "parallel/parallel_options.h"
#include "parallel/pipeline/schedule.h"

namespace titan::parallel {

// Note [Checkpoint shards]: where this rank's master of one parameter lies in the full
// tensor, so a checkpoint stores only real elements and any layout can read them back. A master
// is the TP chunk (along tp_dim, zero-padded at the end of the full dim), then FSDP's dim-0
// chunk of that (zero-padded at the end of the TP-local dim): in every dim the real elements
// are a PREFIX of the local tensor, of `lengths` elements, starting at `offsets` in the full
// tensor. A routed expert weight under expert parallelism is instead this EP rank's whole
// experts (dim 0, no padding: the degree divides the experts), then FSDP's dim-0 chunk of that
// over efsdp when efsdp > 1. Exactly one rank of the mesh is the `owner` of each element (HSDP
// replica 0; TP rank 0 for a TP-replicated weight), so a save writes every element once.
struct ShardRegion {
  std::string fqn;
  std::vector<int64_t> global_shape;  // the full parameter's shape
  std::vector<int64_t> offsets;       // start of this rank's real elements, per dim
  std::vector<int64_t> lengths;       // their extent per dim (0 in dim 0: all padding)
  bool owner = false;                 // this rank writes the region to a checkpoint
  int64_t numel() const;
};
// The real part of a tensor laid out like the region's master (the master itself, an AdamW
// moment): `local` narrowed to `lengths` from 0 in every dim. A view.
at::Tensor region_view(const at::Tensor& local, const ShardRegion& region);

// One parameter of this rank's model parts as the plan shapes it: TP decides tp_dim and
// tp_shape, FSDP then shards tp_shape further.
struct HeldParam {
  std::string fqn;
  at::Tensor* slot;                 // the model's tensor
  std::vector<int64_t> full_shape;  // the model's (meta) shape
  std::vector<int64_t> tp_shape;    // after TP (or EP) sharding (= full_shape when replicated)
  int tp_dim = -1;                  // dim sharded over TP; -1 = replicated over TP
  int ep_size = 1;                  // > 1: dim 0 (the experts) split over the EP group, whole experts each
  bool fsdp_sharded = false;        // FSDP owns its master (dim-0 shards over dp_shard x cp; efsdp for experts)
  at::Tensor master;                // not FSDP's: float32 [tp_shape], requires_grad
  at::Tensor compute_copy;          // bf16 [tp_shape] leaf the model reads, or undefined (Note [Compute copies])
};

class ParallelModel : public pipeline::MicrobatchHooks {
 public:
  ParallelModel(model::Transformer& model, comm::DeviceMesh& mesh, ParallelOptions options);
  ~ParallelModel();

  // Fills the masters from the model's deterministic init: each rank computes only the
  // elements it holds (model::fill_init_box, on the masters' device), the values a single
  // process has. Same values in every layout; no collective.
  void init_weights(uint64_t seed);
  // Overwrites parameter `fqn` from its full value (checkpoint.initial_load_path); throws
  // std::runtime_error naming the parameter when it does not exist or has another shape.
  void load_full(const std::string& fqn, const at::Tensor& full);

  // This rank's parameters (its pipeline stages' under pp; all of them otherwise).
  const std::vector<std::string>& param_names() const { return names_; }
  // Every parameter of the model, in model order, and its full shape (whatever rank holds it).
  std::vector<std::string> all_param_names() const;
  std::vector<int64_t> full_shape(const std::string& fqn) const;
  // Whether this rank holds module `module` ("tok_embeddings", "layers.3", "norm", "output").
  bool holds(const std::string& module) const;
  // "layers.3.attention.wq.weight"; a tied embedding is held by the stages of the embedding and
  // of the output (See Note [Tied embedding across stages]).
  bool holds_param(const std::string& fqn) const;
  const std::vector<at::Tensor>& master_params() const { return masters_; }
  // Note [Compute copies]: under a low-precision compute dtype, a master that is not
  // FSDP-sharded is read by the model through a copy in that dtype. Where one backward per step
  // reaches it and no collective sums its gradient (no TP replication, no dp replicas, not a
  // tied embedding's pair), the copy is a leaf of its own, kept between steps, whose gradient
  // stays bf16 and which the optimizer rewrites in its update (trainer/optim/adamw_kernels.h,
  // Note [Optimizer over compute copies]). Elsewhere the copy is a cast of the master per
  // micro-batch whose backward widens the gradient into the master's float32 .grad (exact
  // accumulation over micro-batches, float32 reductions). Per master, in master_params() order:
  // the leaf copy, or undefined.
  const std::vector<at::Tensor>& compute_copies() const { return compute_copies_; }
  // Master i's gradient this step: its own (float32) or its compute copy's (bf16); undefined if none.
  at::Tensor gradient(size_t i) const;

  // Where each master lies in its full parameter, in param_names() order (See Note [Checkpoint
  // shards]). Pure arithmetic: no collective.
  std::vector<ShardRegion> shard_regions() const;
  // After the masters were overwritten in place (a checkpoint load): recomputes what is derived
  // from them as the step that produced them did, i.e. the FSDP float8 weights' precomputed
  // scales (one all-reduce, with float8_precompute_fsdp_scales), and rebinds compute copies.
  // Collective when precompute is on: every rank calls it.
  void after_load();

  // The full value of parameter `fqn` (float32, on the device): all-gathers the FSDP shards,
  // then the TP shards, and drops the padding; under pp the stage that holds it broadcasts it
  // over the pp group. Collective: every rank calls it, same order, for every fqn of
  // all_param_names().
  at::Tensor full_param(const std::string& fqn);

  // What a schedule calls around each micro-batch (See Note [What a schedule sees of the
  // model] in parallel/pipeline/schedule.h). bind: without FSDP, points the model at compute
  // copies of the masters (FSDP casts during its gathers instead); loss: vocab-parallel under
  // loss parallel; after_backward: FSDP's reduce-scatters still pending.
  void bind_compute_params() override;
  at::Tensor loss_sum(const at::Tensor& logits, const at::Tensor& labels, const at::Tensor& documents) override;
  // Multi-token prediction: the step's depths' loss sum (the mean over depths of their cross
  // entropy sums) over every data-parallel rank's micro-batches since the last call (one
  // all-reduce: every rank calls it), then zero.
  double take_mtp_loss_sum();
  void after_backward() override;
  // After the schedule ran the step's micro-batches: completes this rank's gradients (FSDP's
  // pending reduce-scatters; the sums over TP of replicated weights' gradients, the
  // sequence-parallel norms' partial sums; over dp_replicate for HSDP, once per step since the
  // sum is linear) and returns the global loss sum (this rank's, summed over dp x cp).
  double finish_gradients(double local_loss_sum);
  // Clips by the global L2 norm of all gradients (each element counted once over the mesh;
  // one all-reduce): float32 gradients in place; the compute copies' bf16 gradients are left
  // unrounded and the factor is returned for the optimizer to apply as it reads them.
  struct ClippedNorm {
    double norm = 0;              // before clipping
    double copy_grad_scale = 1;   // the factor for compute_copies()' gradients (1: none)
  };
  ClippedNorm clip_grad_norm(double max_norm);
  // Sum over the ranks that hold distinct tokens, dp x cp (TP ranks hold the same value): the
  // global loss sum and token count.
  double sum_over_dp_cp(double local);
  // After the optimizer step: the FSDP float8 weights' next scales (one all-reduce, with
  // float8_precompute_fsdp_scales) and the delayed-scaling amax histories (one all-reduce over
  // all ranks, See Note [Delayed scaling]). No-op without float8.
  void after_optimizer_step();
  // Once per optimizer step, before it (torchtitan's MoE load-balancing pre-hook): every MoE
  // layer's token counts summed over dp x cp (one all-reduce; and over pp, so that every rank
  // holds every layer's bias, identical everywhere), its expert_bias moved (Note
  // [Aux-loss-free load balancing] in model/moe/moe.h), the counts zeroed. Returns each MoE
  // layer's load imbalance, max / mean tokens per expert (1 = balanced); empty for a dense model.
  std::vector<double> balance_experts();
  // A skipped step's end (Note [Non-finite steps] in trainer/nonfinite_step.cpp), instead of
  // balance_experts and after_optimizer_step: what the step's forward and backward recorded for
  // them is dropped (every MoE layer's token counts, without moving its bias; the delayed float8
  // amaxes, float8::discard_pending_amax). No collective: every rank skips the same step.
  void discard_step_statistics();

  // The start-up picture: the mesh, one line per applied stage, then the model's wrapper and
  // compute chains (model::Transformer::describe).
  std::vector<std::string> describe() const;
  const Fsdp* fsdp() const { return fsdp_.get(); }  // nullptr without FSDP
  model::Transformer& model() { return model_; }
  const ParallelOptions& options() const { return options_; }

  // The plan's stages hand their decisions over through these (parallelize_model).
  // This rank's parameters, in model order, as the plan has shaped them so far.
  const std::vector<HeldParam>& held_params() const { return params_; }
  // Tensor parallel: `fqn`'s weight is sharded along `dim` over `tp_size` ranks (zero-padded).
  void shard_over_tp(const std::string& fqn, int dim, int tp_size);
  // Expert parallel: `fqn`'s stacked experts (dim 0) are split over `ep_size` ranks.
  void shard_over_ep(const std::string& fqn, int ep_size);
  // MoE layers route each tp rank's own sequence shard (MoeTp::kSequence): the token counts of
  // load balancing are then summed over tp too.
  void count_experts_over_tp() { expert_counts_over_tp_ = true; }
  // FSDP owns the masters of the parameters it declared from now on (the others get their own
  // in finalize); `expert_fsdp` (or null) those of the EP-sharded experts, over efsdp.
  void attach_fsdp(std::unique_ptr<Fsdp> fsdp, std::unique_ptr<Fsdp> expert_fsdp = nullptr) {
    fsdp_ = std::move(fsdp);
    expert_fsdp_ = std::move(expert_fsdp);
  }
  // Note [Tied embedding across stages]: under pp a tied embedding (Qwen3's small flavors) is
  // held by the rank of the first stage (the embedding) and by the rank of the last (the output
  // reads it): both initialize, load and step the same values. After the step's backward the
  // two ranks sum their gradients (this all-reduce over a group of the two; nothing when one
  // rank holds both stages, as ZBV's V puts them), so both apply the same update, as one
  // process's parameter does with both uses' gradients. The first stage's rank counts it in the
  // grad norm and writes it to checkpoints; the last stage's copy is only read. Collective over
  // the pp group (its sub-group is created here): the plan's stage after FSDP calls it.
  void tie_embedding_across_stages();
  // One line of the start-up picture (describe()).
  void add_plan_line(std::string line) { log_.push_back(std::move(line)); }
  // Allocates the masters FSDP does not own, and the model's buffers: the plan's last stage.
  void finalize();

 private:
  HeldParam& param(const std::string& fqn);
  size_t master_index(const std::string& fqn) const;  // in names_ / masters_
  at::Tensor local_full_param(const std::string& fqn);  // full_param within this stage's groups
  at::Tensor tp_local(const HeldParam& p, const at::Tensor& full) const;
  // Sums over TP (replicated weights) and over dp_replicate (HSDP) of this step's gradients.
  void reduce_grads();
  // One sum over `comm` of `grads`, bucket by bucket (See Note [Gradient buckets]).
  void all_reduce_grads(const std::vector<at::Tensor>& grads, comm::Comm& comm);

  model::Transformer& model_;
  comm::DeviceMesh& mesh_;
  ParallelOptions options_;
  std::vector<HeldParam> params_;
  std::vector<std::string> all_names_;                // every parameter of the model
  std::vector<std::vector<int64_t>> all_shapes_;
  std::vector<model::ModelPart> held_parts_;          // this rank's pipeline stages (the whole model without pp)
  std::vector<std::string> names_;
  std::vector<at::Tensor> masters_;   // what the optimizer steps, in names_ order
  std::vector<bool> tp_replicated_;   // per master
  std::vector<at::Tensor> compute_copies_;  // per master (Note [Compute copies])
  bool copies_stale_ = true;          // masters written since the copies were (init, load)
  double mtp_loss_sum_ = 0;           // See take_mtp_loss_sum
  std::unique_ptr<Fsdp> fsdp_;
  std::unique_ptr<Fsdp> expert_fsdp_;  // the EP-sharded experts over efsdp (Note [Expert mesh])
  bool expert_counts_over_tp_ = false;
  // The output stage's copy of a tied embedding, on a rank without the embedding's stage.
  bool tied_copy() const;
  std::unique_ptr<comm::Comm> tied_embedding_pair_;  // the two ranks holding it (Note [Tied embedding across stages])
  at::Tensor reduce_bucket_;  // kept from step to step (Note [Gradient buckets])
  std::vector<std::string> log_;
};

// The most bytes of gradients one all-reduce of reduce_grads carries (Note [Gradient buckets]);
// the kept bucket is this size, or the whole of the gradients when they are smaller.
inline constexpr int64_t kReduceBucketBytes = int64_t{64} << 20;

// Scales `grads` so that their global L2 norm is at most `max_norm`; returns the norm before
// clipping (float64 on the host). `counted[i]`: whether grads[i] counts toward the norm on this
// rank (a gradient replicated over ranks counts on one of them only); `world`, when set, sums
// the squares over all ranks (one all-reduce). Per-tensor norms in float32, as
// torch.nn.utils.clip_grad_norm_; squares summed in float64 so the norm does not depend on how
// many shards a tensor was split into. Float32 gradients are scaled in place; lower-precision
// ones are not (scaling would round them): `*low_precision_scale`, when given, receives their
// factor (1 when nothing is clipped).
double clip_grad_norm(const std::vector<at::Tensor>& grads, const std::vector<bool>& counted,
                      double max_norm, comm::Comm* world, double* low_precision_scale = nullptr);


}  // namespace titan::parallel
