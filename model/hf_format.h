// model/hf_format.h — how Hugging Face spells a family's model: its class, its tensor names, the
// tensors it stores in another layout, its config.json. A family declares one
// (Family::hugging_face); trainer/checkpoint/hf_weights.h reads and writes HF folders from it
// alone, so a new family's HF in/out is this declaration and nothing else.
//
// Names are pairs: titan's name <-> HF's. A block's names are what follows the block's path on
// each side ("layers.<i>." in titan, block_folder + "<i>." in HF); a stacked expert weight
// (titan's [E, ...] tensor, "layers.<i>.moe.experts.w1") is E tensors in HF, expert j's after
// block_folder + "<i>." + expert_folder + "<j>.". model/param_path.h builds and parses every
// such numbered name.
//
// Note [HF rotary permutation]: titan's Llama (like Meta's code) rotates interleaved pairs
// (x[2i], x[2i+1]) of each head; HF rotates halves (x[i], x[i + hd/2]). HF's
// convert_llama_weights_to_hf.py therefore permutes the rows of wq and wk within each head:
//   hf = w.view(heads, hd/2, 2, dim).transpose(1, 2).reshape(heads * hd, dim)
// so that q·k (hence the logits) are unchanged. Import applies the inverse. A model that rotates
// halves in titan too (ModelArgs::rope_rotate_half: Qwen3) stores its rows unpermuted.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "model/args.h"

namespace titan::model {

struct HfNamePair {
  std::string titan;
  std::string hf;
};

// An HF tensor name titan refuses, and why (what the user does instead).
struct HfRefusedName {
  std::string hf;
  std::string why;
};

// A block weight whose rows HF holds permuted (Note [HF rotary permutation]): [heads * head_dim, dim].
struct HfRotaryRows {
  std::string titan;  // after "layers.<i>."
  int64_t heads = 0;
  int64_t head_dim = 0;
};

// A config.json entry that must describe titan's model on load: shapes are checked per tensor,
// these change the numerics (or the model) without changing a shape.
struct HfConfigCheck {
  std::string key;    // config.json's key
  nlohmann::json ours;  // titan's value; numbers compare by value, objects key by key
  // titan's name for the value in the error ("" when it is named by `key` as a whole).
  std::string titan_key;
  // What to choose when it differs ("model.name and model.flavor").
  std::string choose;
  // The file's missing or null value is a value (no rope scaling), not an unknown to skip.
  bool absent_is_null = false;
  // Keys of an object `ours` the file may leave out.
  std::vector<std::string> optional_keys;
};

// Stacked expert weights HF keeps as one tensor of every expert (Llama 4's
// "feed_forward.experts.gate_up_proj" [E, D, 2H] and "down_proj" [E, H, D]): each of titan's
// [E, N, K] tensors `titan` transposed to [E, K, N], concatenated along the last dim in order.
struct HfFusedExperts {
  std::string hf;                  // after block_folder + "<i>."
  std::vector<std::string> titan;  // after "layers.<i>.": {"moe.experts.w1", "moe.experts.w3"}
};

struct HfFormat {
  std::string architecture;  // config.json's architectures[0]: "LlamaForCausalLM"
  std::string model_type;    // "llama"
  std::vector<HfNamePair> top_names;    // whole names: "tok_embeddings.weight" <-> "model.embed_tokens.weight"
  std::string block_folder;             // "model.layers."
  std::vector<HfNamePair> block_names;  // after "layers.<i>." <-> after block_folder + "<i>."
  std::string expert_folder;            // after block_folder + "<i>.": "mlp.experts."
  std::vector<HfNamePair> expert_names;  // after "layers.<i>." <-> after ... expert_folder + "<j>."
  std::vector<HfFusedExperts> fused_experts;  // stacked experts HF holds whole, transposed and fused
  // A block's persistent buffers, only where the Hub's checkpoints hold the tensor; HF's format
  // leaves every other buffer out (an import starts it at its initial value).
  std::vector<HfNamePair> block_buffer_names;
  std::vector<HfRotaryRows> rotary_rows;
  // HF tensors titan has no place for: whole names (a tied lm_head), and after block_folder +
  // "<i>." (older exports' rotary buffer).
  std::vector<std::string> ignored_names;
  std::vector<std::string> ignored_block_names;
  // HF tensors of a form titan does not read (after block_folder + "<i>."), each with what to do
  // instead: gpt-oss's MXFP4 experts on the Hub, read dequantized.
  std::vector<HfRefusedName> refused_block_names;
  // Multi-token prediction's depths (model/mtp.h): HF keeps depth k (from 0) as one more block,
  // block_folder + "<n_layers + k>.", with the block's names, these of its own (after that
  // folder), and its own copies of the embedding and the head (mtp_ignored_names: titan's depths
  // share the model's). Empty: the family's HF class has no such blocks (mtp_layers is refused).
  // An import skips the HF depths titan does not train (the Hub's DeepSeek-V3 holds one).
  std::vector<HfNamePair> mtp_names;
  std::vector<std::string> mtp_ignored_names;
  // config.json as written, but for torch_dtype (the export's choice).
  nlohmann::json config;
  std::vector<HfConfigCheck> config_checks;  // in the order they are checked
};

// The check of one model value, config.json's `key` holding titan's `titan_key`, which the
// model's family and flavor set.
inline HfConfigCheck hf_value_check(std::string key, nlohmann::json ours, std::string titan_key) {
  HfConfigCheck check;
  check.key = std::move(key);
  check.ours = std::move(ours);
  check.titan_key = std::move(titan_key);
  check.choose = "model.name and model.flavor";
  return check;
}

// HF's spelling of titan's RoPE scaling (Llama 3.1's, "rope_type": "llama3", which HF's rotary
// code reads for any model), or null when off.
nlohmann::json hf_rope_scaling(const RopeScaling& r);

// The check of config.json's rope_scaling as a whole: no scaling is null (or absent), and older
// configs spell Llama 3.1's without its rope_type.
HfConfigCheck hf_rope_scaling_check(const RopeScaling& r);

// Throws std::invalid_argument: "titan's <family> model has no Hugging Face counterpart: <why>".
[[noreturn]] void refuse_hugging_face(const ModelArgs& args, const std::string& why);

}  // namespace titan::model
