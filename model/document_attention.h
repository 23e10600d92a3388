// model/document_attention.h — block-causal ("document-masked") attention: a token attends only
// to the tokens before it in its own document. The kernel layer of torchtitan's
// attn_mask_type = "block_causal" (its debugmodel_flex_attn / _varlen_attn and 8B_flex / _varlen
// flavors; model.attn_mask_type). Transformer::forward finds each row's documents from its tokens and
// every block's attention uses them (docs/document_masking.md).
//
// Note [Documents of a row]: titan packs documents back to back into each training row
// (BOS ... EOS BOS ... EOS). A document is found from the EOS token exactly as torchtitan's
// get_document_mask_mod finds it: the document id of position s is the number of EOS tokens at
// positions < s, so an EOS closes its own document and the token after it opens the next. A row
// with no EOS is one document; a document may start in an earlier row (its tail is simply the
// row's first document). Positions stay global (RoPE is relative: a document's attention does not
// depend on where it sits in the row).
//
// Note [Document-masked attention]: evaluated per document, never as a dense [S, S] mask: each
// document's queries against its own keys, causal, through the same attention_op (CPU flash
// kernel, per-op AC's "sdpa") the causal model uses. The work skipped is every (query, key) pair
// across documents, so a row of n equal documents costs 1/n of the causal square. Each
// document's output is bit for bit what the document alone gives; a batch whose rows are single
// documents is the causal attention itself. On CUDA in bfloat16 / float16 every document of the
// batch goes through one variable-length flash-attention call instead (Note [Variable-length
// flash attention] in document_attention.cpp), tested against this CPU form.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace titan::model {

// tokens [B, S] (any integer dtype) -> document ids [B, S] int64 (See Note [Documents of a row]).
at::Tensor document_ids(const at::Tensor& tokens, int64_t eos_id);

// doc_ids [B, S] split further at every multiple of `chunk` along the row: positions share an id
// exactly when they share a document and a chunk [c chunk, (c + 1) chunk) of the row (Llama 4's
// chunked attention, torchtitan's get_fixed_block_mask_mod and-ed with the document mask). Ids of
// whole rows: under context parallelism each rank's positions are picked from them as from
// document_ids'.
at::Tensor chunked_documents(const at::Tensor& doc_ids, int64_t chunk);

// One document's positions in a row: [start, start + length).
struct DocumentSpan {
  int64_t start = 0;
  int64_t length = 0;
};
// The documents of each row of `doc_ids` [B, S] (non-decreasing along each row), in order.
std::vector<std::vector<DocumentSpan>> document_spans(const at::Tensor& doc_ids);

// The fraction of the causal square's (query, key) pairs that block-causal attention computes over
// the rows of `doc_ids` [B, S]: the mean over rows of sum_d len_d (len_d + 1) / (S (S + 1)); 1 for
// rows of one document. What the mfu scales attention's FLOPs by (See Note [Document-masked
// attention]). `window` > 0: each query sees at most that many keys of its document (a sliding
// window, model/sink_attention.h).
double attention_work_fraction(const at::Tensor& doc_ids, int64_t window = 0);

// q [B, H, S, qk_hd], k [B, KV, S, qk_hd], v [B, KV, S, v_hd], doc_ids [B, S] -> [B, H, S, v_hd]:
// causal attention within each document of each row (See Note [Document-masked attention]);
// differentiable. `scale` of q . k, unset 1 / sqrt(qk_hd) (See Note [Attention head sizes and
// scale] in model/kernels/attention.h).
at::Tensor document_causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const at::Tensor& doc_ids, std::optional<double> scale = std::nullopt);

}  // namespace titan::model
