// trainer/checkpoint/hf_weights.h — weights in Hugging Face's layout, in and out, for any family
// that declares its Hugging Face format (Family::hugging_face, model/hf_format.h): the names,
// the rows stored permuted (Note [HF rotary permutation]), config.json and what of it must match
// on load all come from that declaration; this file knows none of them.
//
// A titan stacked expert weight ([E, ...]) is E tensors in HF, expert j's being row j, or, where
// the format fuses them (HfFormat::fused_experts: Llama 4), part of one [E, ...] tensor. A
// persistent buffer (the load-balancing layers.<i>.moe.expert_bias) goes out and in, in float32,
// where the family's format has a tensor for it (hf_buffer_name); where it has none, an export
// leaves the buffer out and an import starts it at zero.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "model/args.h"

namespace titan::trainer::checkpoint {

// The HF tensors of titan parameter `fqn`: one name, or for a stacked expert weight one per
// expert (element j: expert j, row j of the [E, ...] tensor). Throws std::invalid_argument for a
// parameter HF's model of this family does not have.
std::vector<std::string> hf_names(const std::string& fqn, const model::ModelArgs& args);
// The HF tensor of titan buffer `fqn` ("layers.<i>.moe.expert_bias") in the family's Hub format,
// or none where the format has no place for it, or HF has no counterpart of the model. hf_names
// answers it too for such a buffer, and titan_slot_from_hf maps it back.
std::optional<std::string> hf_buffer_name(const std::string& fqn, const model::ModelArgs& args);

// Where an HF tensor goes in titan.
struct TitanSlot {
  std::string fqn;      // "" for a tensor titan has no parameter for (rotary inv_freq, a tied lm_head)
  int64_t expert = -1;  // >= 0: row `expert` of the stacked [E, ...] parameter `fqn`
};
// Throws std::invalid_argument for a name titan does not know, or an expert beyond titan's E.
TitanSlot titan_slot_from_hf(const std::string& hf, const model::ModelArgs& args);

// Applies (to_hf) or undoes (from_hf) Note [HF rotary permutation] for the weights the format
// stores permuted; every other tensor unchanged.
at::Tensor to_hf_layout(const std::string& fqn, const at::Tensor& w, const model::ModelArgs& args);
at::Tensor from_hf_layout(const std::string& fqn, const at::Tensor& w, const model::ModelArgs& args);

// HF's architecture and model_type for titan's model (config.json's class and type). Throws
// std::invalid_argument, saying what, for a model HF's class would compute differently (e.g.
// shared experts); so does every function here that takes the model's args, but hf_buffer_name.
std::pair<std::string, std::string> hf_architecture(const model::ModelArgs& args);

// config.json of hf_architecture(args) with these shapes.
nlohmann::json hf_config(const model::ModelArgs& args, at::ScalarType dtype);

// Writes a Hugging Face folder: config.json, model.safetensors.index.json and shards of at most
// `max_shard_bytes`, files fsync'd then renamed. `fetch(fqn)` returns each full float32 tensor in
// titan's layout (called once per name, in order; may be a collective on every rank);
// only `writer` writes. A stacked expert weight is written as its E experts' tensors, in one
// shard. Returns the bytes written.
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
// reading one tensor at a time; the E experts of a stacked weight are kept until the last one
// is read, then stacked. Errors name the file and the tensor (a missing expert: its HF name).
void read_hf_checkpoint(const std::string& path, const model::ModelArgs& args,
                        const std::function<void(const std::string&, const at::Tensor&)>& visit);

}  // namespace titan::trainer::checkpoint
