// model/attention_blocks.h — attention of one block of queries against one block of keys, with
// the log-sum-exp that lets partial results be merged: the kernel layer of context parallelism's
// ring attention (parallel/ring_attention.h).
//
// Note [Attention by blocks]: softmax(q k^T / sqrt(hd)) v over keys K = K1 u K2 is the merge of
// the two blocks' results by their log-sum-exps (per query row, in float32):
//   lse = log(exp(lse1) + exp(lse2)),   out = out1 exp(lse1 - lse) + out2 exp(lse2 - lse)
// The backward of one block needs the FINAL out and lse (the flash-attention backward forms
// P = exp(q k^T / sqrt(hd) - lse) and D = rowsum(dout * out) from them), not the block's own; the
// block gradients then add up: dq over blocks, dk/dv over query blocks.
//
// Kernels: on the CPU in bfloat16, titan's attention kernel (model/kernels/attention.h); in
// float32/float16, LibTorch's flash-attention kernel, which returns the log-sum-exp
// (`_scaled_dot_product_flash_attention_for_cpu` and its backward): the same kernels the unsplit
// attention_op uses. On CUDA, in bfloat16/float16 (head_dim a multiple
// of 8, <= 256), LibTorch's CUDA flash-attention kernels (Note [Attention blocks on CUDA] in
// attention_blocks.cpp). Elsewhere (CUDA float32, float64) an explicit softmax in plain ATen
// ops, O(Sq x Sk) memory per block: correct on every device, and the reference the kernels are
// tested against.
#pragma once

#include <ATen/core/Tensor.h>

#include <tuple>

namespace titan::model {

struct AttentionBlockResult {
  at::Tensor out;  // [B, H, Sq, hd] in q's dtype
  at::Tensor lse;  // [B, H, Sq] float32, contiguous
};

// q [B, H, Sq, hd]; k, v [B, KV, Sk, hd] with H a multiple of KV (grouped-query heads are
// repeated here, their gradients summed back in the backward). `causal`: query i sees keys
// 0..i (square blocks only: the diagonal block of a causal sequence).
AttentionBlockResult attention_block_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                             bool causal);

// The gradients of one block given the merged `out` [B, H, Sq, hd] and `lse` [B, H, Sq] of the
// query rows (See Note [Attention by blocks]). Returns dq [B, H, Sq, hd], dk, dv [B, KV, Sk, hd],
// all float32 (the callers accumulate them over blocks).
std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_block_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, bool causal);

// The explicit-softmax forms (the reference of the tests; what non-CPU devices run).
AttentionBlockResult attention_block_forward_math(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                  bool causal);
std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_block_backward_math(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, bool causal);

// Merges a block's (out, lse) into the float32 accumulators `acc_out` [B, H, Sq, hd] and
// `acc_lse` [B, H, Sq] in place (acc_lse starts at -inf, acc_out at 0).
void merge_attention_block(at::Tensor& acc_out, at::Tensor& acc_lse, const AttentionBlockResult& block);

}  // namespace titan::model
