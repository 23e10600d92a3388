// model/attention_masks.h — which keys each block's attention sees, said by the rows' documents:
// causal over the whole row, within each document (block-causal: model/document_attention.h), and
// for a family that declares chunks (Family::attention_chunk: Llama 4's iRoPE layers) within each
// fixed chunk of the row as well. The documents are those of whole rows, found once per micro-batch
// (before a context-parallel split, which cannot count the EOS tokens of the chunks it lacks), and
// every block gets them; a chunked block cuts them at its chunk (chunked_documents).
#pragma once

#include <ATen/core/Tensor.h>

#include "model/args.h"

namespace titan::model {

// Whether the blocks take the rows' documents as an input: a block-causal model, or one with a
// chunked layer.
bool uses_row_documents(const ModelArgs& args);

// The documents the blocks take for tokens [B, S] (whole rows): document_ids under block-causal
// attention, one document per row where only chunks split the rows, undefined otherwise.
at::Tensor row_documents(const ModelArgs& args, const at::Tensor& tokens);

// The share of attention's FLOPs (the causal square per layer, torchtitan's count) that the masks
// leave for tokens [B, S]: each layer's attention_work_fraction of the documents it runs within,
// weighted by its attention FLOPs; 1 for a causal model without chunks. What the mfu counts.
double attention_work(const ModelArgs& args, const at::Tensor& tokens);

}  // namespace titan::model
