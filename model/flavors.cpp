// model/flavors.cpp — see flavors.h.
#include "model/flavors.h"

#include <stdexcept>

#include "model/family.h"

namespace titan::model {

std::vector<std::string> model_names() {
  std::vector<std::string> names;
  for (const Family* f : families()) names.push_back(f->name());
  return names;
}

std::vector<std::string> flavor_names(const std::string& name) {
  std::vector<std::string> names;
  for (const NamedFlavor& f : family(name).flavors()) names.emplace_back(f.name);  // throws for an unknown family
  return names;
}

ModelArgs model_flavor(const std::string& name, const std::string& flavor) {
  const Family& fam = family(name);
  std::string valid;
  for (const NamedFlavor& f : fam.flavors()) {
    if (flavor == f.name) {
      ModelArgs args = f.args;
      args.family = fam.name();
      return args;
    }
    valid += (valid.empty() ? "" : ", ") + std::string(f.name);
  }
  throw std::invalid_argument("model.flavor '" + flavor + "' is not a " + name + " flavor (valid: " + valid + ")");
}

ModelArgs trained_model_args(const std::string& name, const std::string& flavor, int64_t tokenizer_vocab) {
  ModelArgs args = model_flavor(name, flavor);
  args.vocab_size = args.padded_vocab_size >= tokenizer_vocab ? args.padded_vocab_size : tokenizer_vocab;
  return args;
}

}  // namespace titan::model
