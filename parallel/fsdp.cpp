// parallel/fsdp.cpp — see fsdp.h.
#include "parallel/fsdp.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <map>
#include <sstream>

#include "float8/scaling.h"
#include "model/scope.h"

namespace titan::parallel {
namespace {

// FSDP's resize-to-0 trick without device-specific headers: the storage keeps its identity
// (tensors viewing it and autograd's saved references stay valid) while its memory is gone.
void free_storage(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  s->set_nbytes(0);
}

// Only the gathered parameters' buffers are allocated here (memory snapshots show them apart).
void allocate_storage(const at::Tensor& t, size_t nbytes) {
  model::NamedScope scope(kFsdpGatheredScope, model::MemoryCategory::kCommunication);
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(s->allocator()->allocate(nbytes));
  s->set_nbytes(nbytes);
}

}  // namespace

ShardLayout shard_layout(int64_t rows, int rank, int n) {
  ShardLayout l;
  l.rows = rows;
  l.padded_rows = (rows + n - 1) / n * n;
  l.shard_rows = l.padded_rows / n;
  l.valid_rows = std::max<int64_t>(0, std::min<int64_t>(l.shard_rows, rows - rank * l.shard_rows));
  return l;
}

struct Fsdp::ParamState {
  std::string fqn;
  at::Tensor* slot;
  std::vector<int64_t> shape;  // unsharded [d0, rest...]
  ShardLayout layout;
  int64_t row_numel = 1;       // prod(rest)
  int64_t shard_numel = 0;     // shard_rows * row_numel
  int64_t shard_offset = 0;    // in the per-rank flat gradient shard [S] (every parameter)
  int64_t gather_offset = 0;   // in the per-rank gather shard of its kind (hp [H] or float8 [F])
  at::Tensor master;           // [shard_rows, rest...] float32, requires_grad
  at::Tensor leaf;             // [d0, rest...] compute dtype (hp: view of unsharded_flat)
  std::optional<FsdpFloat8Weight> float8;  // See Note [FSDP float8 all-gather]
  at::Tensor precomputed_scale;          // [] float32, from precompute_float8_scales()
  at::Tensor f8_view;                    // [d0, rest...] float8: view of the group's f8_unsharded
  at::Tensor f8_scale;                   // [] float32: the gathered weight's scale, updated in place
};

// An all-gather in flight (See Note [FSDP overlap]): issued by begin_unshard, landed in the
// unsharded buffers by finish_unshard.
struct Fsdp::Gather {
  comm::CommWork hp_work, f8_work;
  at::Tensor hp_staging;  // [N * H] compute dtype, rank-major
  at::Tensor f8_staging;  // [N * F] uint8, rank-major
  std::vector<at::Tensor> f8_scales;  // per float8 weight, [] float32
};

// A gradient reduce-scatter in flight: output [S] float32, summed into the masters' .grad when
// it completes.
struct Fsdp::ReduceScatter {
  comm::CommWork work;
  at::Tensor input;   // [N * S] float32, rank-major
  at::Tensor output;  // [S] float32
};

struct Fsdp::Group {
  using Param = ParamState;
  std::string name;
  std::vector<Param> params;
  bool reshard_after_forward = true;
  int64_t shard_numel = 0;      // S: every parameter's shard (the gradient reduce-scatter)
  int64_t hp_shard_numel = 0;   // H: the parameters gathered in the compute dtype
  int64_t f8_shard_numel = 0;   // F: the float8-gathered weights (bytes)
  // Note [FSDP version counter]: the parameters are views of unsharded_flat, so they share its
  // version counter, which autograd checks when it unpacks a saved weight. Gathers write through
  // fill_alias, a second tensor over the same storage with a counter of its own, so re-gathering
  // before backward does not look like an in-place change of a saved tensor.
  at::Tensor unsharded_flat;  // [N * H] compute dtype; storage freed while resharded
  at::Tensor fill_alias;      // [N * H] same storage, own version counter
  at::Tensor f8_unsharded;    // [N * F] uint8; storage freed while resharded (float8 weights' views)
  bool unsharded = false;
  std::optional<Gather> gather;                 // in flight: See Note [FSDP overlap]
  std::optional<ReduceScatter> reduce_scatter;  // in flight
  size_t grads_ready = 0;
  size_t grads_per_backward = 0;  // the parameters' uses: accumulations before the reduce-scatter
  bool used_later_in_forward = false;  // a parameter used twice (a tied embedding): kept until the forward ends
};

struct FsdpGradReadyHook : torch::autograd::PostAccumulateGradHook {
  FsdpGradReadyHook(std::function<void()> fn) : fn_(std::move(fn)) {}
  void operator()(const torch::autograd::Variable&) override { fn_(); }
  std::function<void()> fn_;
};

Fsdp::Fsdp(comm::Comm& comm, at::ScalarType compute_dtype, c10::Device device, comm::Comm* float8_amax_tp, bool overlap)
    : comm_(comm), compute_dtype_(compute_dtype), device_(device), float8_amax_tp_(float8_amax_tp), overlap_(overlap) {}

Fsdp::~Fsdp() = default;

int Fsdp::num_groups() const { return static_cast<int>(groups_.size()); }

int64_t Fsdp::unsharded_bytes_max() const {
  int64_t m = 0;
  for (const auto& g : groups_)
    m = std::max<int64_t>(m, (g->hp_shard_numel * static_cast<int64_t>(c10::elementSize(compute_dtype_)) +
                              g->f8_shard_numel) * comm_.size());
  return m;
}

int Fsdp::add_group(const std::string& name, const std::vector<FsdpParamSpec>& specs,
                    bool reshard_after_forward) {
  const int n = comm_.size(), rank = comm_.rank();
  auto group = std::make_unique<Group>();
  group->name = name;
  group->reshard_after_forward = reshard_after_forward;
  for (const auto& spec : specs) {
    TORCH_CHECK(!spec.shape.empty(), "FSDP group '", name, "': parameter ", spec.fqn,
                " is a scalar; dim-0 sharding needs at least one dimension");
    Group::Param p;
    p.fqn = spec.fqn;
    p.slot = spec.slot;
    p.shape = spec.shape;
    p.layout = shard_layout(spec.shape[0], rank, n);
    for (size_t d = 1; d < spec.shape.size(); ++d) p.row_numel *= spec.shape[d];
    p.shard_numel = p.layout.shard_rows * p.row_numel;
    p.shard_offset = group->shard_numel;
    group->shard_numel += p.shard_numel;
    p.float8 = spec.float8;
    group->grads_per_backward += static_cast<size_t>(spec.uses);
    group->used_later_in_forward = group->used_later_in_forward || spec.uses > 1;
    int64_t& gather_numel = p.float8 ? group->f8_shard_numel : group->hp_shard_numel;
    p.gather_offset = gather_numel;
    gather_numel += p.shard_numel;
    std::vector<int64_t> shard_shape = spec.shape;
    shard_shape[0] = p.layout.shard_rows;
    p.master = at::zeros(shard_shape, at::TensorOptions().dtype(at::kFloat).device(device_));
    p.master.requires_grad_(true);
    masters_.push_back(p.master);
    master_fqns_.push_back(p.fqn);
    group->params.push_back(std::move(p));
  }
  const int64_t total = n * group->hp_shard_numel;
  const auto opts = at::TensorOptions().dtype(compute_dtype_).device(device_);
  group->unsharded_flat = at::empty({total}, opts);
  group->fill_alias = at::empty({0}, opts);
  group->fill_alias.set_(group->unsharded_flat.storage(), 0, {total}, {1});
  const int g = static_cast<int>(groups_.size());
  const auto bytes = at::TensorOptions().dtype(at::kByte).device(device_);
  group->f8_unsharded = at::empty({n * group->f8_shard_numel}, bytes);
  for (auto& p : group->params) {
    if (p.float8) {
      TORCH_CHECK(p.float8->slot, "FSDP group '", name, "': float8 weight ", p.fqn, " has no slot");
      // Never holds values (See Note [FSDP float8 all-gather]): a shape for autograd only.
      p.leaf = at::empty(p.shape, opts);
      free_storage(p.leaf);
      std::vector<int64_t> padded = p.shape;
      padded[0] = p.layout.padded_rows;
      p.f8_view = group->f8_unsharded.narrow(0, n * p.gather_offset, n * p.shard_numel)
                      .view(p.float8->float8_dtype)
                      .view(padded)
                      .narrow(0, 0, p.layout.rows);
      p.f8_scale = at::ones({}, at::TensorOptions().dtype(at::kFloat).device(device_));
    } else {
      std::vector<int64_t> padded = p.shape;
      padded[0] = p.layout.padded_rows;
      p.leaf = group->unsharded_flat.narrow(0, n * p.gather_offset, p.layout.padded_rows * p.row_numel)
                   .view(padded)
                   .narrow(0, 0, p.layout.rows);
    }
    p.leaf.requires_grad_(true);
    torch::autograd::impl::set_post_acc_grad_hooks(
        p.leaf, std::make_unique<FsdpGradReadyHook>([this, g] { on_grad_ready(g); }));
  }
  free_storage(group->unsharded_flat);
  free_storage(group->f8_unsharded);
  groups_.push_back(std::move(group));
  return g;
}

void Fsdp::attach_params() {
  for (auto& group : groups_)
    for (auto& p : group->params) *p.slot = p.leaf;
}

bool Fsdp::load_full(const std::string& fqn, const at::Tensor& unsharded) {
  for (auto& group : groups_) {
    for (auto& p : group->params) {
      if (p.fqn != fqn) continue;
      TORCH_CHECK(unsharded.sizes().vec() == p.shape, "FSDP: parameter ", fqn, " has shape ",
                  unsharded.sizes(), ", expected ", c10::IntArrayRef(p.shape));
      at::NoGradGuard no_grad;
      p.precomputed_scale = at::Tensor();  // the weights changed: the next gather measures again
      p.master.zero_();
      const int64_t start = comm_.rank() * p.layout.shard_rows;
      if (p.layout.valid_rows > 0)
        p.master.narrow(0, 0, p.layout.valid_rows)
            .copy_(unsharded.narrow(0, start, p.layout.valid_rows));
      return true;
    }
  }
  return false;
}

void Fsdp::unshard(int g) {
  begin_unshard(g);
  finish_unshard(g);
}

void Fsdp::begin_unshard(int g) {
  Group& group = *groups_[static_cast<size_t>(g)];
  if (group.unsharded || group.gather) return;
  at::NoGradGuard no_grad;
  // Memory snapshots file the gathered parameters as communication buffers.
  model::NamedScope scope("fsdp all-gather", model::MemoryCategory::kCommunication);
  const int n = comm_.size();
  Gather gather;
  if (group.hp_shard_numel > 0) {
    const auto opts = at::TensorOptions().dtype(compute_dtype_).device(device_);
    at::Tensor shard = at::empty({group.hp_shard_numel}, opts);  // this rank's shards, cast
    for (const auto& p : group.params)
      if (!p.float8)
        shard.narrow(0, p.gather_offset, p.shard_numel).copy_(p.master.detach().reshape({-1}));
    gather.hp_staging = at::empty({n * group.hp_shard_numel}, opts);  // [N, H] rank-major
    gather.hp_work = comm_.all_gather_into_tensor_async(gather.hp_staging, shard);
  }
  if (group.f8_shard_numel > 0) begin_unshard_float8(group, gather);
  group.gather = std::move(gather);
  // The group starts holding gathered parameters here (it held none: the early return above).
  max_groups_gathered_ = std::max(max_groups_gathered_, ++groups_gathered_);
}

void Fsdp::finish_unshard(int g) {
  Group& group = *groups_[static_cast<size_t>(g)];
  if (group.unsharded) return;
  begin_unshard(g);  // no-op when prefetched
  at::NoGradGuard no_grad;
  model::NamedScope scope("fsdp all-gather", model::MemoryCategory::kCommunication);
  const int n = comm_.size();
  Gather gather = std::move(*group.gather);
  group.gather.reset();
  if (group.hp_shard_numel > 0) {
    gather.hp_work.wait();
    allocate_storage(group.unsharded_flat, static_cast<size_t>(n * group.hp_shard_numel) *
                                               c10::elementSize(compute_dtype_));
    at::Tensor by_rank = gather.hp_staging.view({n, group.hp_shard_numel});
    // One strided copy per parameter: rank r's rows land at [r * shard_rows, ...) of its view.
    for (const auto& p : group.params)
      if (!p.float8)
        group.fill_alias.narrow(0, n * p.gather_offset, n * p.shard_numel)
            .view({n, p.shard_numel})
            .copy_(by_rank.narrow(1, p.gather_offset, p.shard_numel));
  }
  if (group.f8_shard_numel > 0) finish_unshard_float8(group, gather);
  group.unsharded = true;  // from in flight to gathered: still one group holding (counted at issue)
}

// See Note [FSDP float8 all-gather], steps 1-3.
void Fsdp::begin_unshard_float8(Group& group, Gather& gather) {
  const int n = comm_.size();
  std::vector<Group::Param*> weights;
  for (auto& p : group.params)
    if (p.float8) weights.push_back(&p);
  // 1. Scales: precomputed after the last optimizer step, or one MAX all-reduce of shard amaxes.
  std::vector<Group::Param*> measured;
  for (Group::Param* p : weights)
    if (!p->precomputed_scale.defined()) measured.push_back(p);
  std::vector<at::Tensor> measured_scales = global_float8_scales(measured);
  gather.f8_scales.resize(weights.size());
  for (size_t i = 0, next = 0; i < weights.size(); ++i)
    gather.f8_scales[i] = weights[i]->precomputed_scale.defined() ? weights[i]->precomputed_scale
                                                                  : measured_scales[next++];
  // 2. Cast this rank's shards into one byte buffer; 3. gather it.
  const auto bytes = at::TensorOptions().dtype(at::kByte).device(device_);
  at::Tensor shard = at::empty({group.f8_shard_numel}, bytes);
  for (size_t i = 0; i < weights.size(); ++i) {
    const Group::Param& p = *weights[i];
    shard.narrow(0, p.gather_offset, p.shard_numel)
        .copy_(float8::cast_to_float8(p.master.detach(), gather.f8_scales[i], p.float8->float8_dtype)
                   .reshape({-1})
                   .view(at::kByte));
  }
  gather.f8_staging = at::empty({n * group.f8_shard_numel}, bytes);  // [N, F] rank-major
  gather.f8_work = comm_.all_gather_into_tensor_async(gather.f8_staging, shard);
}

// Step 4.
void Fsdp::finish_unshard_float8(Group& group, Gather& gather) {
  const int n = comm_.size();
  gather.f8_work.wait();
  allocate_storage(group.f8_unsharded, static_cast<size_t>(n * group.f8_shard_numel));
  at::Tensor by_rank = gather.f8_staging.view({n, group.f8_shard_numel});
  // Per weight: rank-major rows into [padded_rows, rest...]; the slot gets the view without the
  // padding. The buffer and the scales are written in place: a forward may have saved them for
  // its backward (the same bytes come back when the group is re-gathered).
  size_t i = 0;
  for (auto& p : group.params) {
    if (!p.float8) continue;
    group.f8_unsharded.narrow(0, n * p.gather_offset, n * p.shard_numel)
        .view({n, p.shard_numel})
        .copy_(by_rank.narrow(1, p.gather_offset, p.shard_numel));
    p.f8_scale.copy_(gather.f8_scales[i++]);
    *p.float8->slot = model::QuantizedOperand{p.f8_view, p.f8_scale};
  }
}

void Fsdp::precompute_float8_scales() {
  at::NoGradGuard no_grad;
  std::vector<Group::Param*> weights;
  for (auto& group : groups_)
    for (auto& p : group->params)
      if (p.float8) weights.push_back(&p);
  model::NamedScope scope("fsdp float8 scales", model::MemoryCategory::kFloat8Casts);
  const std::vector<at::Tensor> scales = global_float8_scales(weights);  // ONE collective (+ TP)
  for (size_t i = 0; i < weights.size(); ++i) weights[i]->precomputed_scale = scales[i];
}

// The tensorwise scale of each full weight from its shards: the stacked shard amaxes in ONE
// all_reduce(MAX) over the shard group (and one over TP when the weights are TP shards too).
std::vector<at::Tensor> Fsdp::global_float8_scales(const std::vector<ParamState*>& weights) {
  if (weights.empty()) return {};
  std::vector<at::Tensor> amaxes;
  for (const Group::Param* p : weights)
    amaxes.push_back(float8::amax(p->master.detach(), float8::ScalingGranularity::Tensorwise, 0));
  at::Tensor global_amax = at::stack(amaxes);
  comm_.all_reduce(global_amax, comm::ReduceOp::kMax);
  if (float8_amax_tp_) float8_amax_tp_->all_reduce(global_amax, comm::ReduceOp::kMax);
  std::vector<at::Tensor> scales;
  for (size_t i = 0; i < weights.size(); ++i)
    scales.push_back(float8::scale_from_amax(global_amax[static_cast<int64_t>(i)], weights[i]->float8->float8_dtype,
                                             weights[i]->float8->round_scales_to_power_of_2));
  return scales;
}

int Fsdp::num_float8_params() const {
  int count = 0;
  for (const auto& group : groups_)
    for (const auto& p : group->params) count += p.float8 ? 1 : 0;
  return count;
}

void Fsdp::reshard(int g) {
  Group& group = *groups_[static_cast<size_t>(g)];
  if (!group.unsharded) return;
  if (group.hp_shard_numel > 0) free_storage(group.unsharded_flat);
  for (auto& p : group.params)
    if (p.float8) *p.float8->slot = model::QuantizedOperand{};
  if (group.f8_shard_numel > 0) free_storage(group.f8_unsharded);
  group.unsharded = false;
  --groups_gathered_;
}

at::Tensor Fsdp::run_group(int g, const at::Tensor& x,
                           const std::function<at::Tensor(const at::Tensor&)>& run) {
  // FSDP's wrapper is outside activation checkpointing (Note [FSDP wraps AC] in
  // activation_checkpoint.h): this runs once per forward, never inside backward's recompute.
  finish_unshard(g);
  prefetch(g + 1);  // See Note [FSDP overlap]
  at::Tensor out = run(x);
  const bool training = at::GradMode::is_enabled() && out.requires_grad();
  const Group& group = *groups_[static_cast<size_t>(g)];
  if (group.reshard_after_forward || (!training && !group.used_later_in_forward)) reshard(g);
  // Without autograd (validation) nothing stays gathered past the forward: once the last group
  // ran, also the ones kept for a later use in it (the tied embedding the output read).
  if (!training && g == num_groups() - 1)
    for (int i = 0; i < num_groups(); ++i) reshard(i);
  if (training) {
    out.register_hook([this, g](const at::Tensor&) {
      finish_unshard(g);
      prefetch(g - 1);  // backward runs the groups in reverse
    });
  }
  return out;
}

void Fsdp::prefetch(int g) {
  if (g < 0 || g >= num_groups()) return;
  if (overlap_)
    begin_unshard(g);
  else
    unshard(g);  // blocking: the order of the overlapped schedule, nothing in flight
}

void Fsdp::on_grad_ready(int g) {
  Group& group = *groups_[static_cast<size_t>(g)];
  if (++group.grads_ready < group.grads_per_backward || defer_reduce_scatter_) return;
  reduce_scatter_grads(g);
}

void Fsdp::reduce_scatter_grads(int g) {
  Group& group = *groups_[static_cast<size_t>(g)];
  at::NoGradGuard no_grad;
  // At most one reduce-scatter in flight (See Note [FSDP overlap]): the previous group's lands
  // before this one's buffer is built.
  for (auto& other : groups_)
    if (other->reduce_scatter) finish_reduce_scatter(*other);
  const int n = comm_.size();
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device_);
  ReduceScatter rs;
  rs.input = at::zeros({n, group.shard_numel}, f32);  // rank-major, padding rows zero
  for (auto& p : group.params) {
    const at::Tensor& grad = p.leaf.grad();
    if (!grad.defined()) continue;  // counts as zero (finish_backward only)
    at::Tensor padded = at::zeros({p.layout.padded_rows * p.row_numel}, f32);
    padded.narrow(0, 0, p.layout.rows * p.row_numel).copy_(grad.reshape({-1}));
    rs.input.narrow(1, p.shard_offset, p.shard_numel).copy_(padded.view({n, p.shard_numel}));
    p.leaf.mutable_grad() = at::Tensor();  // the unsharded gradient is done with
  }
  rs.output = at::empty({group.shard_numel}, f32);
  // A sum: See Note [FSDP gradient scale].
  rs.work = comm_.reduce_scatter_tensor_async(rs.output, rs.input.view({-1}));
  group.reduce_scatter = std::move(rs);
  group.grads_ready = 0;
  reshard(g);  // FSDP2 always reshards after backward
  if (!overlap_) finish_reduce_scatter(group);
}

void Fsdp::finish_reduce_scatter(Group& group) {
  if (!group.reduce_scatter) return;
  at::NoGradGuard no_grad;
  ReduceScatter rs = std::move(*group.reduce_scatter);
  group.reduce_scatter.reset();
  rs.work.wait();
  for (auto& p : group.params) {
    at::Tensor shard_grad = rs.output.narrow(0, p.shard_offset, p.shard_numel).view(p.master.sizes());
    if (p.master.grad().defined())
      p.master.mutable_grad().add_(shard_grad);
    else
      p.master.mutable_grad() = shard_grad.clone();
  }
}

void Fsdp::finish_backward() {
  for (int g = num_groups() - 1; g >= 0; --g) {
    Group& group = *groups_[static_cast<size_t>(g)];
    if (group.grads_ready > 0) reduce_scatter_grads(g);
    reshard(g);
    if (group.gather) {
      group.gather.reset();  // a prefetch nobody used: its handle waits as it goes
      --groups_gathered_;
    }
  }
  for (auto& group : groups_) finish_reduce_scatter(*group);
}

}  // namespace titan::parallel
