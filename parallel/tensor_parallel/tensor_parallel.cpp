// parallel/tensor_parallel/tensor_parallel.cpp — see tensor_parallel.h.
#include "parallel/tensor_parallel/tensor_parallel.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>

#include <sstream>

#include "float8/scaling.h"
#include "parallel/comm/autograd_comm.h"
#include "parallel/tensor_parallel/async_tp.h"
#include "model/activation_checkpoint_ops.h"
#include "model/mtp.h"

namespace titan::parallel::tensor_parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;


// [B, s, rest...] on every rank -> [B, n*s, rest...], rank t's shard at [t*s, (t+1)*s).
at::Tensor gather_seq_raw(const at::Tensor& x, comm::Comm& comm) {
  const int n = comm.size();
  at::Tensor in = x.contiguous();
  at::Tensor out = at::empty({n * in.numel()}, in.options());
  comm.all_gather_into_tensor(out, in.view({-1}));
  std::vector<int64_t> shape = in.sizes().vec();  // [B, s, rest...]
  shape.insert(shape.begin(), n);                  // [n, B, s, rest...]
  at::Tensor g = out.view(shape).transpose(0, 1);  // [B, n, s, rest...]
  std::vector<int64_t> final_shape = in.sizes().vec();
  final_shape[1] *= n;
  return g.reshape(final_shape);
}

// [B, S, rest...] partial on every rank -> [B, S/n, rest...] summed over ranks.
at::Tensor reduce_scatter_seq_raw(const at::Tensor& x, comm::Comm& comm) {
  const int n = comm.size();
  TORCH_CHECK(x.size(1) % n == 0, "[rank ", comm.global_rank(), "] group '", comm.name(),
              "': sequence length ", x.size(1), " is not divisible by the tensor-parallel degree ",
              n, " (reduce-scatter of a sequence-parallel activation)");
  std::vector<int64_t> split = x.sizes().vec();  // [B, S, rest...]
  split[1] = x.size(1) / n;
  split.insert(split.begin() + 1, n);  // [B, n, S/n, rest...]
  at::Tensor in = x.reshape(split).transpose(0, 1).contiguous();  // [n, B, S/n, rest...]
  std::vector<int64_t> out_shape = x.sizes().vec();
  out_shape[1] /= n;
  at::Tensor out = at::empty(out_shape, x.options());
  comm.reduce_scatter_tensor(out.view({-1}), in.view({-1}));
  return out;
}

// [..., v] -> [..., n*v], rank-major along the last dim.
at::Tensor gather_last_raw(const at::Tensor& x, comm::Comm& comm) {
  const int n = comm.size();
  at::Tensor in = x.contiguous();
  at::Tensor out = at::empty({n * in.numel()}, in.options());
  comm.all_gather_into_tensor(out, in.view({-1}));
  std::vector<int64_t> shape = in.sizes().vec();
  shape.insert(shape.begin(), n);  // [n, ..., v]
  at::Tensor g = out.view(shape).movedim(0, -2);  // [..., n, v]
  std::vector<int64_t> final_shape = in.sizes().vec();
  final_shape.back() *= n;
  return g.reshape(final_shape);
}

struct AllGatherSeq : torch::autograd::Function<AllGatherSeq> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, comm::Comm* group) {
    comm::save_comm(ctx, *group);
    return gather_seq_raw(x, *group);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {reduce_scatter_seq_raw(grads[0], comm::saved_comm(ctx)), at::Tensor()};
  }
};

struct ReduceScatterSeq : torch::autograd::Function<ReduceScatterSeq> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, comm::Comm* group) {
    comm::save_comm(ctx, *group);
    // Through the op layer: per-op AC keeps the reduce-scattered output, so the recompute in
    // backward neither repeats the collective nor needs the other ranks (every rank replays
    // the same stored output). Safe without autograd history: this is a Function's forward.
    return titan::model::checkpointable_op(
        "reduce_scatter", [&] { return reduce_scatter_seq_raw(x, *group); });
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {gather_seq_raw(grads[0], comm::saved_comm(ctx)), at::Tensor()};
  }
};

// The autograd side of make_float8_sequence_gather: [B, s, ...] -> a [B, n*s, ...] tensor with
// one element of storage (expanded), standing for the gathered input that only exists in float8;
// backward is all-gather's adjoint, the sequence reduce-scatter.
struct Float8GatherProxy : torch::autograd::Function<Float8GatherProxy> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, comm::Comm* group) {
    comm::save_comm(ctx, *group);
    std::vector<int64_t> shape = x.sizes().vec();
    shape[1] *= group->size();
    return at::zeros({}, x.options()).expand(shape);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {reduce_scatter_seq_raw(grads[0], comm::saved_comm(ctx)), at::Tensor()};
  }
};

