// model/qwen3/family.cpp — Qwen3's dense flavors as torchtitan 0.2.2 defines them
// (torchtitan/models/qwen3/__init__.py): grouped-query attention with head_dim 128 whatever the
// width, an RMSNorm on each head of q and k before RoPE, RoPE over (i, i + hd/2) pairs with theta
// 1e6, an explicit SwiGLU width, RMSNorm eps 1e-6, and the token embedding reused as the output
// projection in the flavors up to 4B; the MoE flavors (debugmodel_moe, 30B-A3B, 235B-A22B) make
// every block's feed-forward a mixture of experts (model/moe/moe.h).
#include <stdexcept>
#include <string>
#include <vector>

#include "model/grouped_query_family.h"

namespace titan::model::qwen3 {
namespace {

ModelArgs qwen3(int64_t dim, int64_t n_layers, int64_t n_heads, int64_t n_kv_heads, int64_t vocab_size,
                int64_t hidden_dim, bool tie_embeddings) {
  ModelArgs a;
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
  if (vocab_size == 151936) a.padded_vocab_size = vocab_size;  // the Hub checkpoints' rows
  return a;
}

// Qwen3-MoE: every block's feed-forward an MoE layer, softmax top 8, route_norm, no shared expert,
// weights after the experts, torchtitan's default load balancing (coefficient 1e-3); untied.
ModelArgs qwen3_moe(ModelArgs a, int64_t num_experts, int64_t moe_hidden_dim) {
  moe::MoEArgs m;
  m.num_experts = num_experts;
  m.num_shared_experts = 0;
  m.top_k = 8;
  m.score_func = "softmax";
  m.route_norm = true;
  m.route_scale = 1.0;
  m.score_before_experts = false;
  a.moe = m;
  a.moe_hidden_dim = moe_hidden_dim;
  return a;
}

ModelArgs small_moe() {
  ModelArgs a = qwen3_moe(qwen3(128, 4, 4, 2, 2048, 384, false), 8, 64);
  a.explicit_head_dim = 32;
  a.moe->top_k = 2;
  return a;
}

// ~100M active parameters (364M in all): 14 layers of width 512, 8 experts of hidden 2048, top 2.
ModelArgs moe_100m_active() {
  ModelArgs a = qwen3_moe(qwen3(512, 14, 4, 2, 2048, 1536, false), 8, 2048);
  a.moe->top_k = 2;
  return a;
}

ModelArgs with_theta(ModelArgs a, double theta) {
  a.rope_theta = theta;
  return a;
}

const std::vector<NamedFlavor>& qwen3_flavor_table() {
  static const std::vector<NamedFlavor> table = {
      {"debugmodel", qwen3(256, 8, 16, 8, 2048, 3072, true)},
      {"0.6B", qwen3(1024, 28, 16, 8, 151936, 3072, true)},
      {"1.7B", qwen3(2048, 28, 16, 8, 151936, 6144, true)},
      {"4B", qwen3(2560, 36, 32, 8, 151936, 9728, true)},
      {"8B", qwen3(4096, 36, 32, 8, 151936, 12288, false)},
      {"14B", qwen3(5120, 40, 40, 8, 151936, 17408, false)},
      {"32B", qwen3(5120, 64, 64, 8, 151936, 25600, false)},
      {"debugmodel_moe", qwen3_moe(qwen3(256, 8, 16, 8, 2048, 3072, false), 64, 768)},
      {"30B-A3B", qwen3_moe(qwen3(2048, 48, 32, 4, 151936, 6144, false), 128, 768)},
      {"235B-A22B", qwen3_moe(with_theta(qwen3(4096, 94, 64, 4, 151936, 12288, false), 5e6), 128, 1536)},
      // Not a torchtitan flavor: debugmodel_moe's routing at a size a 2-core CI machine steps
      // through in a fraction of a second (debugmodel_moe holds 315M parameters): 4 layers of
      // 8 experts of which each token takes 2, head_dim 32.
      {"debugmodel_moe_small", small_moe()},
      // Not a torchtitan flavor either: the MoE benchmark's larger case (scripts/bench_moe.sh), as
      // titan's Llama "100M" is bench_train.sh's.
      {"moe_100M_active", moe_100m_active()},
  };
  return table;
}

}  // namespace

const Family& family() {
  static const GroupedQueryFamily declaration("qwen3", qwen3_flavor_table());
  return declaration;
}

}  // namespace titan::model::qwen3
