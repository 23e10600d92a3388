// parallel/context_parallel/sequence_shard.h — which positions of the sequence this rank computes.
//
// Note [Sequence split]: the sequence is a dimension the plan may shard. Everything indexed by
// position is split here, in one function, the same way: the input tokens and the labels
// (dim 1 of [b, S]) and the RoPE table (dim 0 of [S, head_dim / 2]), so each token keeps its own
// position whatever rank computes it. Without context parallelism every rank computes the whole
// sequence (the identity); with it, rank i of cp keeps the load-balanced chunks i and 2 cp - 1 - i
// of 2 cp (See Note [Context parallelism] in context_parallel.h), and only attention, which mixes
// positions, exchanges anything; the step and the model do not change. (Sequence parallelism under TP is another matter: it shards activations between the
// blocks' matmuls inside the TP group, and attention still sees every position.)
#pragma once

#include <ATen/core/Tensor.h>

#include "model/transformer.h"

namespace titan::parallel::comm {
class DeviceMesh;
}

namespace titan::parallel::context_parallel {

struct SequenceShard {
  at::Tensor inputs;        // [b, S_local] int64: the tokens this rank computes
  at::Tensor labels;        // [b, S_local] int64: the token each of them predicts
  model::RotaryTable rope;  // cos, sin [S_local, head_dim / 2] float32: those tokens' positions
  // Block-causal models only: [b, S] int64, the document of every position of the WHOLE rows
  // (model/document_attention.h), found before the split because a share cannot count the EOS
  // tokens of the chunks it lacks; context-parallel attention picks its positions from it.
  at::Tensor documents;
};

// This rank's share of one micro-batch (See Note [Sequence split]). inputs, labels: [b, S] int64;
// rope: the model's table of max_seq_len positions; args: whether the model is block-causal and the
// EOS id that ends a document. Throws std::invalid_argument when S exceeds the table.
SequenceShard shard_sequence(const comm::DeviceMesh& mesh, const at::Tensor& inputs, const at::Tensor& labels,
                             const model::ModelArgs& args, const model::RotaryTable& rope);

}  // namespace titan::parallel::context_parallel
