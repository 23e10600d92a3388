// model/document_attention.cpp — see document_attention.h.
#include "model/document_attention.h"

#include <ATen/ops/_flash_attention_backward.h>
#include <ATen/ops/_flash_attention_forward.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/cumsum.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

#include "model/activation_checkpoint_ops.h"
#include "model/attention_blocks.h"

namespace titan::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Note [Variable-length flash attention]: on CUDA, in bfloat16 / float16, every document of the
// batch in ONE kernel call: q, k, v packed as [B*S, heads, hd] (the rows back to back), the
// documents as cumulative offsets into that packing (cu_seqlens, int32 [documents + 1]), causal
// within each document; LibTorch's flash-attention kernels with cumulative sequence lengths, as
// torch.nn.attention.varlen.varlen_attn calls them (grouped-query heads natively, dropout 0, so
// the backward's RNG state is zeros). Forward kept or recomputed as per-op AC's "sdpa" with its
// log-sum-exp, like the CPU kernel. A v of another head size than q's and k's goes in padded to
// theirs and its output comes back sliced (Note [Equal head sizes for LibTorch's flash kernels]
// in model/attention_blocks.h): what is kept and saved is the unpadded out [T, H, v_hd].
struct VarlenFlashAttention : public torch::autograd::Function<VarlenFlashAttention> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& cu_seqlens, int64_t max_len, std::optional<double> scale) {
    auto r = checkpointable_op_multi("sdpa", [&] {
      const EqualHeadOperands e = equal_head_operands(q, k, v, scale);
      auto result = at::_flash_attention_forward(e.q, e.k, e.v, cu_seqlens, cu_seqlens, max_len, max_len, 0.0,
                                                 /*is_causal=*/true, /*return_debug_mask=*/false, e.scale);
      // out [T, H, v_hd], lse
      return std::vector<at::Tensor>{std::get<0>(result).narrow(-1, 0, e.v_head_dim), std::get<1>(result)};
    });
    ctx->save_for_backward({q, k, v, cu_seqlens, r[0], r[1]});
    ctx->saved_data["max_len"] = max_len;
    ctx->saved_data["scale"] = scale;
    return {r[0]};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const int64_t max_len = ctx->saved_data.at("max_len").toInt();
    const EqualHeadOperands e = equal_head_operands(s[0], s[1], s[2], ctx->saved_data.at("scale").toOptional<double>());
    const at::Tensor rng_state = at::zeros({2}, s[0].options().dtype(at::kUInt64));
    const at::Tensor unused = at::empty({0}, s[0].options());
    auto g = at::_flash_attention_backward(pad_head_dim(grads[0].contiguous(), e.head_dim), e.q, e.k, e.v,
                                           pad_head_dim(s[4], e.head_dim), s[5], s[3], s[3], max_len, max_len, 0.0,
                                           /*is_causal=*/true, rng_state, unused, e.scale);
    return {std::get<0>(g).narrow(-1, 0, e.qk_head_dim), std::get<1>(g).narrow(-1, 0, e.qk_head_dim),
            std::get<2>(g).narrow(-1, 0, e.v_head_dim), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Whether the varlen kernel takes these operands (See Note [Variable-length flash attention]).
bool varlen_flash_applies(const at::Tensor& q, const at::Tensor& v) {
  const auto dt = q.scalar_type();
  return q.is_cuda() && (dt == at::kBFloat16 || dt == at::kHalf) && q.size(3) % 8 == 0 && v.size(3) % 8 == 0 &&
         std::max(q.size(3), v.size(3)) <= 256;
}

at::Tensor varlen_flash_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const std::vector<std::vector<DocumentSpan>>& rows, std::optional<double> scale) {
  const int64_t B = q.size(0), H = q.size(1), S = q.size(2), v_hd = v.size(3);
  std::vector<int32_t> offsets{0};
  int64_t max_len = 0;
  for (size_t b = 0; b < rows.size(); ++b)
    for (const DocumentSpan& d : rows[b]) {
      offsets.push_back(static_cast<int32_t>(static_cast<int64_t>(b) * S + d.start + d.length));
      max_len = std::max(max_len, d.length);
    }
  const at::Tensor cu_seqlens = at::tensor(offsets, at::kInt).to(q.device());
  auto pack = [&](const at::Tensor& t) {
    return t.transpose(1, 2).contiguous().view({B * S, t.size(1), t.size(3)});
  };
  const at::Tensor out = VarlenFlashAttention::apply(pack(q), pack(k), pack(v), cu_seqlens, max_len, scale)[0];
  return out.reshape({B, S, H, v_hd}).transpose(1, 2);  // [B, H, S, v_hd]
}

}  // namespace

