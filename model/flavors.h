// model/flavors.h — looking up a family's flavor by the config's model.name and model.flavor
// (the families and their tables: model/family.h, model/families.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/args.h"

namespace titan::model {

// The families' names, in registry order ("llama3", "qwen3", ...).
std::vector<std::string> model_names();
// The flavors of family `name`; throws std::invalid_argument listing the families.
std::vector<std::string> flavor_names(const std::string& name);
// Family `name`'s flavor `flavor`; throws std::invalid_argument naming model.name / model.flavor
// and listing the valid values.
ModelArgs model_flavor(const std::string& name, const std::string& flavor);
// The flavor as a run trains it: vocab_size = the tokenizer's `tokenizer_vocab`, or the flavor's
// padded_vocab_size when that holds it (so Hugging Face checkpoints load with their shapes).
ModelArgs trained_model_args(const std::string& name, const std::string& flavor, int64_t tokenizer_vocab);

}  // namespace titan::model
