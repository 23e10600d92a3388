// parallel/fsdp.h — FSDP2: per-parameter dim-0 sharding over the dp_shard group, gathered one
// parameter group (a transformer block; the embedding; final norm + output) at a time.
//
// Per parameter p with (tensor-parallel-local) shape [d0, rest...] on N shard ranks:
//   d0 is padded to d0p = ceil(d0 / N) * N (zero rows, never a crash); rank r keeps rows
//   [r * d0p/N, (r+1) * d0p/N) as its float32 master shard [d0p/N, rest...], which the
//   optimizer and grad clipping see. Padding rows stay zero (zero grads, zero AdamW update).
//
// Per group, one step:
//   forward:  unshard (ONE all_gather_into_tensor of the group's shards, cast to the compute
//             dtype, into a flat staging buffer; copied out into the group's unsharded flat
//             buffer, whose views are the parameters the model uses), prefetch the next group,
//             run, reshard (free the unsharded storage) per reshard_after_forward.
//   backward: a hook on the group's output gradient unshards it again (and prefetches the
//             previous group); when every parameter's gradient has been accumulated (post-
//             accumulate-grad hooks), the gradients are flattened in float32, reduce-scattered
//             (ONE reduce_scatter_tensor, SUM) into the master shards' .grad (accumulating
//             over micro-batches), and the group is resharded.
//
// Note [FSDP overlap] (parallelism.fsdp_overlap, default true): communication runs while the
// model computes (Note [Asynchronous collectives] in process_group.h):
//   forward:  before group g runs, group g+1's all-gather is issued (torchtitan / FSDP2's
//             implicit prefetch); g waits for its own only when it starts.
//   backward: group g's pre-backward hook waits for g's re-gather and issues g-1's; g's
//             gradient reduce-scatter is issued as soon as its gradients are all there and
//             waited for when the next one is issued (its buffer is then needed) or at the end
//             of backward, so it runs under the next group's backward.
// Memory stays bounded: at most two groups hold gathered parameters at once (the running one
// and the prefetched one; max_groups_gathered() counts it, tests check it), plus the groups
// reshard_after_forward keeps, and at most one gradient reduce-scatter buffer is in flight.
// With fsdp_overlap false every collective is waited for when issued, in the same order: the
// same numbers, bit for bit, with all communication exposed.
//
// Note [FSDP float8 all-gather] (float8.enable_fsdp_float8_all_gather, tensorwise recipes):
// a float8 linear's weight is not gathered in the compute dtype at all. Per group, unshard:
//   1. scale: ONE all_reduce(MAX) of the stacked float32 shard amaxes of the group's float8
//      weights (and one more over TP when the weights are TP shards too) gives each weight's
//      global amax, hence the same tensorwise scale one process computes from the full weight;
//      or the scale precompute_float8_scales() made after the last optimizer step (then no
//      collective here at all);
//   2. each float32 master shard is cast to float8 with that scale (1 byte per element);
//   3. ONE all_gather_into_tensor of those bytes (uint8: no backend knows float8 types);
//   4. the gathered bytes land in the group's float8 buffer, and the linear's `weight_cast`
//      slot (model/linear.h) holds the weight's view of it and its scale: the linear's compute
//      receives them as its weight operand (See Note [Linear operands as data]), as torchao's
//      FSDP makes the float8 weight the gathered parameter.
// Reshard empties the slot and frees the buffer's memory (its storage object, which a forward
// may have saved for backward, stays and is refilled with the same bytes by the re-gather
// before backward). The autograd leaf of such a weight never holds values; its gradient
// arrives as usual and is reduce-scattered in float32. Casting the float32 shard (not a
// compute-dtype copy) is what torchao does; with float32 compute it is bit-identical to
// casting the full weight.
//
// Note [FSDP gradient scale]: the trainer scales every micro-batch loss by 1 / (global batch
// tokens), so the gradient of the global mean loss is the SUM over data-parallel ranks: the
// reduce-scatter sums and nothing divides. (torchtitan divides by the dp degree because its
// loss is a per-rank mean.)
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/linear.h"
#include "parallel/comm/process_group.h"

