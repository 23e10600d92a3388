// parallel/parallelize.h — parallelize_llama: the one place that shapes a model for training
// (torchtitan's parallelize.py), and ParallelModel, the handle the trainer drives.
//
// Every run goes through it, a single process too: with a degree of 1 a stage is a no-op
// (DeviceMesh has no Comm for a dimension of size 1), so the trainer has one path. The
// trainer's view of the result: float32 master parameters (this rank's shards, all of them for
// one process) for the optimizer; a per-micro-batch bind; a loss that may be vocab-parallel;
// per-step gradient reductions that are not part of FSDP (TP-replicated weights, HSDP
// replicas); a global grad norm; the global loss; the float8 work after the optimizer step.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/llama.h"
#include "parallel/activation_checkpoint.h"
#include "parallel/context_parallel.h"
#include "parallel/fsdp.h"
#include "parallel/mesh.h"
#include "parallel/pipeline_plan.h"
#include "parallel/schedule.h"

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
  // batch / training.local_batch_size); the schedule runs them (parallel/schedule.h).
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
  // Pipeline parallelism (pp > 1): the stages, their ranks and the order (pipeline_plan.h). This
  // rank's model holds only its stages' modules; the schedule runs the plan's order.
  std::optional<PipelinePlan> pipeline;
  // parallelism.context_parallel_rotate_method: how attention exchanges keys and values when cp > 1
  // (context_parallel.h).
  CpRotateMethod cp_rotate_method = CpRotateMethod::kAllGather;
};

// Whether the TP degree divides the heads, kv heads, feed-forward hidden dim and seq_len: throws
// std::invalid_argument with the numbers and what to choose (a config error).
void check_tp_degree(const model::ModelArgs& args, int tp, int64_t seq_len);

// Throws std::invalid_argument when a block-scaled (MX, blockwise float8) linear would have a
// block straddle two tensor-parallel shards: the sharded dimension of each column-parallel
// (out_features) or row-parallel (in_features) linear must split into whole blocks per rank,
// so every rank's block scales are the ones one process computes.
void check_block_scaled_tp(const std::vector<model::Linear*>& linears, int tp);

// Note [Checkpoint shards]: where this rank's master of one parameter lies in the full
// tensor, so a checkpoint stores only real elements and any layout can read them back. A master
// is the TP chunk (along tp_dim, zero-padded at the end of the full dim), then FSDP's dim-0
// chunk of that (zero-padded at the end of the TP-local dim): in every dim the real elements
// are a PREFIX of the local tensor, of `lengths` elements, starting at `offsets` in the full
// tensor. Exactly one rank of the mesh is the `owner` of each element (HSDP replica 0; TP rank
// 0 for a TP-replicated weight), so a save writes every element once.
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

class ParallelModel {
 public:
  ParallelModel(model::Llama& model, DeviceMesh& mesh, ParallelOptions options);
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
  bool holds_param(const std::string& fqn) const;  // "layers.3.attention.wq.weight"
  const std::vector<at::Tensor>& master_params() const { return masters_; }

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

  // How one step's micro-batches run forward and backward (See Note [Schedules as data] in
  // schedule.h): the trainer's step calls schedule().step and nothing else about micro-batches.
  Schedule& schedule() { return *schedule_; }

  // Before each micro-batch forward: without FSDP, points the model at compute copies of the
  // masters (FSDP casts during its gathers instead).
  void bind_compute_params();
  // Sum over tokens of the cross entropy of this rank's rows (vocab-parallel under loss parallel).
  at::Tensor loss_sum(const at::Tensor& logits, const at::Tensor& labels);
  // After each micro-batch backward (FSDP's leftovers) and once per step after all of them
  // (gradient sums over TP for replicated weights and over dp_replicate for HSDP).
  void after_backward();
  void reduce_grads();
  // Clips by the global L2 norm of all gradients (each element counted once over the mesh;
  // one all-reduce); returns the norm before clipping.
  double clip_grad_norm(double max_norm);
  // Sum over the ranks that hold distinct tokens, dp x cp (TP ranks hold the same value): the
  // global loss sum and token count.
  double sum_over_dp_cp(double local);
  // After the optimizer step: the FSDP float8 weights' next scales (one all-reduce, with
  // float8_precompute_fsdp_scales) and the delayed-scaling amax histories (one all-reduce over
  // all ranks, See Note [Delayed scaling]). No-op without float8.
  void after_optimizer_step();

  // The start-up picture: the mesh, one line per applied stage, then the model's wrapper and
  // compute chains (model::Llama::describe).
  std::vector<std::string> describe() const;
  const Fsdp* fsdp() const { return fsdp_.get(); }  // nullptr without FSDP

 private:
  friend std::unique_ptr<ParallelModel> parallelize_llama(model::Llama&, DeviceMesh&,
                                                          const ParallelOptions&);
  friend void apply_tp(ParallelModel& pm, Comm& tp);
  friend void apply_fsdp(ParallelModel& pm, Comm& dp_shard_cp);
  struct Param {
    std::string fqn;
    at::Tensor* slot;                 // the model's tensor
    std::vector<int64_t> full_shape;  // the model's (meta) shape
    std::vector<int64_t> tp_shape;    // after TP sharding (= full_shape when replicated)
    int tp_dim = -1;                  // dim sharded over TP; -1 = replicated over TP
    at::Tensor master;                // without FSDP: float32 [tp_shape], requires_grad
  };
  Param& param(const std::string& fqn);
  at::Tensor local_full_param(const std::string& fqn);  // full_param within this stage's groups
  at::Tensor tp_local(const Param& p, const at::Tensor& full) const;
  void finalize();  // allocates the masters FSDP does not own, and the buffers

  model::Llama& model_;
  DeviceMesh& mesh_;
  ParallelOptions options_;
  std::vector<Param> params_;
  std::vector<std::string> all_names_;                // every parameter of the model
  std::vector<std::vector<int64_t>> all_shapes_;
  std::vector<model::ModelPart> held_parts_;          // this rank's pipeline stages (the whole model without pp)
  std::vector<std::string> names_;
  std::vector<at::Tensor> masters_;   // what the optimizer steps, in names_ order
  std::vector<bool> tp_replicated_;   // per master
  std::unique_ptr<Fsdp> fsdp_;
  std::unique_ptr<Schedule> schedule_;
  std::vector<std::string> log_;
};

// Applies, in this order: tensor/sequence parallel, activation checkpointing, FSDP/HSDP; then
// allocates this rank's master parameters and sets the micro-batch schedule. The model must
// still be on the meta device; call
// init_weights on the result next.
std::unique_ptr<ParallelModel> parallelize_llama(model::Llama& model, DeviceMesh& mesh,
                                                 const ParallelOptions& options);

// Scales `grads` so that their global L2 norm is at most `max_norm`; returns the norm before
// clipping (float64 on the host). `counted[i]`: whether grads[i] counts toward the norm on this
// rank (a gradient replicated over ranks counts on one of them only); `world`, when set, sums
// the squares over all ranks (one all-reduce). Per-tensor norms in float32, as
// torch.nn.utils.clip_grad_norm_; squares summed in float64 so the norm does not depend on how
// many shards a tensor was split into.
double clip_grad_norm(const std::vector<at::Tensor>& grads, const std::vector<bool>& counted,
                      double max_norm, Comm* world);

}  // namespace titan::parallel