struct AllGatherLastDim : torch::autograd::Function<AllGatherLastDim> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, comm::Comm* group) {
    comm::save_comm(ctx, *group);
    ctx->saved_data["local"] = x.size(-1);
    return gather_last_raw(x, *group);
  }
  // The consumer (the loss) is computed identically on every TP rank, so each rank's gradient
  // of the full tensor is the whole gradient: keep this rank's columns.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    comm::Comm& comm = comm::saved_comm(ctx);
    const int64_t local = ctx->saved_data["local"].toInt();
    return {grads[0].narrow(-1, comm.rank() * local, local).contiguous(), at::Tensor()};
  }
};

// Note [Vocab-parallel cross entropy]: with m = max over the full vocab (all-reduce MAX),
// Z = sum exp(l - m) (all-reduce SUM) and t = l[label] - m (all-reduce SUM of the one rank
// that owns the label), loss = log Z - t. The gradient w.r.t. the local logits is
// softmax_local - onehot_local, all local. Sums over tokens are float32, as at::cross_entropy.
struct VocabParallelCrossEntropy : torch::autograd::Function<VocabParallelCrossEntropy> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits_in,
                            const at::Tensor& labels, int64_t vocab_start, comm::Comm* group) {
    comm::Comm& comm = *group;
    at::Tensor logits = logits_in.to(at::kFloat);  // [N, v]
    const int64_t v = logits.size(1);
    at::Tensor max = v > 0 ? std::get<0>(logits.max(1)).contiguous()
                           : at::full({logits.size(0)}, -INFINITY, logits.options());
    comm.all_reduce(max, comm::ReduceOp::kMax);
    at::Tensor shifted = logits - max.unsqueeze(1);  // [N, v]
    at::Tensor exp = shifted.exp();
    at::Tensor sum_exp = exp.sum(1).contiguous();  // [N]
    comm.all_reduce(sum_exp, comm::ReduceOp::kSum);
    at::Tensor local_label = labels - vocab_start;
    at::Tensor owned = (local_label >= 0).logical_and(local_label < v);  // [N] bool
    at::Tensor index = local_label.clamp(0, std::max<int64_t>(v - 1, 0)).unsqueeze(1);
    at::Tensor target = v > 0 ? shifted.gather(1, index).squeeze(1) * owned.to(at::kFloat)
                              : at::zeros({logits.size(0)}, logits.options());
    target = target.contiguous();
    comm.all_reduce(target, comm::ReduceOp::kSum);
    // Rows labelled kIgnoreIndex (-100, torch's ignore_index) add nothing, nor get a gradient.
    const at::Tensor kept = (labels != model::kIgnoreIndex).to(at::kFloat);  // [N]
    at::Tensor loss = ((sum_exp.log() - target) * kept).sum();
    ctx->save_for_backward({exp / sum_exp.unsqueeze(1), index, owned, kept});
    ctx->saved_data["dtype"] = static_cast<int64_t>(logits_in.scalar_type());
    return loss;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    at::Tensor grad = saved[0].clone();  // softmax over the full vocab, local columns [N, v]
    if (grad.size(1) > 0) grad.scatter_add_(1, saved[1], -saved[2].to(at::kFloat).unsqueeze(1));
    grad.mul_(saved[3].unsqueeze(1)).mul_(grads[0]);
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    return {grad.to(dtype), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor sequence_chunk(const at::Tensor& x, comm::Comm& comm) {
  const int64_t n = comm.size(), seq = x.size(1);
  TORCH_CHECK(seq % n == 0, "sequence_chunk: sequence length ", seq, " is not a multiple of the ", n, " TP ranks");
  return x.narrow(1, comm.rank() * (seq / n), seq / n);
}

int64_t padded_size(int64_t size, int n) { return (size + n - 1) / n * n; }

at::Tensor padded_chunk(const at::Tensor& full, int64_t dim, int rank, int n) {
  const int64_t size = full.size(dim);
  const int64_t chunk = padded_size(size, n) / n;
  std::vector<int64_t> shape = full.sizes().vec();
  shape[static_cast<size_t>(dim)] = chunk;
  at::Tensor out = at::zeros(shape, full.options());
  const int64_t valid = valid_in_chunk(size, rank, n);
  if (valid > 0) out.narrow(dim, 0, valid).copy_(full.narrow(dim, rank * chunk, valid));
  return out;
}

int64_t valid_in_chunk(int64_t size, int rank, int n) {
  const int64_t chunk = padded_size(size, n) / n;
  return std::max<int64_t>(0, std::min<int64_t>(chunk, size - rank * chunk));
}

at::Tensor all_gather_seq(const at::Tensor& x, comm::Comm& comm) { return AllGatherSeq::apply(x, &comm); }
at::Tensor reduce_scatter_seq(const at::Tensor& x, comm::Comm& comm) {
  return ReduceScatterSeq::apply(x, &comm);
}
at::Tensor all_gather_last_dim(const at::Tensor& x, comm::Comm& comm) {
  return AllGatherLastDim::apply(x, &comm);
}

model::ModuleInputHook make_sequence_gather(comm::Comm& comm) {
  return [&comm](const at::Tensor& x) { return model::LinearOperand(all_gather_seq(x, comm)); };
}

model::ModuleInputHook make_float8_sequence_gather(comm::Comm& comm, float8::CastConfig cast, bool pow2) {
  return [&comm, cast, pow2](const at::Tensor& x) {
    model::QuantizedOperand gathered;
    {
      at::NoGradGuard no_grad;
      // One scale for every rank: the global amax of the sequence shards.
      const float8::Float8Tensor local = float8::to_float8_with_global_amax(
          x.detach(), cast, /*axis_dim=*/-1, pow2,
          [&comm](at::Tensor& amax) { comm.all_reduce(amax, comm::ReduceOp::kMax); });
      gathered = {gather_seq_raw(local.data.view(at::kByte), comm).view(local.data.scalar_type()),
                  local.scale};
    }
    return model::LinearOperand(Float8GatherProxy::apply(x, &comm), std::move(gathered));
  };
}

at::Tensor ColwiseLinear::forward(const model::LinearOperand& input, const model::LinearOperand& weight) {
  if (!input.chunks) return inner_->forward(input, weight);
  std::vector<at::Tensor> outputs;  // [B, S/c, N_local] per chunk, in arrival order
  for (int k = 0; k < input.chunks->count(); ++k) outputs.push_back(inner_->forward(input.chunks->chunk(k), weight));
  return input.chunks->assemble(outputs);
}

at::Tensor RowwiseLinear::forward(const model::LinearOperand& input, const model::LinearOperand& weight) {
  if (async_chunks_ > 0) return chunked_matmul_reduce_scatter(input.hp, weight, *inner_, *comm_, async_chunks_);
  return reduce_scatter_seq(inner_->forward(input, weight), *comm_);
}

VocabParallelOutput::VocabParallelOutput(std::shared_ptr<model::LinearCompute> inner, comm::Comm& comm,
                                         int64_t vocab_size, bool loss_parallel)
    : inner_(std::move(inner)), comm_(&comm), vocab_size_(vocab_size), loss_parallel_(loss_parallel) {}

at::Tensor VocabParallelOutput::forward(const model::LinearOperand& input, const model::LinearOperand& weight) {
  at::Tensor x = all_gather_seq(input.hp, *comm_);      // [B, S, D]
  at::Tensor local = inner_->forward(x, weight);         // [B, S, ceil(V/n)]
  if (loss_parallel_) {
    return local.narrow(-1, 0, valid_in_chunk(vocab_size_, comm_->rank(), comm_->size()));
  }
  return all_gather_last_dim(local, *comm_).narrow(-1, 0, vocab_size_);  // [B, S, V]
}

std::string VocabParallelOutput::describe() const {
  return std::string(loss_parallel_ ? "colwise_loss_parallel(" : "colwise_gather_logits(") +
         inner_->describe() + ")";
}

model::EmbeddingCompute make_vocab_parallel_embedding(comm::Comm& comm, int64_t vocab_size) {
  return [&comm, vocab_size](const at::Tensor& tokens, const at::Tensor& weight) {
    const int64_t chunk = padded_size(vocab_size, comm.size()) / comm.size();
    TORCH_CHECK(weight.size(0) == chunk, "vocab-parallel embedding: local weight has ",
                weight.size(0), " rows, expected ceil(", vocab_size, " / ", comm.size(), ") = ", chunk);
    const int64_t start = comm.rank() * chunk;
    at::Tensor local = tokens - start;
    at::Tensor owned = (local >= 0).logical_and(local < chunk);  // [B, S]
    at::Tensor rows = at::embedding(weight, local.clamp(0, chunk - 1));  // [B, S, D]
    at::Tensor partial = rows * owned.unsqueeze(-1).to(rows.scalar_type());
    return reduce_scatter_seq(partial, comm);  // [B, S/n, D]
  };
}

at::Tensor vocab_parallel_cross_entropy_sum(const at::Tensor& local_logits, const at::Tensor& labels,
                                            int64_t vocab_size, comm::Comm& comm) {
  const int64_t chunk = padded_size(vocab_size, comm.size()) / comm.size();
  TORCH_CHECK(local_logits.dim() == 2 && labels.dim() == 1 && local_logits.size(0) == labels.size(0),
              "vocab_parallel_cross_entropy_sum: need logits [N, v] and labels [N], got ",
              local_logits.sizes(), " and ", labels.sizes());
  return VocabParallelCrossEntropy::apply(local_logits, labels, comm.rank() * chunk, &comm);
}

}  // namespace titan::parallel::tensor_parallel
