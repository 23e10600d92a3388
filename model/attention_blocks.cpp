// model/attention_blocks.cpp — see attention_blocks.h.
#include "model/attention_blocks.h"

#include <ATen/ops/_flash_attention_backward.h>
#include <ATen/ops/_flash_attention_forward.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_backward.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/exp.h>
#include <ATen/ops/logaddexp.h>
#include <ATen/ops/logsumexp.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/repeat_interleave.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "model/kernels/attention.h"

namespace titan::model {

namespace {

bool cpu_flash(const at::Tensor& q) {
  const auto dt = q.scalar_type();
  return q.device().is_cpu() && (dt == at::kFloat || dt == at::kBFloat16 || dt == at::kHalf);
}

// Note [Attention blocks on CUDA]: in bfloat16 / float16 with head sizes a multiple of 8 up to
// 256, LibTorch's flash-attention kernels (`_flash_attention_forward/_backward`, dense: no
// cumulative lengths), which return the float32 log-sum-exp [B, H, Sq] and whose backward takes
// any (out, lse), so the merged ones of the ring: O(block) memory instead of the explicit
// softmax's O(Sq x Sk). Operands in [B, S, heads, hd]; grouped-query heads natively; dropout 0,
// so the backward's RNG state is zeros (as the document-masked varlen path calls them); a v of
// another head size padded to q's (Note [Equal head sizes for LibTorch's flash kernels]). The
// masks it takes, and how they are passed (is_causal, window_size_left / _right), in Note [Banded
// attention masks] (cuda_flash_takes below). Compiled here, not yet run on a GPU with a window.
bool cuda_flash(const at::Tensor& q, const at::Tensor& v) {
  const auto dt = q.scalar_type();
  const int64_t hd = std::max(q.size(3), v.size(3));
  return q.is_cuda() && (dt == at::kBFloat16 || dt == at::kHalf) && q.size(3) % 8 == 0 && v.size(3) % 8 == 0 &&
         hd <= 256;
}

at::Tensor heads_second_to_third(const at::Tensor& t) { return t.transpose(1, 2).contiguous(); }  // [B, S, H, hd]

// k/v [B, KV, S, hd] -> [B, H, S, hd]: each kv head repeated for its group of query heads.
at::Tensor repeat_kv(const at::Tensor& kv, int64_t heads) {
  return kv.size(1) == heads ? kv : kv.repeat_interleave(heads / kv.size(1), 1);
}

// The gradient of repeat_kv: [B, H, S, hd] -> [B, KV, S, hd], each group's heads summed.
at::Tensor sum_kv_groups(const at::Tensor& grad, int64_t kv_heads) {
  if (grad.size(1) == kv_heads) return grad;
  const auto s = grad.sizes();
  return grad.view({s[0], kv_heads, s[1] / kv_heads, s[2], s[3]}).sum(2);
}

void check_shapes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && v.sizes().slice(0, 3) == k.sizes().slice(0, 3) &&
                  q.size(3) == k.size(3),
              "attention block: q [B, H, Sq, qk_hd], k [B, KV, Sk, qk_hd], v [B, KV, Sk, v_hd] expected, got ",
              q.sizes(), ", ", k.sizes(), ", ", v.sizes());
  TORCH_CHECK(q.size(1) % k.size(1) == 0, "attention block: ", q.size(1), " query heads are not a multiple of ",
              k.size(1), " kv heads");
}

// A block's mask (See Note [Banded attention masks]), reduced to what it masks in this block.
struct BlockMask {
  bool causal;
  int64_t window, key_offset;
};

BlockMask block_mask(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal, int64_t window,
                     int64_t key_offset) {
  check_shapes(q, k, v);
  TORCH_CHECK(window >= 0, "attention block: the window must be >= 0 keys (0: none), got ", window);
  const int64_t sq = q.size(2), sk = k.size(2);
  if (window > 0 && sq - 1 + key_offset < window) window = 0;       // even the farthest pair is inside
  if (causal && key_offset != 0 && key_offset >= sk - 1) causal = false;  // the first query sees the last key
  if (!causal && window == 0) key_offset = 0;                        // no mask: the offset means nothing
  return {causal, window, key_offset};
}