at::Tensor document_ids(const at::Tensor& tokens, int64_t eos_id) {
  TORCH_CHECK(tokens.dim() == 2, "document_ids: tokens must be [B, S], got ", tokens.sizes());
  const at::Tensor eos = tokens.eq(eos_id).to(at::kLong);
  // Exclusive prefix sum along the row: the EOS tokens strictly before each position.
  at::Tensor ids = at::zeros_like(eos);
  if (tokens.size(1) > 1) ids.narrow(1, 1, tokens.size(1) - 1).copy_(at::cumsum(eos, 1).narrow(1, 0, tokens.size(1) - 1));
  return ids;
}

at::Tensor chunked_documents(const at::Tensor& doc_ids, int64_t chunk) {
  TORCH_CHECK(doc_ids.dim() == 2 && chunk > 0, "chunked_documents: doc_ids must be [B, S] and the chunk positive, got ",
              doc_ids.sizes(), " and ", chunk);
  const int64_t S = doc_ids.size(1), chunks = (S + chunk - 1) / chunk;
  // (document, chunk) numbered in row order: non-decreasing, equal exactly where both are.
  const at::Tensor chunk_of = at::arange(S, doc_ids.options().dtype(at::kLong)).div(chunk, "floor");
  return doc_ids.to(at::kLong) * chunks + chunk_of;
}

std::vector<std::vector<DocumentSpan>> document_spans(const at::Tensor& doc_ids) {
  TORCH_CHECK(doc_ids.dim() == 2, "document_spans: doc_ids must be [B, S], got ", doc_ids.sizes());
  const at::Tensor ids = doc_ids.to(at::kCPU, at::kLong).contiguous();
  const int64_t B = ids.size(0), S = ids.size(1);
  const int64_t* p = ids.data_ptr<int64_t>();
  std::vector<std::vector<DocumentSpan>> rows(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t* row = p + b * S;
    int64_t start = 0;
    for (int64_t s = 1; s <= S; ++s) {
      if (s == S || row[s] != row[start]) {
        TORCH_CHECK(s == S || row[s] > row[start], "document_spans: row ", b, " has document id ", row[s],
                    " after ", row[start], " at position ", s, " (ids must not decrease along a row)");
        rows[static_cast<size_t>(b)].push_back({start, s - start});
        start = s;
      }
    }
  }
  return rows;
}

double attention_work_fraction(const at::Tensor& doc_ids, int64_t window) {
  const std::vector<std::vector<DocumentSpan>> rows = document_spans(doc_ids);
  if (rows.empty() || doc_ids.size(1) == 0) return 1.0;
  const double S = static_cast<double>(doc_ids.size(1)), square = S * (S + 1);
  // 2 x the (query, key) pairs of a document of n positions: n (n + 1) causal; with a window
  // w < n, w (w + 1) for its first w queries and 2 w for each later one.
  auto pairs = [window](int64_t n) {
    const double len = static_cast<double>(n);
    if (window <= 0 || window >= n) return len * (len + 1);
    const double w = static_cast<double>(window);
    return w * (w + 1) + 2 * w * (len - w);
  };
  double sum = 0;
  for (const auto& spans : rows)
    for (const DocumentSpan& d : spans) sum += pairs(d.length) / square;
  return sum / static_cast<double>(rows.size());
}

at::Tensor document_causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const at::Tensor& doc_ids, std::optional<double> scale) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && doc_ids.dim() == 2 && doc_ids.size(0) == q.size(0) &&
                  doc_ids.size(1) == q.size(2) && k.size(2) == q.size(2) && v.size(2) == q.size(2),
              "document_causal_attention: q ", q.sizes(), ", k ", k.sizes(), ", v ", v.sizes(), ", doc_ids ",
              doc_ids.sizes(), " (need q [B, H, S, qk_hd], k [B, KV, S, qk_hd], v [B, KV, S, v_hd], doc_ids [B, S])");
  const std::vector<std::vector<DocumentSpan>> rows = document_spans(doc_ids);
  bool one_document_per_row = true;
  for (const auto& spans : rows) one_document_per_row = one_document_per_row && spans.size() == 1;
  if (one_document_per_row) return attention_op(q, k, v, scale);  // the causal attention itself
  if (varlen_flash_applies(q, v)) return varlen_flash_attention(q, k, v, rows, scale);
  std::vector<at::Tensor> outputs;
  for (size_t b = 0; b < rows.size(); ++b) {
    const int64_t row = static_cast<int64_t>(b);
    std::vector<at::Tensor> documents;
    for (const DocumentSpan& d : rows[b]) {
      auto slice = [&](const at::Tensor& t) { return t.narrow(0, row, 1).narrow(2, d.start, d.length).contiguous(); };
      documents.push_back(attention_op(slice(q), slice(k), slice(v), scale));  // [1, H, len, v_hd]
    }
    outputs.push_back(documents.size() == 1 ? documents[0] : at::cat(documents, 2));
  }
  return at::cat(outputs, 0);
}

}  // namespace titan::model
