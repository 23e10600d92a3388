// model/sink_attention.h — causal attention with a sliding window and per-head attention sinks
// (gpt-oss's), on titan's block kernels (model/attention_blocks.h), within documents where the
// model is block-causal.
//
// Note [Attention sinks]: a sink is a learned logit s_h per head that joins every query's softmax
// as one more column with no value: p_j = exp(l_j) / (sum_k exp(l_k) + exp(s_h)). With the
// attention's (out, lse) over the real keys that is
//   lse' = logaddexp(lse, s_h),   out' = out exp(lse - lse') = out sigmoid(lse - s_h)
// (torchtitan's gpt-oss rescales FlexAttention's output by sigmoid(lse - sinks)). The backward is
// the flash backward itself fed (dout', out', lse'): P' = exp(l - lse') are the probabilities with
// the sink column, D' = rowsum(dout' out') its delta (the sink column's value is zero, so its dP is
// zero), and dS = P' (dP - D') for the real keys is the exact gradient; the sink's own is
//   ds_h = sum over rows of P'_sink (0 - D') = -sum exp(s_h - lse') rowsum(dout' out').
// So a sink costs one logaddexp per row, and every kernel that takes a given (out, lse) in its
// backward (the CPU kernel, LibTorch's flash kernels, ring attention's merged rows) carries it.
//
// Note [Sliding window]: query at position p sees keys p - window + 1 .. p (torchtitan's
// get_sliding_window_mask_mod: kv <= q and q - kv < window), and-ed with the document mask under
// block-causal attention; a window at least as long as the row is the causal attention. The block
// kernels take the window and visit only the keys a tile of queries can see.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

namespace titan::model {

// q [B, H, S, qk_hd], k [B, KV, S, qk_hd], v [B, KV, S, v_hd] -> [B, H, S, v_hd]: causal
// attention, within the documents of `documents` [B, S] (undefined: each row one document), each
// query seeing at most `window` keys (0: no window), with `sinks` [H] float (undefined: none) as
// Note [Attention sinks]. Differentiable in q, k, v and sinks; per-op AC keeps it as "sdpa".
// `scale`: of q . k, unset 1 / sqrt(qk_hd).
at::Tensor sink_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& documents,
                          int64_t window, const at::Tensor& sinks, std::optional<double> scale = std::nullopt);

// The sinks' terms on an attention's rows (Note [Attention sinks]): lse [B, H, S] float32, sinks
// [H] -> lse' = logaddexp(lse, sinks), and the factor exp(lse - lse') that rescales out.
struct SinkRescale {
  at::Tensor lse;     // lse'
  at::Tensor factor;  // [B, H, S, 1] float32
};
SinkRescale rescale_by_sinks(const at::Tensor& lse, const at::Tensor& sinks);
// ds [H] float32 from the final rows: -sum over (b, s) of exp(sink - lse') rowsum(dout' out').
at::Tensor sinks_gradient(const at::Tensor& grad_out, const at::Tensor& out, const at::Tensor& lse,
                          const at::Tensor& sinks);

}  // namespace titan::model