// LibTorch's CPU flash kernel's masks: none, or the causal square.
bool libtorch_cpu_takes(const BlockMask& m, int64_t sq, int64_t sk) {
  return m.window == 0 && (!m.causal || (m.key_offset == 0 && sq == sk));
}

// CUDA flash attention's masks (bottom-right aligned; See Note [Banded attention masks]), where
// every row sees at least one key.
bool cuda_flash_takes(const BlockMask& m, int64_t sq, int64_t sk) {
  if (!m.causal && m.window == 0) return true;
  if (m.key_offset != sk - sq || sk == 0) return false;
  const bool first_row_sees = !m.causal || m.key_offset >= 0;                      // key 0 <= 0 + offset
  const bool last_row_sees = m.window == 0 || sq - 1 + m.key_offset - m.window + 1 < sk;  // its first key exists
  return first_row_sees && last_row_sees;
}
// window_size_left / _right for the CUDA kernels: unset = unbounded.
std::optional<int64_t> window_left(const BlockMask& m) {
  return m.window > 0 ? std::optional<int64_t>(m.window - 1) : std::nullopt;
}
std::optional<int64_t> window_right(const BlockMask& m) {
  return m.window > 0 && m.causal ? std::optional<int64_t>(0) : std::nullopt;
}

// titan's bf16 kernel where it is the faster, and wherever LibTorch's cannot take the mask.
bool titan_kernel_takes(const at::Tensor& q, const at::Tensor& v, bool libtorch_takes) {
  return cpu_attention_kernel_applies(q, v) || (!libtorch_takes && cpu_attention_kernel_runs(q.scalar_type()));
}

// lse with -inf (a row that sees no key) as 0, so exp(s - shift) is exp(-inf) = 0 there, not NaN;
// finite values as they are.
at::Tensor finite_shift(const at::Tensor& lse) { return lse.masked_fill(lse.isneginf(), 0.0); }

at::ScalarType opmath(const at::Tensor& q) { return q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat; }

// Scores [B, H, Sq, Sk] in opmath, -inf where the mask hides the key (See Note [Banded attention
// masks]: from aranges, O(Sq x Sk) as the scores themselves).
at::Tensor scores(const at::Tensor& q, const at::Tensor& k_rep, const BlockMask& m, double scale) {
  at::Tensor s = at::matmul(q.to(opmath(q)), k_rep.to(opmath(q)).transpose(-1, -2)).mul_(scale);
  if (!m.causal && m.window == 0) return s;
  const auto positions = s.options().dtype(at::kLong);
  const at::Tensor i = at::arange(s.size(2), positions).add_(m.key_offset).unsqueeze(1);  // [Sq, 1], key 0 at 0
  const at::Tensor j = at::arange(s.size(3), positions).unsqueeze(0);                     // [1, Sk]
  at::Tensor hidden;  // [Sq, Sk] bool
  if (m.causal) hidden = j.gt(i);
  if (m.window > 0) {
    const at::Tensor too_far = (i - j).ge(m.window);
    hidden = hidden.defined() ? hidden.logical_or(too_far) : too_far;
  }
  return s.masked_fill_(hidden, -std::numeric_limits<double>::infinity());
}

// The gradients from LibTorch's padded kernels back to the unpadded head sizes (See Note [Equal
// head sizes for LibTorch's flash kernels]).
std::tuple<at::Tensor, at::Tensor, at::Tensor> unpad_grads(const EqualHeadOperands& e, const at::Tensor& dq,
                                                           const at::Tensor& dk, const at::Tensor& dv) {
  if (e.qk_head_dim == e.v_head_dim) return {dq, dk, dv};
  return {dq.narrow(-1, 0, e.qk_head_dim), dk.narrow(-1, 0, e.qk_head_dim), dv.narrow(-1, 0, e.v_head_dim)};
}

}  // namespace

at::Tensor pad_head_dim(const at::Tensor& t, int64_t head_dim) {
  const int64_t missing = head_dim - t.size(-1);
  TORCH_CHECK(missing >= 0, "pad_head_dim: ", t.sizes(), " is wider than ", head_dim);
  return missing == 0 ? t : at::constant_pad_nd(t, {0, missing}, 0.0);
}

