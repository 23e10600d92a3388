// model/gpt_oss/hf_format.h — gpt-oss's Hugging Face format (see hf_format.cpp).
#pragma once

#include "model/hf_format.h"

namespace titan::model::gpt_oss {

// Throws std::invalid_argument (refuse_hugging_face) for a model HF's GptOssForCausalLM would
// compute differently.
HfFormat hugging_face_format(const ModelArgs& args);

}  // namespace titan::model::gpt_oss
