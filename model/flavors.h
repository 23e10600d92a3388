// model/flavors.h — the model families titan trains (model.name) and their flavors
// (model.flavor): each family's table lives in its folder (model/llama3/, model/qwen3/); the
// Transformer they build is shared (model/transformer.h).
#pragma once

#include <string>
#include <vector>

#include "model/args.h"

namespace titan::model {

// One family's table: a flavor's name and its arguments.
struct NamedFlavor {
  const char* name;
  ModelArgs args;
};
// The names of `table`, in order; `family`'s flavor `name` from `table`, or std::invalid_argument
// naming the family and listing the valid names (the one lookup every family's table uses).
std::vector<std::string> flavor_names_of(const std::vector<NamedFlavor>& table);
ModelArgs find_flavor(const std::vector<NamedFlavor>& table, const std::string& family, const std::string& name);

// "llama3", "qwen3".
const std::vector<std::string>& model_names();
// The flavors of family `name`; throws std::invalid_argument listing the families.
std::vector<std::string> flavor_names(const std::string& name);
// Family `name`'s flavor `flavor`; throws std::invalid_argument naming model.name / model.flavor
// and listing the valid values.
ModelArgs model_flavor(const std::string& name, const std::string& flavor);
// The flavor as a run trains it: vocab_size = the tokenizer's `tokenizer_vocab`, or the flavor's
// padded_vocab_size when that holds it (so Hugging Face checkpoints load with their shapes).
ModelArgs trained_model_args(const std::string& name, const std::string& flavor, int64_t tokenizer_vocab);

// Llama 3 (model/llama3/flavors.cpp): "debugmodel", "8B", "70B", "405B", ... Throws
// std::invalid_argument listing the valid names.
ModelArgs llama3_flavor(const std::string& name);
std::vector<std::string> llama3_flavor_names();

// Qwen3 (model/qwen3/flavors.cpp): torchtitan 0.2.2's flavors, dense "debugmodel", "0.6B" ... "32B"
// and MoE "debugmodel_moe", "30B-A3B", "235B-A22B".
ModelArgs qwen3_flavor(const std::string& name);
std::vector<std::string> qwen3_flavor_names();

}  // namespace titan::model
