// model/args.h — a model's shapes (ModelArgs, what a family's flavor sets: model/flavors.h),
// parameter counts and FLOPs per token, all computed from the arguments alone (no tensor is
// allocated, so the 405B numbers answer instantly).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/moe/moe_args.h"

namespace titan::model {

// Llama 3.1's RoPE frequency scaling (Meta's `apply_scaling`, torchtitan's RoPEScalingArgs):
// with wavelength w_i = 2 pi / f_i of each rotary frequency f_i = theta^(-2i / head_dim),
//   w_i < L / high_freq_factor            f_i unchanged            (high frequencies)
//   w_i > L / low_freq_factor             f_i / factor             (low frequencies)
//   otherwise, s = (L / w_i - low) / (high - low):  (1 - s) f_i / factor + s f_i
// where L = original_max_position_embeddings. torchtitan (v0.2.0 on) applies it to every
// Llama 3 flavor with these defaults.
struct RopeScaling {
  bool enabled = false;
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;

  // The scaled frequency of one unscaled frequency `freq` (identity when not enabled).
  double scale(double freq) const;
};

// What one family adds to the shared arguments (DeepSeek-V3's latent-attention ranks and head
// sizes, its YaRN terms): a struct of the family's own folder deriving from this, carried by
// ModelArgs::family_args and read back by that family's code alone (ModelArgs::family_args_as).
struct FamilyArgs {
  virtual ~FamilyArgs() = default;
};

struct ModelArgs {
  int64_t dim = 4096;
  int64_t n_layers = 32;
  int64_t n_heads = 32;
  int64_t n_kv_heads = 0;            // 0 = n_heads (plain multi-head attention)
  int64_t vocab_size = 128256;       // replaced by the tokenizer's size at training time (trained_model_args)
  // > 0: the embedding rows of the family's published checkpoints, which pad the tokenizer's
  // vocabulary (Qwen3: 151,669 tokens in 151,936 rows); a tokenizer that fits keeps these rows.
  int64_t padded_vocab_size = 0;
  int64_t multiple_of = 256;         // SwiGLU hidden size is rounded up to a multiple of this
  double ffn_dim_multiplier = 0.0;   // 0 = none
  double norm_eps = 1e-5;
  double rope_theta = 500000.0;
  RopeScaling rope_scaling;          // on for torchtitan's flavors (Llama 3.1 scaling)
  int64_t max_seq_len = 2048;        // RoPE table length; set to training.seq_len
  bool depth_init = true;            // wo/w2/w3 std 0.02/sqrt(2(layer_id+1)) instead of /sqrt(2 n_layers)
  // torchtitan's attn_mask_type "block_causal": a token attends only within its own document
  // (model/document_attention.h, Note [Documents of a row]); false = "causal" over the whole row.
  bool block_causal = false;
  int64_t eos_id = -1;               // the tokenizer's EOS (set at training time), which ends a document

  // What the Qwen3 family changes (torchtitan's Qwen3ModelArgs); Llama 3 leaves them all unset.
  std::string family = "llama3";    // model.name of the flavor
  int64_t explicit_head_dim = 0;    // 0: dim / n_heads; Qwen3 sets it (128 for every flavor)
  int64_t explicit_hidden_dim = 0;  // 0: Llama 3's rounding of 8 dim / 3 (ffn_hidden_dim); Qwen3 sets it
  bool qk_norm = false;             // an RMSNorm over each head of q and of k, before RoPE
  bool rope_rotate_half = false;    // RoPE rotates the pairs (i, i + hd/2) (HF / Qwen3), not (2i, 2i+1)
  bool tie_embeddings = false;      // the output projection is the token embedding (output.weight)
  // Mixture of experts (Qwen3-MoE): every block's feed-forward is an MoE layer of these
  // arguments whose experts are SwiGLUs of moe_hidden_dim (torchtitan's moe_inter_dim).
  std::optional<moe::MoEArgs> moe;
  int64_t moe_hidden_dim = 0;
  // Multi-token prediction (DeepSeek-V3's MTP, torchtitan's MTPDecoder; model/mtp.h): after the
  // last block, depth k = 1..mtp_layers predicts token t + k + 1 at position t through a block
  // of its own; its cross entropy enters the loss weighted mtp_loss_weight / mtp_layers.
  int64_t mtp_layers = 0;
  double mtp_loss_weight = 0.3;

  // The family's own arguments (none for Llama 3 and Qwen3, which the fields above describe).
  std::shared_ptr<const FamilyArgs> family_args;
  // family_args as the family's type; throws std::logic_error when they are not of that type.
  template <class T>
  const T& family_args_as() const {
    const T* args = dynamic_cast<const T*>(family_args.get());
    if (!args) throw std::logic_error("model family '" + family + "': its arguments are missing or of another family");
    return *args;
  }

  int64_t kv_heads() const { return n_kv_heads > 0 ? n_kv_heads : n_heads; }
  int64_t head_dim() const { return explicit_head_dim > 0 ? explicit_head_dim : dim / n_heads; }
  // explicit_hidden_dim, else multiple_of * ceil(int(ffn_dim_multiplier * int(8 * dim / 3)) /
  // multiple_of), as Meta's code.
  int64_t ffn_hidden_dim() const;
};

struct ParamCount {  // multi-token prediction's blocks count in total and active, not in per_block
  int64_t total = 0;
  int64_t embedding = 0;  // tok_embeddings only (an untied output projection is counted in total)
  std::vector<int64_t> per_block;  // each block's parameters, layer by layer
  std::vector<int64_t> per_block_active;  // each block's active parameters (a token's experts only)
  int64_t per_layer = 0;           // the largest block's (every block's, where the blocks are alike)
  // The parameters one token uses: all but the experts a token is not routed to (top_k of
  // num_experts per MoE layer); = total for a dense model. What FLOPs per token count.
  int64_t active = 0;
};
ParamCount count_params(const ModelArgs& args);

// The counts come from the family's declaration (model/family.h): its attention's parameters and
// each block's feed-forward kind.
//
// Training FLOPs per token (forward + backward), torchtitan's formula:
//   6 * (active params - embedding params) + the attention's score and value products
//   (for grouped-query attention 12 * n_layers * n_heads * head_dim * seq_len)
// (active: an MoE layer's experts count top_k / num_experts, torchtitan's MoE formula)
// The first term is the 2 (fwd) + 4 (bwd) FLOPs per weight per token of every matmul; the second
// is the attention score and value products, which depend on the sequence length.
double flops_per_token(const ModelArgs& args, int64_t seq_len);
// Its second term alone: what attention costs per token when every query meets seq_len keys (the
// full square, torchtitan's convention). Block-causal runs scale it by the fraction of the causal
// square they compute (attention_work_fraction in model/document_attention.h).
double attention_flops_per_token(const ModelArgs& args, int64_t seq_len);

}  // namespace titan::model
