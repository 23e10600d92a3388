// trainer/checkpoint/hf_weights.h — Llama weights in Hugging Face's layout (LlamaForCausalLM), in and out.
//
// Names: tok_embeddings.weight <-> model.embed_tokens.weight; layers.<i>.attention.w{q,k,v,o}
// <-> model.layers.<i>.self_attn.{q,k,v,o}_proj; feed_forward.w1/w2/w3 <-> mlp.gate_proj /
// down_proj / up_proj; attention_norm / ffn_norm <-> input_layernorm / post_attention_layernorm;
// norm <-> model.norm; output <-> lm_head.
//
// Note [HF rotary permutation]: titan (like Meta's Llama code) rotates interleaved pairs
// (x[2i], x[2i+1]) of each head; HF's Llama rotates halves (x[i], x[i + hd/2]). HF's
// convert_llama_weights_to_hf.py therefore permutes the rows of wq and wk within each head:
//   hf = w.view(heads, hd/2, 2, dim).transpose(1, 2).reshape(heads * hd, dim)
// so that q·k (hence the logits) are unchanged. Import applies the inverse.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/args.h"

namespace titan::trainer::checkpoint {

// titan fqn -> HF name; throws std::invalid_argument for a name titan's Llama does not have.
std::string hf_name(const std::string& fqn);
// HF name -> titan fqn; "" for names titan has no parameter for (rotary inv_freq buffers).
std::string titan_name_from_hf(const std::string& hf);
// Applies (to_hf) or undoes (from_hf) Note [HF rotary permutation] for wq/wk; others unchanged.
at::Tensor to_hf_layout(const std::string& fqn, const at::Tensor& w, const model::ModelArgs& args);
at::Tensor from_hf_layout(const std::string& fqn, const at::Tensor& w, const model::ModelArgs& args);

// config.json of a LlamaForCausalLM with these shapes.
nlohmann::json hf_config(const model::ModelArgs& args, at::ScalarType dtype);

// Writes a Hugging Face folder: config.json, model.safetensors.index.json and shards of at most
// `max_shard_bytes`, files fsync'd then renamed. `fetch(fqn)` returns each full float32 tensor in
// titan's layout (called once per name, in order; may be a collective on every rank);
// only `writer` writes. Returns the bytes written.
int64_t write_hf_folder(const std::string& dir, const std::vector<std::string>& fqns,
                        const std::vector<std::vector<int64_t>>& shapes, const model::ModelArgs& args,
                        at::ScalarType dtype, const std::function<at::Tensor(const std::string&)>& fetch,
                        bool writer, int64_t max_shard_bytes = int64_t(5) << 30);

// Whether `path` is a Hugging Face checkpoint: a folder with model.safetensors.index.json or
// model.safetensors, or such an index file.
bool is_hf_checkpoint(const std::string& path);
// The HF tensor names of a checkpoint, by the shard file (a name inside the folder) holding them:
// from model.safetensors.index.json, else model.safetensors's header. Errors name the file.
std::map<std::string, std::vector<std::string>> hf_checkpoint_files(const std::string& path);
// Calls `visit(titan fqn, full tensor in titan's layout)` for every weight of an HF checkpoint,
// reading one tensor at a time. Errors name the file and the tensor.
void read_hf_checkpoint(const std::string& path, const model::ModelArgs& args,
                        const std::function<void(const std::string&, const at::Tensor&)>& visit);

}  // namespace titan::trainer::checkpoint