EqualHeadOperands equal_head_operands(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      std::optional<double> scale) {
  const int64_t qk_hd = q.size(-1), v_hd = v.size(-1), hd = std::max(qk_hd, v_hd);
  if (qk_hd == v_hd) return {q, k, v, scale, qk_hd, v_hd, hd};
  // Wider q/k padded: the kernel's own default would be 1/sqrt of the padded size.
  const std::optional<double> resolved = hd > qk_hd ? std::optional<double>(attention_softmax_scale(qk_hd, scale)) : scale;
  return {pad_head_dim(q, hd), pad_head_dim(k, hd), pad_head_dim(v, hd), resolved, qk_hd, v_hd, hd};
}

AttentionBlockResult attention_block_forward_math(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                  bool causal, std::optional<double> scale, int64_t window,
                                                  int64_t key_offset) {
  const BlockMask m = block_mask(q, k, v, causal, window, key_offset);
  const at::Tensor s = scores(q, repeat_kv(k, q.size(1)), m, attention_softmax_scale(q.size(3), scale));
  const at::Tensor lse = at::logsumexp(s, {-1});  // -inf on a row that sees no key
  const at::Tensor p = at::exp(s - finite_shift(lse).unsqueeze(-1));
  const at::Tensor out = at::matmul(p, repeat_kv(v, q.size(1)).to(opmath(q)));
  return {out.to(q.scalar_type()), lse.to(at::kFloat).contiguous()};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_block_backward_math(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, bool causal, std::optional<double> scale_in, int64_t window,
    int64_t key_offset) {
  const BlockMask m = block_mask(q, k, v, causal, window, key_offset);
  const auto om = opmath(q);
  const double scale = attention_softmax_scale(q.size(3), scale_in);
  const at::Tensor k_rep = repeat_kv(k, q.size(1)).to(om), v_rep = repeat_kv(v, q.size(1)).to(om);
  const at::Tensor p = at::exp(scores(q, k_rep, m, scale) - finite_shift(lse.to(om)).unsqueeze(-1));  // [B, H, Sq, Sk]
  const at::Tensor dout = grad_out.to(om);
  const at::Tensor dp = at::matmul(dout, v_rep.transpose(-1, -2));
  const at::Tensor d = (dout * out.to(om)).sum(-1, /*keepdim=*/true);  // rowsum(dout * out)
  const at::Tensor ds = p * (dp - d);
  const at::Tensor dq = at::matmul(ds, k_rep).mul_(scale);
  const at::Tensor dk = at::matmul(ds.transpose(-1, -2), q.to(om)).mul_(scale);
  const at::Tensor dv = at::matmul(p.transpose(-1, -2), dout);
  const int64_t kv_heads = k.size(1);
  return {dq.to(at::kFloat), sum_kv_groups(dk, kv_heads).to(at::kFloat), sum_kv_groups(dv, kv_heads).to(at::kFloat)};
}

AttentionBlockResult attention_block_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                             bool causal, std::optional<double> scale, int64_t window,
                                             int64_t key_offset) {
  const BlockMask m = block_mask(q, k, v, causal, window, key_offset);
  const int64_t sq = q.size(2), sk = k.size(2);
  if (cuda_flash(q, v) && cuda_flash_takes(m, sq, sk)) {  // See Note [Attention blocks on CUDA]
    const EqualHeadOperands e = equal_head_operands(q, k, v, scale);
    auto r = at::_flash_attention_forward(heads_second_to_third(e.q), heads_second_to_third(e.k),
                                          heads_second_to_third(e.v), std::nullopt, std::nullopt, sq, sk, 0.0,
                                          m.causal, /*return_debug_mask=*/false, e.scale, window_left(m),
                                          window_right(m));
    return {std::get<0>(r).transpose(1, 2).narrow(-1, 0, e.v_head_dim), std::get<1>(r).to(at::kFloat).contiguous()};
  }
  if (!cpu_flash(q)) return attention_block_forward_math(q, k, v, m.causal, scale, m.window, m.key_offset);
  const bool libtorch_takes = libtorch_cpu_takes(m, sq, sk);
  if (titan_kernel_takes(q, v, libtorch_takes)) {  // bf16: grouped-query heads and head sizes as they are
    auto [out, lse] = cpu_attention_forward(q, k, v, m.causal, scale, m.window, m.key_offset);
    return {out, lse};
  }
  if (!libtorch_takes) return attention_block_forward_math(q, k, v, m.causal, scale, m.window, m.key_offset);
  const EqualHeadOperands e = equal_head_operands(q, repeat_kv(k, q.size(1)), repeat_kv(v, q.size(1)), scale);
  auto [out, lse] =
      at::_scaled_dot_product_flash_attention_for_cpu(e.q, e.k, e.v, 0.0, m.causal, /*attn_mask=*/{}, e.scale);
  return {out.narrow(-1, 0, e.v_head_dim), lse.contiguous()};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_block_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, bool causal, std::optional<double> scale, int64_t window,
    int64_t key_offset) {
  const BlockMask m = block_mask(q, k, v, causal, window, key_offset);
  const int64_t sq = q.size(2), sk = k.size(2);
  if (cuda_flash(q, v) && cuda_flash_takes(m, sq, sk)) {  // See Note [Attention blocks on CUDA]
    const EqualHeadOperands e = equal_head_operands(q, k, v, scale);
    const at::Tensor rng_state = at::zeros({2}, q.options().dtype(at::kUInt64));
    const at::Tensor unused = at::empty({0}, q.options());
    auto g = at::_flash_attention_backward(
        heads_second_to_third(pad_head_dim(grad_out.to(q.scalar_type()), e.head_dim)), heads_second_to_third(e.q),
        heads_second_to_third(e.k), heads_second_to_third(e.v),
        heads_second_to_third(pad_head_dim(out.to(q.scalar_type()), e.head_dim)), lse.contiguous(), at::Tensor(),
        at::Tensor(), sq, sk, 0.0, m.causal, rng_state, unused, e.scale, window_left(m), window_right(m));
    auto back = [](const at::Tensor& t) { return t.transpose(1, 2).to(at::kFloat); };
    return unpad_grads(e, back(std::get<0>(g)), back(std::get<1>(g)), back(std::get<2>(g)));
  }
  if (!cpu_flash(q))
    return attention_block_backward_math(grad_out, q, k, v, out, lse, m.causal, scale, m.window, m.key_offset);
  const bool libtorch_takes = libtorch_cpu_takes(m, sq, sk);
  if (titan_kernel_takes(q, v, libtorch_takes))
    return cpu_attention_backward(grad_out, q, k, v, out, lse, m.causal, at::kFloat, scale, m.window, m.key_offset);
  if (!libtorch_takes)
    return attention_block_backward_math(grad_out, q, k, v, out, lse, m.causal, scale, m.window, m.key_offset);
  // Note [Attention gradient as it comes]: LibTorch's CPU flash backward reads grad_out as
  // [B, S, H, hd] (it transposes it and calls .contiguous() on that, as it must for its GEMMs). The
  // gradient that reaches attention is already that layout seen as [B, H, S, hd] (the transpose
  // before the output projection), so it is passed as it comes: a .contiguous() here made it
  // [B, H, S, hd]-dense only for the kernel to copy it back (two copies of the gradient per layer).
  // The kernel then reads the same values at the same strides either way: the same bits.
  const EqualHeadOperands e = equal_head_operands(q, repeat_kv(k, q.size(1)), repeat_kv(v, q.size(1)), scale);
  auto [dq, dk, dv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
      pad_head_dim(grad_out, e.head_dim), e.q, e.k, e.v, pad_head_dim(out, e.head_dim), lse, 0.0, m.causal,
      /*attn_mask=*/{}, e.scale);
  const int64_t kv_heads = k.size(1);
  auto [dq_u, dk_u, dv_u] = unpad_grads(e, dq, dk, dv);
  return {dq_u.to(at::kFloat), sum_kv_groups(dk_u.to(at::kFloat), kv_heads), sum_kv_groups(dv_u.to(at::kFloat), kv_heads)};
}

void merge_attention_block(at::Tensor& acc_out, at::Tensor& acc_lse, const AttentionBlockResult& block) {
  const at::Tensor lse = at::logaddexp(acc_lse, block.lse);
  // Both sides at -inf (a row no key of either reached): weights exp(-inf - 0) = 0, not NaN.
  const at::Tensor shift = finite_shift(lse);
  acc_out.mul_(at::exp(acc_lse - shift).unsqueeze(-1))
      .add_(block.out.to(at::kFloat) * at::exp(block.lse - shift).unsqueeze(-1));
  acc_lse.copy_(lse);
}

}  // namespace titan::model
