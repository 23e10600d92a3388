// model/llama3/family.cpp — Llama 3's flavors as torchtitan 0.2.2 defines them (plus titan's
// CPU-sized and 4-layer benchmark shapes), and its Hugging Face class, LlamaForCausalLM.
#include <stdexcept>
#include <string>
#include <vector>

#include "model/grouped_query_family.h"
#include "model/hf_format.h"

namespace titan::model::llama3 {

namespace {

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
const std::vector<NamedFlavor>& llama3_flavor_table() {
  static const std::vector<NamedFlavor> table = {
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
      // Not a torchtitan flavor: debugmodel's shapes with 16 layers, so that 8 pipeline ranks
      // of two virtual stages each hold a block per stage (the deep pipeline memory checks).
      {"debugmodel_16layers", make_args(256, 16, 16, 0, 2048, 256, 0.0)},
      // torchtitan 0.2.2's block-causal flavors: their base flavor's shapes, attention confined
      // to each document (flex and varlen are torchtitan's two kernels for the same mask).
      {"debugmodel_flex_attn", block_causal(make_args(256, 6, 16, 0, 2048, 256, 0.0))},
      {"debugmodel_varlen_attn", block_causal(make_args(256, 6, 16, 0, 2048, 256, 0.0))},
      {"8B_flex", block_causal(make_args(4096, 32, 32, 8, 128256, 1024, 1.3))},
      {"8B_varlen", block_causal(make_args(4096, 32, 32, 8, 128256, 1024, 1.3))},
  };
  return table;
}

class Llama3Family final : public GroupedQueryFamily {
 public:
  Llama3Family() : GroupedQueryFamily("llama3", llama3_flavor_table()) {}

  HfFormat hugging_face(const ModelArgs& args) const override {
    if (args.qk_norm || args.rope_rotate_half || args.moe)
      refuse_hugging_face(args, "Llama with q/k norms, half rotation or experts");
    HfFormat f = hf_format_of(args, "LlamaForCausalLM", "llama");
    f.config["mlp_bias"] = false;
    return f;
  }
};

}  // namespace

const Family& family() {
  static const Llama3Family declaration;
  return declaration;
}

}  // namespace titan::model::llama3
