// model/hf_format.cpp — see hf_format.h.
#include "model/hf_format.h"

#include <stdexcept>

#include "model/family.h"

namespace titan::model {

nlohmann::json hf_rope_scaling(const RopeScaling& r) {
  if (!r.enabled) return nullptr;
  return {{"rope_type", "llama3"},
          {"factor", r.factor},
          {"low_freq_factor", r.low_freq_factor},
          {"high_freq_factor", r.high_freq_factor},
          {"original_max_position_embeddings", r.original_max_position_embeddings}};
}

HfConfigCheck hf_rope_scaling_check(const RopeScaling& r) {
  HfConfigCheck scaling;
  scaling.key = "rope_scaling";
  scaling.ours = hf_rope_scaling(r);
  scaling.choose = "model.flavor";
  scaling.absent_is_null = true;
  scaling.optional_keys = {"rope_type"};
  return scaling;
}

void refuse_hugging_face(const ModelArgs& args, const std::string& why) {
  throw std::invalid_argument("titan's " + args.family + " model has no Hugging Face counterpart: " + why);
}

HfFormat Family::hugging_face(const ModelArgs& args) const {
  refuse_hugging_face(args, "the " + name() + " family declares no Hugging Face format");
}

}  // namespace titan::model
