// model/llama4/hf_format.h — Llama 4's Hugging Face format (see hf_format.cpp).
#pragma once

#include "model/hf_format.h"

namespace titan::model::llama4 {

// Throws std::invalid_argument (refuse_hugging_face) for a model HF's Llama4ForCausalLM would
// compute differently.
HfFormat hugging_face_format(const ModelArgs& args);

}  // namespace titan::model::llama4
