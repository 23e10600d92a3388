// model/mtp.h — multi-token prediction (DeepSeek-V3's MTP; torchtitan's MTPDecoder and MTPLoss,
// torchtitan main after 0.2.2): the shifted sequences, a depth's own modules and the loss.
//
// Note [Multi-token prediction]: with ModelArgs::mtp_layers = D, the model runs its blocks as
// always, then D more blocks ("mtp_layers.<k>", each like the last block: its attention, its
// feed-forward kind). Depth k = 1..D at position i reads the token at i + k (the sequence rolled
// left by k) and the previous depth's output at i (depth 0: the last block's output, before the
// final norm):
//   h_k = mtp_norm(block(eh_proj(cat(enorm(embed(tokens rolled by k)), hnorm(h_{k-1} * valid_k)))))
// and predicts the label at i + k (the labels rolled by k) through the shared output projection.
// A rolled position is valid when its source is in the row and, block-causal, in the same
// document (documents[i + k] == documents[i]); an invalid one reads token 0, its h_{k-1} is
// zeroed and its label ignored. The row's length stays the dataloader's: each depth has k fewer
// valid targets than the row (torchtitan's alignment, not the paper's figure). Positions (RoPE)
// stay the row's. The loss sum is
//   CE_sum(main) + mtp_loss_weight / D * sum_k CE_sum(depth k, valid labels only)
// divided, as the main loss alone, by the step's main token count. The model returns the logits
// of every depth stacked on the batch dim, [(1 + D) B, S, V]: the output projection runs once on
// the stacked hidden states (one use of its weight, one GEMM).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>

#include "model/args.h"
#include "model/layers.h"
#include "model/linear.h"

namespace titan::model {

// The label cross entropy skips (torch's ignore_index default).
inline constexpr int64_t kIgnoreIndex = -100;

// `sequence` [B, S] rolled left by `shift` along each row: position i holds sequence[i + shift]
// where that source is valid (See Note [Multi-token prediction]), else `fill`; `valid` [B, S]
// bool says which. `documents` [B, S] (block-causal) or undefined (causal: only the row's end
// is invalid). shift must be in [1, S].
struct RolledSequence {
  at::Tensor values;
  at::Tensor valid;
};
RolledSequence roll_sequence(const at::Tensor& sequence, int64_t shift, const at::Tensor& documents, int64_t fill);

// The cross entropy summed over the labels that are not kIgnoreIndex: logits [N, S, V] (or a
// vocabulary shard of them, under loss parallelism) and labels [N, S].
using CrossEntropySum = std::function<at::Tensor(const at::Tensor& logits, const at::Tensor& labels)>;

// The loss sum of logits [(1 + depths) B, S, V] (the main prediction's rows, then each depth's)
// for labels [B, S] (See Note [Multi-token prediction]): `total` = main + weight x `depths_mean`,
// `depths_mean` the mean over the depths of their cross-entropy sums (undefined with 0 depths,
// when total is ce_sum(logits, labels)).
struct MtpLossSum {
  at::Tensor total;
  at::Tensor depths_mean;
};
MtpLossSum mtp_loss_sum(const at::Tensor& logits, const at::Tensor& labels, const at::Tensor& documents,
                        int64_t depths, double weight, const CrossEntropySum& ce_sum);

// A depth's own modules beside its block's (torchtitan's MTPTransformerBlock), under
// "mtp_layers.<k>": enorm and hnorm [dim], eh_proj [dim, 2 dim], mtp_norm [dim].
struct MtpParts {
  MtpParts(const std::string& path, const ModelArgs& args);
  // x = cat(embedding, previous hidden) [B, S, 2 dim] -> eh_proj(cat(enorm, hnorm)) [B, S, dim].
  at::Tensor fuse(const at::Tensor& x) const;
  void visit_params(const ParamVisitor& visit);

  RMSNorm enorm, hnorm;
  Linear eh_proj;
  RMSNorm mtp_norm;
};

}  // namespace titan::model
