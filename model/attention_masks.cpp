// model/attention_masks.cpp — see attention_masks.h.
#include "model/attention_masks.h"

#include <ATen/ops/zeros.h>

#include "model/document_attention.h"
#include "model/family.h"

namespace titan::model {

bool uses_row_documents(const ModelArgs& args) {
  if (args.block_causal) return true;
  const Family& f = family(args.family);
  for (int64_t layer = 0; layer < args.n_layers; ++layer)
    if (f.attention_chunk(args, layer) > 0) return true;
  return false;
}

at::Tensor row_documents(const ModelArgs& args, const at::Tensor& tokens) {
  if (args.block_causal) return document_ids(tokens, args.eos_id);
  if (!uses_row_documents(args)) return {};
  return at::zeros({tokens.size(0), tokens.size(1)}, tokens.options().dtype(at::kLong));
}

double attention_work(const ModelArgs& args, const at::Tensor& tokens) {
  const Family& f = family(args.family);
  bool windows = false;
  for (int64_t layer = 0; layer < args.n_layers; ++layer) windows = windows || f.attention_window(args, layer) > 0;
  at::Tensor documents = row_documents(args, tokens);
  if (!documents.defined() && !windows) return 1.0;
  if (!documents.defined()) documents = at::zeros({tokens.size(0), tokens.size(1)}, tokens.options().dtype(at::kLong));
  const int64_t seq = tokens.size(1);
  double done = 0, square = 0;
  for (int64_t layer = 0; layer < args.n_layers; ++layer) {
    const double flops = f.attention_flops_per_token(args, layer, seq);
    const int64_t chunk = f.attention_chunk(args, layer), window = f.attention_window(args, layer);
    const double fraction = chunk > 0 ? attention_work_fraction(chunked_documents(documents, chunk))
                            : args.block_causal || window > 0 ? attention_work_fraction(documents, window)
                                                              : 1.0;
    done += fraction * flops;
    square += flops;
  }
  return square > 0 ? done / square : 1.0;
}

}  // namespace titan::model
