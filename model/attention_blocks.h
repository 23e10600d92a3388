// model/attention_blocks.h — attention of one block of queries against one block of keys, with
// the log-sum-exp that lets partial results be merged: the kernel layer of context parallelism's
// ring attention (parallel/context_parallel/attention.h).
//
// Note [Attention by blocks]: softmax(scale q k^T) v over keys K = K1 u K2 is the merge of
// the two blocks' results by their log-sum-exps (per query row, in float32):
//   lse = log(exp(lse1) + exp(lse2)),   out = out1 exp(lse1 - lse) + out2 exp(lse2 - lse)
// The backward of one block needs the FINAL out and lse (the flash-attention backward forms
// P = exp(scale q k^T - lse) and D = rowsum(dout * out) from them), not the block's own; the
// block gradients then add up: dq over blocks, dk/dv over query blocks. v's head size may differ
// from q's and k's, and the scale is the caller's (See Note [Attention head sizes and scale] in
// model/kernels/attention.h): out is v-wide, lse and the merge do not depend on either.
//
// Kernels: on the CPU in bfloat16, titan's attention kernel (model/kernels/attention.h); in
// float32/float16, LibTorch's flash-attention kernel, which returns the log-sum-exp
// (`_scaled_dot_product_flash_attention_for_cpu` and its backward): the same kernels the unsplit
// attention_op uses. On CUDA, in bfloat16/float16 (head sizes a multiple
// of 8, <= 256), LibTorch's CUDA flash-attention kernels (Note [Attention blocks on CUDA] in
// attention_blocks.cpp). Elsewhere (CUDA float32, float64) an explicit softmax in plain ATen
// ops, O(Sq x Sk) memory per block: correct on every device, and the reference the kernels are
// tested against. LibTorch's flash kernels take one head size for q, k and v: a v of another
// size goes through them padded (Note [Equal head sizes for LibTorch's flash kernels]).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <tuple>

namespace titan::model {

struct AttentionBlockResult {
  at::Tensor out;  // [B, H, Sq, v_hd] in q's dtype
  at::Tensor lse;  // [B, H, Sq] float32, contiguous
};

// Note [Banded attention masks]: a block's mask is three numbers. Query row i of the block sits
// `key_offset` positions after key row 0 (its position minus key 0's: q_start - k_start of the
// two ranges in the sequence), and
//   query i sees key j  iff  (!causal || j <= i + key_offset) && (window == 0 || i + key_offset - j < window)
// So causal, 0, 0 is the causal square (the diagonal block of a causal sequence); !causal, 0, 0
// no mask; causal, window W: a sliding window of W keys, the query's own included (gpt-oss's even
// layers; torchtitan's get_sliding_window_mask_mod, kv_idx <= q_idx && q_idx - kv_idx < W); a ring
// block of context parallelism (parallel/context_parallel/attention.h) passes its ranges'
// offset, and its window masks the part of it too far behind. Shapes need no relation: a causal
// block with Sq != Sk is the formula's (only the old causal square needed Sq == Sk). A query row
// that sees no key at all gets lse = -inf and out = 0, and zero gradients; merge_attention_block
// takes such rows (either side at -inf). Before choosing a kernel the mask is reduced to what it
// masks in this block: a window longer than the farthest pair (Sq - 1 + key_offset < window) is
// none, and a causal mask whose first query already sees the last key (key_offset >= Sk - 1, for
// an offset) is none, so those blocks run today's fastest path with today's bits.
// Which kernel takes which mask:
// - titan's CPU bf16 kernel: any (AttentionDims' window / key_offset; each tile multiplies over
//   only the keys its rows see, Note [CPU attention by query tiles]);
// - LibTorch's CPU flash kernel (float32 / float16, and bf16 where titan's kernel is off): no
//   window and no offset only (causal square or none); any other mask takes the math form (bf16:
//   titan's kernel whenever it can run at all, cpu_attention_kernel_runs);
// - CUDA flash (Note [Attention blocks on CUDA]): its masks align causality bottom-right (query i
//   sees key j <= i + Sk - Sq) and its window as i + Sk - Sq - window_left <= j <= i + Sk - Sq +
//   window_right. So it takes a mask exactly when that is the block's: no mask, or key_offset ==
//   Sk - Sq with causal (window_right 0) and/or a window (window_left = window - 1, window_right
//   unbounded when not causal), and every row sees a key (flash-attention writes +inf, not -inf,
//   as the log-sum-exp of an empty row). Anything else takes the math form;
// - the math form: the mask built from aranges over [Sq, Sk].

// q [B, H, Sq, qk_hd]; k [B, KV, Sk, qk_hd], v [B, KV, Sk, v_hd] with H a multiple of KV
// (grouped-query heads are repeated here, their gradients summed back in the backward).
// `causal`, `window` (>= 0 keys, 0: none), `key_offset`: the mask (See Note [Banded attention
// masks]); causal alone is the diagonal block of a causal sequence. `scale`: of q . k, unset
// 1 / sqrt(qk_hd).
AttentionBlockResult attention_block_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                             bool causal, std::optional<double> scale = std::nullopt,
                                             int64_t window = 0, int64_t key_offset = 0);