namespace titan::parallel {

// Rows per rank and padding of a dim-0 shard (pure arithmetic, unit-tested).
struct ShardLayout {
  int64_t rows = 0;         // d0, the unsharded (tensor-parallel-local) rows
  int64_t padded_rows = 0;  // ceil(d0 / N) * N
  int64_t shard_rows = 0;   // padded_rows / N
  int64_t valid_rows = 0;   // real rows in this rank's shard (the rest is padding)
};
ShardLayout shard_layout(int64_t rows, int rank, int n);

// A weight FSDP all-gathers in float8 (See Note [FSDP float8 all-gather]).
struct FsdpFloat8Weight {
  at::ScalarType float8_dtype = at::ScalarType::Float8_e4m3fn;
  bool round_scales_to_power_of_2 = false;
  model::QuantizedOperand* slot = nullptr;  // the linear's weight_cast: filled while unsharded
};

// The scope (category communication) of the gathered parameters' own storage, as memory
// snapshots and the tracker see it; the all-gather's buffers are under "fsdp all-gather".
inline constexpr const char* kFsdpGatheredScope = "fsdp gathered parameters";

struct FsdpParamSpec {
  std::string fqn;
  at::Tensor* slot;            // the model's tensor: FSDP points it at the unsharded view
  std::vector<int64_t> shape;  // unsharded (tensor-parallel-local) shape [d0, rest...]
  std::optional<FsdpFloat8Weight> float8 = std::nullopt;  // set: gathered in float8
  // Gradient accumulations into the parameter per backward: 2 for a tied embedding (the
  // embedding's and the output's); the group reduce-scatters once all of them arrived.
  int uses = 1;
};

class Fsdp {
 public:
  // `comm`: the dp_shard group. Unsharded parameters are `compute_dtype` on `device`.
  // `float8_amax_tp`: under TP the weights are TP shards too, so their float8 amaxes are also
  // reduced (MAX) over that group, making the scale the full weight's (Note [Scales under TP]).
  // `overlap`: See Note [FSDP overlap].
  Fsdp(comm::Comm& comm, at::ScalarType compute_dtype, c10::Device device, comm::Comm* float8_amax_tp = nullptr,
       bool overlap = true);
  ~Fsdp();

  // Declares the next group in forward order: allocates this rank's zero float32 master shards
  // (requires_grad) and the unsharded views (no storage until the first gather). Returns the
  // group index. Slots are left alone until attach_params (init still reads their shapes).
  int add_group(const std::string& name, const std::vector<FsdpParamSpec>& params,
                bool reshard_after_forward);
  // Sets parameter `fqn` from its full unsharded value (any device/dtype): keeps this rank's
  // rows. Init streams every parameter through here one at a time. Returns false if FSDP does
  // not own `fqn`.
  bool load_full(const std::string& fqn, const at::Tensor& unsharded);
  // Points every declared parameter's slot at its unsharded view.
  void attach_params();

  // Runs `run(x)` as group g's forward (gather, prefetch, run, reshard, backward hooks).
  at::Tensor run_group(int g, const at::Tensor& x, const std::function<at::Tensor(const at::Tensor&)>& run);

  // Under pipeline parallelism: the gradients of every micro-batch accumulate in the gathered
  // parameters and each group is reduce-scattered once, by finish_backward at the end of the
  // step (no reshard after backward before that).
  void set_defer_reduce_scatter(bool defer) { defer_reduce_scatter_ = defer; }

  // After each backward: reduce-scatters any group whose gradients were not all produced
  // (missing ones count as zero) and reshards everything. Normally a no-op.
  void finish_backward();

  // After each optimizer step (float8.precompute_float8_dynamic_scale_for_fsdp): the next
  // forward's scales of every float8-gathered weight from ONE all_reduce(MAX) of all their shard
  // amaxes, so the unshards skip their own. See Note [FSDP float8 all-gather].
  void precompute_float8_scales();
  int num_float8_params() const;

  // The float32 master shards, in declaration order, with their fqns.
  const std::vector<at::Tensor>& masters() const { return masters_; }
  const std::vector<std::string>& master_fqns() const { return master_fqns_; }
  int num_groups() const;
  // The most groups that held gathered parameters (or had a gather in flight) at one time.
  int max_groups_gathered() const { return max_groups_gathered_; }
  int64_t unsharded_bytes_max() const;  // the largest group's unsharded buffers

 private:
  struct ParamState;  // one parameter of a group
  struct Gather;
  struct ReduceScatter;
  struct Group;
  void unshard(int g);         // begin_unshard + finish_unshard
  void begin_unshard(int g);   // issue the gather (no-op if gathered or in flight)
  void finish_unshard(int g);  // wait for it and land it in the unsharded buffers
  void prefetch(int g);
  void begin_unshard_float8(Group& group, Gather& gather);
  void finish_unshard_float8(Group& group, Gather& gather);
  void finish_reduce_scatter(Group& group);
  std::vector<at::Tensor> global_float8_scales(const std::vector<ParamState*>& weights);
  void reshard(int g);
  void reduce_scatter_grads(int g);
  void on_grad_ready(int g);

  comm::Comm& comm_;
  at::ScalarType compute_dtype_;
  c10::Device device_;
  comm::Comm* float8_amax_tp_;
  bool overlap_;
  bool defer_reduce_scatter_ = false;
  // Groups holding gathered parameters or a gather in flight now, kept as they change (the
  // counter max_groups_gathered() reports, without a scan of the groups per gather).
  int groups_gathered_ = 0;
  int max_groups_gathered_ = 0;
  std::vector<std::unique_ptr<Group>> groups_;
  std::vector<at::Tensor> masters_;
  std::vector<std::string> master_fqns_;
};

}  // namespace titan::parallel
