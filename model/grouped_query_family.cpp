// model/grouped_query_family.cpp — see grouped_query_family.h.
#include "model/grouped_query_family.h"

#include <c10/util/Exception.h>

#include <cmath>

#include "model/grouped_query_attention.h"
#include "model/param_path.h"

namespace titan::model {

std::unique_ptr<AttentionModule> GroupedQueryFamily::make_attention(const std::string& prefix, const ModelArgs& args,
                                                                    int64_t) const {
  return std::make_unique<GroupedQueryAttention>(prefix, args);
}

int64_t GroupedQueryFamily::attention_params(const ModelArgs& args, int64_t) const {
  return GroupedQueryAttention::param_count(args);
}

double GroupedQueryFamily::attention_flops_per_token(const ModelArgs& args, int64_t, int64_t seq_len) const {
  return GroupedQueryAttention::score_flops_per_token(args, seq_len);
}

AttentionActivations GroupedQueryFamily::attention_activations(const ModelArgs& args, int64_t,
                                                              const AttentionActivationsQuery& where) const {
  return GroupedQueryAttention::activations(args, where);
}

std::vector<ShardedSize> GroupedQueryFamily::tp_sharded_sizes(const ModelArgs& args) const {
  std::vector<ShardedSize> sizes = GroupedQueryAttention::tp_sharded_sizes(args);
  sizes.push_back({"the feed-forward hidden dim", args.ffn_hidden_dim()});
  return sizes;
}

InitSpec GroupedQueryFamily::init_spec(const ModelArgs& args, const std::string& fqn) const {
  return decoder_init_spec(args, fqn);
}

InitSpec decoder_init_spec(const ModelArgs& args, const std::string& fqn) {
  const auto ends_with = [&](const char* suffix) {
    const std::string s(suffix);
    return fqn.size() >= s.size() && fqn.compare(fqn.size() - s.size(), s.size(), s) == 0;
  };
  InitSpec spec;
  if (fqn == "tok_embeddings.weight" && !args.tie_embeddings) {
    spec.std = 1.0;  // normal_(0, 1), untruncated
  } else if (fqn == "output.weight" || fqn == "tok_embeddings.weight") {
    // A tied embedding is the output projection: torchtitan's Qwen3 draws it as the output last.
    // trunc_normal_(std = dim^-1/2, a = -3 std, b = 3 std)
    spec.std = 1.0 / std::sqrt(static_cast<double>(args.dim));
    spec.lo = -3 * spec.std;
    spec.hi = 3 * spec.std;
  } else if (ends_with("norm.weight")) {
    spec.ones = true;
  } else {
    // "layers.<id>.<module>.<name>.weight": trunc_normal_(std, a = -2, b = 2), torch's default
    // absolute bounds; std 0.02, depth-scaled for the projections that feed the residual. A
    // multi-token prediction block ("mtp_layers.<k>") is drawn as the last block (torchtitan
    // copies that block's config, inits included); its eh_proj as a block's input projection
    // (0.02: torchtitan main leaves it to nn.Linear's default, a uniform of bound
    // (2 dim)^-1/2 = 0.044 for DeepSeek-V3's debug dim, which titan's counter-based filler has not).
    const std::optional<LayerPath> block = parse_layer_path(fqn);
    const bool mtp = !block && parse_layer_path(fqn, kMtpLayersPrefix);
    TORCH_CHECK(block || mtp, "init: '", fqn,
                "' is neither a block's parameter (layers.<i>.<...>, mtp_layers.<k>.<...>) nor one of the top level's");
    const int64_t layer_id = mtp ? args.n_layers - 1 : block->layer;
    const double depth_std =
        0.02 / std::sqrt(2.0 * (args.depth_init ? layer_id + 1 : args.n_layers));
    // MoE (torchtitan's MoE.init_weights): the router gate and the experts' w2 / w3 (stacked
    // weights, no ".weight") at the depth std, w1 at 0.02; shared experts as a FeedForward.
    const bool depth_scaled = ends_with("wo.weight") || ends_with("w2.weight") ||
                              ends_with("w3.weight") || ends_with("experts.w2") || ends_with("experts.w3") ||
                              ends_with("router.gate.weight");
    spec.std = depth_scaled ? depth_std : 0.02;
    spec.lo = -2.0;
    spec.hi = 2.0;
  }
  return spec;
}

}  // namespace titan::model
