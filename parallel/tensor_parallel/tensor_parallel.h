// parallel/tensor_parallel/tensor_parallel.h — tensor + sequence parallel building blocks (Megatron-style SP,
// as torchtitan's Llama plan): the autograd collectives, the linear computes, the
// vocab-parallel embedding and cross entropy, and the shard helpers. parallelize.cpp places
// them; this file knows nothing about Llama's names.
//
// Layouts on a TP group of n ranks (rank t):
//   residual stream h:       [B, S/n, D]   sequence-sharded ("Shard(1)")
//   colwise weight [O, I]:   rows  [t*O/n, (t+1)*O/n)    input replicated [B, S, I]
//   rowwise weight [O, I]:   cols  [t*I/n, (t+1)*I/n)    output partial -> reduce-scatter to [B, S/n, O]
//   vocab rows (embedding, output): ceil(V/n) per rank, the last rank's tail zero-padded.
//
// Note [TP autograd pairs]: every collective is an autograd function whose backward is its
// adjoint, so gradients are exact: all-gather(seq) <-> reduce-scatter(seq),
// all-reduce(sum) <-> identity, all-gather(last dim) <-> take the local slice.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>

#include "float8/float8_linear.h"
#include "model/linear.h"
#include "model/transformer.h"
#include "parallel/comm/process_group.h"

namespace titan::parallel::tensor_parallel {

// ceil(size / n) * n: a dimension padded so that n ranks get equal chunks.
int64_t padded_size(int64_t size, int n);
// Chunk `rank` of n of `full` along `dim` after zero-padding that dim to padded_size (a new,
// contiguous tensor of size padded_size / n along dim).
at::Tensor padded_chunk(const at::Tensor& full, int64_t dim, int rank, int n);
// How many of chunk `rank`'s rows along a padded dim are real (not padding): 0 .. size/n.
int64_t valid_in_chunk(int64_t size, int rank, int n);

// Autograd collectives over `comm` (See Note [TP autograd pairs]). The sequence dim is 1.
at::Tensor all_gather_seq(const at::Tensor& x, comm::Comm& comm);       // [B, s, ...] -> [B, n*s, ...]
at::Tensor reduce_scatter_seq(const at::Tensor& x, comm::Comm& comm);   // [B, S, ...] -> [B, S/n, ...]
// This rank's sequence shard of a whole-sequence tensor, as reduce_scatter_seq leaves it (no
// communication): [B, S, ...] -> [B, S/n, ...], chunk `rank`.
at::Tensor sequence_chunk(const at::Tensor& x, comm::Comm& comm);
at::Tensor all_gather_last_dim(const at::Tensor& x, comm::Comm& comm);  // [..., v] -> [..., n*v]

// PrepareModuleInput for attention / feed_forward: all-gathers the sequence shards once.
model::ModuleInputHook make_sequence_gather(comm::Comm& comm);
// The same for a module whose input linears all accept a float8 tensorwise input (See Note
// [Float8 operands from the producer] in float8/float8_linear.h): ONE all_reduce(MAX) of the
// shard's amax, the shard cast with `cast` (the readers' input cast), ONE all-gather of the
// bytes. Returns the gathered float8 input with a storage-less high-precision stand-in, whose
// gradient is reduce-scattered as the high-precision gather's is.
model::ModuleInputHook make_float8_sequence_gather(comm::Comm& comm, float8::CastConfig cast,
                                                   bool round_scales_to_power_of_2);

// Column-parallel: y_local = inner(x, W_local) on a replicated input (gathered by the
// module's prepare_input hook). No communication of its own. An input arriving in sequence
// chunks (async TP, Note [Sequence chunks]) is multiplied chunk by chunk as they arrive.
class ColwiseLinear final : public model::LinearCompute {
 public:
  explicit ColwiseLinear(std::shared_ptr<model::LinearCompute> inner) : inner_(std::move(inner)) {}
  at::Tensor forward(const model::LinearOperand& input, const model::LinearOperand& weight) override;
  std::string describe() const override { return "colwise(" + inner_->describe() + ")"; }
  const std::shared_ptr<model::LinearCompute>* inner() const override { return &inner_; }

 private:
  std::shared_ptr<model::LinearCompute> inner_;
};

// Row-parallel + sequence parallel: partial y = inner(x_local, W_local), reduce-scattered to
// sequence shards [B, S/n, O]. `async_chunks` > 0: chunked and overlapped (Note [Async TP] in
// async_tp.h).
class RowwiseLinear final : public model::LinearCompute {
 public:
  RowwiseLinear(std::shared_ptr<model::LinearCompute> inner, comm::Comm& comm, int async_chunks = 0)
      : inner_(std::move(inner)), comm_(&comm), async_chunks_(async_chunks) {}
  at::Tensor forward(const model::LinearOperand& input, const model::LinearOperand& weight) override;
  std::string describe() const override {
    return (async_chunks_ > 0 ? "rowwise_async(" : "rowwise(") + inner_->describe() + ")";
  }
  const std::shared_ptr<model::LinearCompute>* inner() const override { return &inner_; }

 private:
  std::shared_ptr<model::LinearCompute> inner_;
  comm::Comm* comm_;
  int async_chunks_;
};

// The output projection, column-parallel over the (padded) vocabulary: all-gathers the
// sequence shards of its input, computes local logits [B, S, ceil(V/n)], then either keeps the
// real columns of this rank's vocab shard (loss parallel) or all-gathers the full [B, S, V].
class VocabParallelOutput final : public model::LinearCompute {
 public:
  VocabParallelOutput(std::shared_ptr<model::LinearCompute> inner, comm::Comm& comm, int64_t vocab_size,
                      bool loss_parallel);
  at::Tensor forward(const model::LinearOperand& input, const model::LinearOperand& weight) override;
  std::string describe() const override;
  const std::shared_ptr<model::LinearCompute>* inner() const override { return &inner_; }

 private:
  std::shared_ptr<model::LinearCompute> inner_;
  comm::Comm* comm_;
  int64_t vocab_size_;
  bool loss_parallel_;
};

// Row-parallel (vocab-sharded) embedding: rank t looks up the tokens of its vocab range
// (others give zeros), then the partial sums are reduce-scattered to sequence shards.
model::EmbeddingCompute make_vocab_parallel_embedding(comm::Comm& comm, int64_t vocab_size);

// Sum over tokens of cross entropy, computed on vocab shards (Megatron's vocab-parallel CE):
// the max and the sum of exponentials are all-reduced, never the logits.
// local_logits [N, v_t] (this rank's real vocab columns, any float dtype; computed in
// float32), labels [N] int64 global ids. Returns a float32 scalar (the same on every TP rank).
at::Tensor vocab_parallel_cross_entropy_sum(const at::Tensor& local_logits, const at::Tensor& labels,
                                            int64_t vocab_size, comm::Comm& comm);

}  // namespace titan::parallel::tensor_parallel
