// model/qwen3/flavors.cpp — Qwen3's dense flavors as torchtitan 0.2.2 defines them
// (torchtitan/models/qwen3/__init__.py): grouped-query attention with head_dim 128 whatever the
// width, an RMSNorm on each head of q and k before RoPE, RoPE over (i, i + hd/2) pairs with theta
// 1e6, an explicit SwiGLU width, RMSNorm eps 1e-6, and the token embedding reused as the output
// projection in the flavors up to 4B. The MoE flavors (debugmodel_moe, 30B-A3B, 235B-A22B) come
// with the MoE blocks (docs/moe.md).
#include <stdexcept>
#include <string>
#include <vector>

#include "model/flavors.h"

namespace titan::model {
namespace {

struct Flavor {
  const char* name;
  ModelArgs args;
};

ModelArgs qwen3(int64_t dim, int64_t n_layers, int64_t n_heads, int64_t n_kv_heads, int64_t vocab_size,
                int64_t hidden_dim, bool tie_embeddings) {
  ModelArgs a;
  a.family = "qwen3";
  a.dim = dim;
  a.n_layers = n_layers;
  a.n_heads = n_heads;
  a.n_kv_heads = n_kv_heads;
  a.vocab_size = vocab_size;
  a.explicit_head_dim = 128;
  a.explicit_hidden_dim = hidden_dim;
  a.norm_eps = 1e-6;
  a.rope_theta = 1e6;
  a.rope_scaling.enabled = false;
  a.qk_norm = true;
  a.rope_rotate_half = true;
  a.tie_embeddings = tie_embeddings;
  a.max_seq_len = 4096;
  return a;
}

const std::vector<Flavor>& flavors() {
  static const std::vector<Flavor> table = {
      {"debugmodel", qwen3(256, 8, 16, 8, 2048, 3072, true)},
      {"0.6B", qwen3(1024, 28, 16, 8, 151936, 3072, true)},
      {"1.7B", qwen3(2048, 28, 16, 8, 151936, 6144, true)},
      {"4B", qwen3(2560, 36, 32, 8, 151936, 9728, true)},
      {"8B", qwen3(4096, 36, 32, 8, 151936, 12288, false)},
      {"14B", qwen3(5120, 40, 40, 8, 151936, 17408, false)},
      {"32B", qwen3(5120, 64, 64, 8, 151936, 25600, false)},
  };
  return table;
}

}  // namespace

std::vector<std::string> qwen3_flavor_names() {
  std::vector<std::string> names;
  for (const auto& f : flavors()) names.emplace_back(f.name);
  return names;
}

ModelArgs qwen3_flavor(const std::string& name) {
  for (const auto& f : flavors())
    if (name == f.name) return f.args;
  std::string valid;
  for (const auto& n : qwen3_flavor_names()) valid += (valid.empty() ? "" : ", ") + n;
  throw std::invalid_argument("unknown qwen3 flavor '" + name + "' (valid: " + valid + ")");
}

}  // namespace titan::model
