// parallel/parallelize.h — parallelize_llama: the whole Llama parallel plan in one function
// (torchtitan's parallelize.py), and ParallelModel, the handle the trainer drives.
//
// The trainer's view of a parallel model: float32 master parameters (this rank's shards) for
// the optimizer; a per-micro-batch bind; a loss that may be vocab-parallel; per-step gradient
// reductions that are not part of FSDP (TP-replicated weights, HSDP replicas); a global grad
// norm; the global loss. With no parallelism the trainer does not use this at all.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/llama.h"
#include "parallel/fsdp.h"
#include "parallel/mesh.h"

namespace titan::parallel {

struct ParallelOptions {
  std::string reshard_after_forward = "default";  // default|always|never
  bool loss_parallel = true;                       // = !parallelism.disable_loss_parallel
  at::ScalarType compute_dtype = at::kFloat;       // training.mixed_precision_param
  c10::Device device = c10::kCPU;
  int64_t seq_len = 0;  // training.seq_len, checked against the TP degree
  // float8.enable_fsdp_float8_all_gather: weight fqn -> its float8 linear's receiver. FSDP
  // gathers these in float8 (See Note [FSDP float8 all-gather] in parallel/fsdp.h); without
  // FSDP they are ignored.
  std::map<std::string, FsdpFloat8Weight> float8_all_gather_weights;
  // float8.tp_input_all_gather: under TP, modules whose input linears are all float8 tensorwise
  // gather that input in float8 (Note [Float8 input from a TP all-gather]).
  bool float8_tp_input_all_gather = true;
};

class ParallelModel {
 public:
  ParallelModel(model::Llama& model, DeviceMesh& mesh, ParallelOptions options);
  ~ParallelModel();

  // Fills the masters from the model's deterministic init: one full parameter at a time on the
  // CPU, of which this rank keeps its (TP, then FSDP) shard. Same values as one process.
  void init_weights(uint64_t seed);
  // Overwrites parameter `fqn` from its full value (checkpoint.initial_load_path).
  void load_full(const std::string& fqn, const at::Tensor& full);

  const std::vector<std::string>& param_names() const { return names_; }
  const std::vector<at::Tensor>& master_params() const { return masters_; }
  std::vector<int64_t> full_shape(size_t i) const { return params_[i].full_shape; }

  // The full value of parameter `fqn` (float32, on the device): all-gathers the FSDP shards,
  // then the TP shards, and drops the padding. Collective: every rank calls it, same order.
  at::Tensor full_param(const std::string& fqn);

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
  // After the optimizer step (float8.precompute_float8_dynamic_scale_for_fsdp): every
  // float8-gathered weight's next scale in one all-reduce. No-op without such weights.
  void precompute_float8_scales();
  // Sum over data-parallel ranks (TP ranks hold the same value).
  double sum_over_dp(double local);

  std::string describe() const;  // one line per applied stage, for the start-up log
  DeviceMesh& mesh() { return mesh_; }

 private:
  friend std::unique_ptr<ParallelModel> parallelize_llama(model::Llama&, DeviceMesh&,
                                                          const ParallelOptions&);
  struct Param {
    std::string fqn;
    at::Tensor* slot;                 // the model's tensor
    std::vector<int64_t> full_shape;  // the model's (meta) shape
    std::vector<int64_t> tp_shape;    // after TP sharding (= full_shape when replicated)
    int tp_dim = -1;                  // dim sharded over TP; -1 = replicated over TP
    at::Tensor master;                // without FSDP: float32 [tp_shape], requires_grad
  };
  at::Tensor tp_local(const Param& p, const at::Tensor& full) const;
  void finalize();  // allocates masters / FSDP groups after the plan is applied

  model::Llama& model_;
  DeviceMesh& mesh_;
  ParallelOptions options_;
  std::vector<Param> params_;
  std::vector<std::string> names_;
  std::vector<at::Tensor> masters_;   // what the optimizer steps, in names_ order
  std::vector<bool> tp_replicated_;   // per master
  std::unique_ptr<Fsdp> fsdp_;
  std::vector<std::pair<std::string, std::vector<std::string>>> fsdp_groups_;  // name -> fqns
  std::vector<bool> fsdp_reshard_;
  std::vector<std::string> log_;
};

// Applies, in this order: tensor/sequence parallel, (activation checkpointing: hook), FSDP/HSDP.
// The model must still be on the meta device; call init_weights on the result next.
std::unique_ptr<ParallelModel> parallelize_llama(model::Llama& model, DeviceMesh& mesh,
                                                 const ParallelOptions& options);

}  // namespace titan::parallel
