// parallel/gradients.cpp — see parallel_model.h: what ParallelModel does with a step's gradients
// once backward has produced them: FSDP's pending reduce-scatters finished, the sums over TP's
// replicated weights, the tied embedding's two stages and the data-parallel replicas (by bucket),
// and the clipping of their global norm.
#include <ATen/core/grad_mode.h>
#include <ATen/ops/_foreach_copy.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_norm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <cmath>

#include "model/kernels/fused_ops.h"
#include "parallel/parallel_model.h"

namespace titan::parallel {

void ParallelModel::after_backward() {
  if (fsdp_) fsdp_->finish_backward();
  if (expert_fsdp_) expert_fsdp_->finish_backward();
}

double ParallelModel::finish_gradients(double local_loss_sum) {
  after_backward();  // whatever the schedule's last after_backward left (a no-op when nothing is)
  reduce_grads();
  return sum_over_dp_cp(local_loss_sum);
}

// Note [Gradient buckets]: the replicas' (and TP's) sums of the step's gradients run one
// all-reduce per bucket of up to kReduceBucketBytes: consecutive gradients copied into one kept
// buffer, reduced, copied back; a gradient at least that large is reduced where it lies. Each
// collective pays its messages' fixed cost (2 (r - 1) of them over r replicas: ~1.4 ms each over
// Gloo on two shared cores), so one per gradient would cost more than the bytes (a 100M model:
// 130 gradients); one buffer for all of them, allocated each step, was what this replaced: on
// the CPU a fresh 400 MB buffer is mapped page by page as the copy first touches it (the copy
// in: 190-240 ms fresh, 33 ms into a kept buffer, one process alone; 591 ms of a DP 4 step of the
// 100M model on two shared cores). The sums are elementwise, so for two replicas the buckets
// give the bits one buffer gave; over more, Gloo's ring may add an element's terms in another
// order (as any change of the buffer's length would).
void ParallelModel::all_reduce_grads(const std::vector<at::Tensor>& grads, comm::Comm& comm) {
  std::vector<at::Tensor> pending;  // consecutive gradients of one dtype and device, one bucket's worth
  int64_t pending_numel = 0;
  auto flush = [&] {
    if (pending.empty()) return;
    const at::Tensor& first = pending.front();
    if (!reduce_bucket_.defined() || reduce_bucket_.scalar_type() != first.scalar_type() ||
        reduce_bucket_.device() != first.device() || reduce_bucket_.numel() < pending_numel)
      reduce_bucket_ = at::empty({pending_numel}, first.options());  // grows to the largest bucket, then stays
    std::vector<at::Tensor> slots;  // each gradient's place in the bucket
    int64_t offset = 0;
    for (const auto& g : pending) {
      slots.push_back(reduce_bucket_.narrow(0, offset, g.numel()).view(g.sizes()));
      offset += g.numel();
    }
    at::_foreach_copy_(slots, pending);
    comm.all_reduce(reduce_bucket_.narrow(0, 0, pending_numel), comm::ReduceOp::kSum);
    at::_foreach_copy_(pending, slots);
    pending.clear();
    pending_numel = 0;
  };
  for (const auto& g : grads) {
    const int64_t cap = kReduceBucketBytes / static_cast<int64_t>(g.element_size());  // elements
    if (g.numel() >= cap && g.is_contiguous()) {
      comm.all_reduce(g, comm::ReduceOp::kSum);  // in place: its storage is the gradient's
      continue;
    }
    if (!pending.empty() && (pending_numel + g.numel() > cap || g.scalar_type() != pending.front().scalar_type() ||
                             g.device() != pending.front().device()))
      flush();
    pending.push_back(g);
    pending_numel += g.numel();
  }
  flush();
}

void ParallelModel::reduce_grads() {
  at::NoGradGuard no_grad;
  // Sequence-parallel norms see only their sequence shard: their gradients are partial sums.
  if (comm::Comm* tp = mesh_.comm(comm::MeshDim::kTp)) {
    std::vector<at::Tensor> grads;
    for (size_t i = 0; i < masters_.size(); ++i)
      if (tp_replicated_[i] && masters_[i].grad().defined()) grads.push_back(masters_[i].grad());
    all_reduce_grads(grads, *tp);
  }
  // A tied embedding under pp: its two stages' gradients (See Note [Tied embedding across stages]).
  if (tied_embedding_pair_) {
    const at::Tensor& grad = masters_[master_index("tok_embeddings.weight")].grad();
    TORCH_CHECK(grad.defined(), "tied embedding: no gradient on pp rank ", mesh_.local_rank(comm::MeshDim::kPp));
    at::Tensor sum = grad.contiguous();
    tied_embedding_pair_->all_reduce(sum, comm::ReduceOp::kSum);
    if (!sum.is_same(grad)) grad.copy_(sum);
  }
  // HSDP / replicated data parallel: replicas sum their (already shard-reduced) gradients.
  // Once per step after accumulation: the sum is linear, so this equals per-backward reduction.
  if (comm::Comm* rep = mesh_.comm(comm::MeshDim::kDpReplicate)) {
    std::vector<at::Tensor> grads;
    for (const auto& m : masters_)
      if (m.grad().defined()) grads.push_back(m.grad());
    all_reduce_grads(grads, *rep);
  }
}

ParallelModel::ClippedNorm ParallelModel::clip_grad_norm(double max_norm) {
  // Each gradient element must be counted once over the mesh: FSDP shards and TP shards are
  // disjoint (so are the EP ranks' experts and their efsdp shards); HSDP replicas count only on
  // replica 0, TP-replicated weights only on TP rank 0.
  const bool replica0 = mesh_.local_rank(comm::MeshDim::kDpReplicate) == 0;
  const bool tp0 = mesh_.local_rank(comm::MeshDim::kTp) == 0;
  std::vector<at::Tensor> grads;
  std::vector<bool> counted;
  for (size_t i = 0; i < masters_.size(); ++i) {
    const at::Tensor grad = gradient(i);
    if (!grad.defined()) continue;
    grads.push_back(grad);
    const bool tied_copy_here = tied_copy() && names_[i] == "tok_embeddings.weight";  // counted on the embedding's rank
    counted.push_back(replica0 && (!tp_replicated_[i] || tp0) && !tied_copy_here);
  }
  ClippedNorm clipped;
  clipped.norm = parallel::clip_grad_norm(grads, counted, max_norm, mesh_.world(), &clipped.copy_grad_scale);
  return clipped;
}

double clip_grad_norm(const std::vector<at::Tensor>& grads, const std::vector<bool>& counted,
                      double max_norm, comm::Comm* world, double* low_precision_scale) {
  TORCH_CHECK(grads.size() == counted.size(), "clip_grad_norm: ", grads.size(), " gradients but ",
              counted.size(), " flags");
  at::NoGradGuard no_grad;
  // Float32 gradients (scaled in place) and the others (not scaled).
  std::vector<at::Tensor> full, low;
  std::vector<double> full_counted, low_counted;  // 1 or 0: exact products
  for (size_t i = 0; i < grads.size(); ++i) {
    const bool is_full = grads[i].scalar_type() == at::kFloat;
    (is_full ? full : low).push_back(grads[i]);
    (is_full ? full_counted : low_counted).push_back(counted[i] ? 1.0 : 0.0);
  }
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  at::Tensor sum_sq = at::zeros({1}, f64.device(grads.empty() ? c10::Device(c10::kCPU) : grads[0].device()));
  if (!full.empty()) {
    at::Tensor w = at::tensor(full_counted, f64).to(full[0].device());
    sum_sq = sum_sq + (at::stack(at::_foreach_norm(full, 2)).to(at::kDouble).pow(2) * w).sum().reshape({1});
  }
  // bf16 gradients (the compute copies'): on the CPU titan's kernel sums their squares without a
  // float32 copy of them; on a GPU one foreach norm accumulating in float32, as torch's
  // clip_grad_norm_ does (a double copy of each was 11% of an 8B step on an H200, and one
  // host sync per tensor).
  std::vector<at::Tensor> low_kept;
  for (size_t i = 0; i < low.size(); ++i)
    if (low_counted[i] != 0) low_kept.push_back(low[i]);
  if (!low_kept.empty() && low_kept[0].is_cpu()) {
    double low_squares = 0;
    for (const at::Tensor& g : low_kept) low_squares += model::sum_of_squares(g);
    sum_sq = sum_sq + low_squares;
  } else if (!low_kept.empty()) {
    sum_sq = sum_sq + at::stack(at::_foreach_norm(low_kept, 2, at::kFloat)).to(at::kDouble).pow(2).sum().reshape({1});
  }
  if (world) world->all_reduce(sum_sq, comm::ReduceOp::kSum);
  const double total = std::sqrt(sum_sq.item<double>());
  const double coef = max_norm / (total + 1e-6);
  if (coef < 1.0 && !full.empty()) at::_foreach_mul_(full, coef);
  TORCH_CHECK(low.empty() || low_precision_scale, "clip_grad_norm: low-precision gradients need low_precision_scale");
  if (low_precision_scale) *low_precision_scale = coef < 1.0 ? coef : 1.0;
  return total;
}

double ParallelModel::sum_over_dp_cp(double local) {
  comm::Comm* dp = mesh_.comm(comm::MeshDim::kDpCp);
  if (!dp) return local;
  at::Tensor t = at::tensor({local}, at::TensorOptions().dtype(at::kDouble)).to(options_.device);
  dp->all_reduce(t, comm::ReduceOp::kSum);
  return t.item<double>();
}

}  // namespace titan::parallel
