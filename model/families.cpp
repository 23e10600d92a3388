// model/families.cpp — the registry: every family titan trains, one line each. Adding a family
// is its folder (model/<family>/) and its line here (See Note [A family is a declaration]).
#include "model/family.h"

#include <stdexcept>

namespace titan::model {

namespace llama3 { const Family& family(); }  // model/llama3/family.cpp
namespace qwen3 { const Family& family(); }   // model/qwen3/family.cpp

const std::vector<const Family*>& families() {
  static const std::vector<const Family*> all = {&llama3::family(), &qwen3::family()};
  return all;
}

const Family& family(const std::string& name) {
  std::string valid;
  for (const Family* f : families()) {
    if (f->name() == name) return *f;
    valid += (valid.empty() ? "" : ", ") + f->name();
  }
  throw std::invalid_argument("model.name '" + name + "' is not a model family titan trains (valid: " + valid + ")");
}

FeedForwardKind Family::feed_forward(const ModelArgs& args, int64_t) const {
  return args.moe ? FeedForwardKind::kMoE : FeedForwardKind::kDense;
}

}  // namespace titan::model