// The gradients of one block given the merged `out` [B, H, Sq, v_hd] and `lse` [B, H, Sq] of the
// query rows (See Note [Attention by blocks]; any (out, lse) at all: the backward forms only
// P = exp(scale q k^T - lse) and rowsum(dout * out) from them). The mask as the forward's. Returns
// dq [B, H, Sq, qk_hd], dk [B, KV, Sk, qk_hd], dv [B, KV, Sk, v_hd], all float32 (the callers
// accumulate them over blocks).
std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_block_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, bool causal, std::optional<double> scale = std::nullopt,
    int64_t window = 0, int64_t key_offset = 0);

// The explicit-softmax forms (the reference of the tests; what non-CPU devices run).
AttentionBlockResult attention_block_forward_math(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                  bool causal, std::optional<double> scale = std::nullopt,
                                                  int64_t window = 0, int64_t key_offset = 0);
std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_block_backward_math(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, bool causal, std::optional<double> scale = std::nullopt,
    int64_t window = 0, int64_t key_offset = 0);

// Merges a block's (out, lse) into the float32 accumulators `acc_out` [B, H, Sq, v_hd] and
// `acc_lse` [B, H, Sq] in place (acc_lse starts at -inf, acc_out at 0). Rows at -inf on both
// sides stay at -inf with out 0.
void merge_attention_block(at::Tensor& acc_out, at::Tensor& acc_lse, const AttentionBlockResult& block);

// Note [Equal head sizes for LibTorch's flash kernels]: LibTorch's flash-attention kernels (the
// CPU's _scaled_dot_product_flash_attention_for_cpu, CUDA's _flash_attention_forward and their
// backwards) refuse a v whose head size differs from q's and k's ("Q/K/V should have the same
// head size", checked on LibTorch 2.11). Padding the narrower side with zeros to the wider size
// is exact: zero columns of v give output columns P 0 = 0 (sliced off) and add exact zeros to
// dP = dO v^T; zero columns of q and k add exact zeros to q . k (the scale is then resolved from
// the unpadded qk_hd, as the kernel would take the padded one). The backward pads dO and out with
// the same zeros (rowsum(dO * out) unchanged) and slices dq, dk to qk_hd and dv to v_hd. Only
// unequal sizes pay the copies; equal ones reach the kernels untouched.
struct EqualHeadOperands {
  at::Tensor q, k, v;            // padded to one head size (q, k, v themselves where equal)
  std::optional<double> scale;   // the caller's, resolved where q and k were padded
  int64_t qk_head_dim, v_head_dim;  // the unpadded sizes, to slice the results back
  int64_t head_dim;                 // the common size
};
EqualHeadOperands equal_head_operands(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      std::optional<double> scale);
// `t` with zeros appended along its last dim up to `head_dim` (t itself where already that size).
at::Tensor pad_head_dim(const at::Tensor& t, int64_t head_dim);

}  // namespace titan::model
