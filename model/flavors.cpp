// model/flavors.cpp — see flavors.h.
#include "model/flavors.h"

#include <stdexcept>

namespace titan::model {

std::vector<std::string> flavor_names_of(const std::vector<NamedFlavor>& table) {
  std::vector<std::string> names;
  for (const auto& f : table) names.emplace_back(f.name);
  return names;
}

ModelArgs find_flavor(const std::vector<NamedFlavor>& table, const std::string& family, const std::string& name) {
  for (const auto& f : table)
    if (name == f.name) return f.args;
  std::string valid;
  for (const auto& n : flavor_names_of(table)) valid += (valid.empty() ? "" : ", ") + n;
  throw std::invalid_argument("unknown " + family + " flavor '" + name + "' (valid: " + valid + ")");
}

const std::vector<std::string>& model_names() {
  static const std::vector<std::string> names = {"llama3", "qwen3"};
  return names;
}

std::vector<std::string> flavor_names(const std::string& name) {
  if (name == "llama3") return llama3_flavor_names();
  if (name == "qwen3") return qwen3_flavor_names();
  std::string valid;
  for (const auto& n : model_names()) valid += (valid.empty() ? "" : ", ") + n;
  throw std::invalid_argument("model.name '" + name + "' is not a model family titan trains (valid: " + valid + ")");
}

ModelArgs model_flavor(const std::string& name, const std::string& flavor) {
  const std::vector<std::string> names = flavor_names(name);  // throws for an unknown family
  for (const auto& f : names)
    if (f == flavor) return name == "qwen3" ? qwen3_flavor(flavor) : llama3_flavor(flavor);
  std::string valid;
  for (const auto& n : names) valid += (valid.empty() ? "" : ", ") + n;
  throw std::invalid_argument("model.flavor '" + flavor + "' is not a " + name + " flavor (valid: " + valid + ")");
}

ModelArgs trained_model_args(const std::string& name, const std::string& flavor, int64_t tokenizer_vocab) {
  ModelArgs args = model_flavor(name, flavor);
  args.vocab_size = args.padded_vocab_size >= tokenizer_vocab ? args.padded_vocab_size : tokenizer_vocab;
  return args;
}

}  // namespace titan::model
