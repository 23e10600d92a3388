// model/document_attention.cpp — see document_attention.h.
#include "model/document_attention.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/cumsum.h>
#include <ATen/ops/zeros_like.h>
#include <c10/util/Exception.h>

#include "model/activation_checkpoint_ops.h"

namespace titan::model {

at::Tensor document_ids(const at::Tensor& tokens, int64_t eos_id) {
  TORCH_CHECK(tokens.dim() == 2, "document_ids: tokens must be [B, S], got ", tokens.sizes());
  const at::Tensor eos = tokens.eq(eos_id).to(at::kLong);
  // Exclusive prefix sum along the row: the EOS tokens strictly before each position.
  at::Tensor ids = at::zeros_like(eos);
  if (tokens.size(1) > 1) ids.narrow(1, 1, tokens.size(1) - 1).copy_(at::cumsum(eos, 1).narrow(1, 0, tokens.size(1) - 1));
  return ids;
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

at::Tensor document_causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const at::Tensor& doc_ids) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && doc_ids.dim() == 2 && doc_ids.size(0) == q.size(0) &&
                  doc_ids.size(1) == q.size(2) && k.size(2) == q.size(2),
              "document_causal_attention: q ", q.sizes(), ", k ", k.sizes(), ", doc_ids ", doc_ids.sizes(),
              " (need q [B, H, S, hd], k/v [B, KV, S, hd], doc_ids [B, S])");
  const std::vector<std::vector<DocumentSpan>> rows = document_spans(doc_ids);
  bool one_document_per_row = true;
  for (const auto& spans : rows) one_document_per_row = one_document_per_row && spans.size() == 1;
  if (one_document_per_row) return attention_op(q, k, v);  // the causal attention itself
  std::vector<at::Tensor> outputs;
  for (size_t b = 0; b < rows.size(); ++b) {
    const int64_t row = static_cast<int64_t>(b);
    std::vector<at::Tensor> documents;
    for (const DocumentSpan& d : rows[b]) {
      auto slice = [&](const at::Tensor& t) { return t.narrow(0, row, 1).narrow(2, d.start, d.length).contiguous(); };
      documents.push_back(attention_op(slice(q), slice(k), slice(v)));  // [1, H, len, hd]
    }
    outputs.push_back(documents.size() == 1 ? documents[0] : at::cat(documents, 2));
  }
  return at::cat(outputs, 0);
}

}  // namespace titan::model
