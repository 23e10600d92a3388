#include "model/args.h"

#include <cmath>
#include <stdexcept>

namespace titan::model {

double RopeScaling::scale(double freq) const {
  if (!enabled) return freq;
  const double wavelen = 2 * M_PI / freq;
  const double high_freq_wavelen = original_max_position_embeddings / high_freq_factor;
  const double low_freq_wavelen = original_max_position_embeddings / low_freq_factor;
  if (wavelen < high_freq_wavelen) return freq;
  if (wavelen > low_freq_wavelen) return freq / factor;
  const double smooth = (original_max_position_embeddings / wavelen - low_freq_factor) /
                        (high_freq_factor - low_freq_factor);
  return (1 - smooth) * freq / factor + smooth * freq;
}

int64_t ModelArgs::ffn_hidden_dim() const {
  int64_t hidden = 4 * dim;
  hidden = static_cast<int64_t>(2 * hidden / 3);
  if (ffn_dim_multiplier > 0) hidden = static_cast<int64_t>(ffn_dim_multiplier * hidden);
  return multiple_of * ((hidden + multiple_of - 1) / multiple_of);
}

namespace {

struct Flavor {
  const char* name;
  ModelArgs args;
};

ModelArgs make_args(int64_t dim, int64_t n_layers, int64_t n_heads, int64_t n_kv_heads,
                    int64_t vocab_size, int64_t multiple_of, double ffn_dim_multiplier,
                    bool rope_scaling = true) {
  ModelArgs a;
  a.rope_scaling.enabled = rope_scaling;
  a.dim = dim;
  a.n_layers = n_layers;
  a.n_heads = n_heads;
  a.n_kv_heads = n_kv_heads;
  a.vocab_size = vocab_size;
  a.multiple_of = multiple_of;
  a.ffn_dim_multiplier = ffn_dim_multiplier;
  return a;
}

ModelArgs block_causal(ModelArgs a) {
  a.block_causal = true;
  return a;
}

// torchtitan's llama3 flavors (torchtitan/models/llama3/__init__.py), with their sizes.
const std::vector<Flavor>& flavors() {
  static const std::vector<Flavor> table = {
      {"debugmodel", make_args(256, 6, 16, 0, 2048, 256, 0.0)},
      {"8B", make_args(4096, 32, 32, 8, 128256, 1024, 1.3)},
      {"70B", make_args(8192, 80, 64, 8, 128256, 4096, 1.3)},
      {"405B", make_args(16384, 126, 128, 8, 128256, 4096, 1.2)},
      // Not a torchtitan flavor: a ~100M-parameter model (99M without embeddings) for CPU
      // benchmarks and memory-estimate checks at a size a 2-core machine can step through.
      {"100M", make_args(768, 14, 12, 0, 128256, 256, 0.0, /*rope_scaling=*/false)},
      // Not a torchtitan flavor: 8B's layer shapes (and vocabulary) with 4 of its 32 layers, so
      // that single-GPU training (float32 master weights + AdamW: 16 bytes per parameter) of
      // 8B-shaped GEMMs fits one 80 GB GPU; scripts/gpu_check.sh measures tokens/s and MFU on it.
      {"8B_4layers", make_args(4096, 4, 32, 8, 128256, 1024, 1.3)},
      // torchtitan 0.2.2's block-causal flavors: their base flavor's shapes, attention confined
      // to each document (flex and varlen are torchtitan's two kernels for the same mask).
      {"debugmodel_flex_attn", block_causal(make_args(256, 6, 16, 0, 2048, 256, 0.0))},
      {"debugmodel_varlen_attn", block_causal(make_args(256, 6, 16, 0, 2048, 256, 0.0))},
      {"8B_flex", block_causal(make_args(4096, 32, 32, 8, 128256, 1024, 1.3))},
      {"8B_varlen", block_causal(make_args(4096, 32, 32, 8, 128256, 1024, 1.3))},
  };
  return table;
}

}  // namespace

std::vector<std::string> llama3_flavor_names() {
  std::vector<std::string> names;
  for (const auto& f : flavors()) names.emplace_back(f.name);
  return names;
}

ModelArgs llama3_flavor(const std::string& name) {
  for (const auto& f : flavors())
    if (name == f.name) return f.args;
  std::string valid;
  for (const auto& n : llama3_flavor_names()) valid += (valid.empty() ? "" : ", ") + n;
  throw std::invalid_argument("unknown llama3 flavor '" + name + "' (valid: " + valid + ")");
}

ParamCount count_params(const ModelArgs& a) {
  const int64_t head_dim = a.head_dim();
  const int64_t attention = a.dim * a.n_heads * head_dim        // wq
                            + 2 * a.dim * a.kv_heads() * head_dim  // wk, wv
                            + a.n_heads * head_dim * a.dim;      // wo
  const int64_t feed_forward = 3 * a.dim * a.ffn_hidden_dim();   // w1, w2, w3
  const int64_t norms = 2 * a.dim;                               // attention_norm, ffn_norm
  ParamCount count;
  count.per_layer = attention + feed_forward + norms;
  count.embedding = a.vocab_size * a.dim;
  count.total = count.embedding + a.n_layers * count.per_layer + a.dim /* norm */ +
                a.vocab_size * a.dim /* output */;
  return count;
}

double attention_flops_per_token(const ModelArgs& a, int64_t seq_len) {
  return 12.0 * static_cast<double>(a.n_layers) * a.n_heads * a.head_dim() * seq_len;
}

double flops_per_token(const ModelArgs& a, int64_t seq_len) {
  const ParamCount c = count_params(a);
  return 6.0 * static_cast<double>(c.total - c.embedding) + attention_flops_per_token(a, seq_len);
}

}  // namespace titan::model
