// model/deepseek_v3/hf_format.h — DeepSeek-V3's Hugging Face format (see hf_format.cpp).
#pragma once

#include "model/hf_format.h"

namespace titan::model::deepseek_v3 {

// Throws std::invalid_argument (refuse_hugging_face) for the flavors HF's DeepseekV3 cannot hold.
HfFormat hugging_face_format(const ModelArgs& args);

}  // namespace titan::model::deepseek_v3
