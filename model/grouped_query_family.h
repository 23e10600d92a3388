// model/grouped_query_family.h — the declaration that Llama 3 and Qwen3 share (See Note [A family
// is a declaration] in model/family.h): grouped-query attention in every block
// (model/grouped_query_attention.h), a dense or MoE feed-forward in every block, torchtitan's
// Llama init, and Hugging Face's names of its layers. Each such family is this class with its own
// name and flavor table, and its own Hugging Face class (hugging_face, from hf_format_of).
#pragma once

#include <string>
#include <vector>

#include "model/family.h"

namespace titan::model {

class GroupedQueryFamily : public Family {
 public:
  GroupedQueryFamily(std::string name, const std::vector<NamedFlavor>& flavors)
      : name_(std::move(name)), flavors_(flavors) {}

  std::string name() const override { return name_; }
  const std::vector<NamedFlavor>& flavors() const override { return flavors_; }
  std::unique_ptr<AttentionModule> make_attention(const std::string& prefix, const ModelArgs& args,
                                                  int64_t layer) const override;
  int64_t attention_params(const ModelArgs& args, int64_t layer) const override;
  double attention_flops_per_token(const ModelArgs& args, int64_t layer, int64_t seq_len) const override;
  AttentionActivations attention_activations(const ModelArgs& args, int64_t layer,
                                             const AttentionActivationsQuery& where) const override;
  // The heads, and the dense feed-forward's hidden size.
  std::vector<ShardedSize> tp_sharded_sizes(const ModelArgs& args) const override;
  // torchtitan's llama3 scheme (listed in grouped_query_family.cpp).
  InitSpec init_spec(const ModelArgs& args, const std::string& fqn) const override;

 protected:
  // The Hugging Face format every grouped-query family shares (grouped_query_hf_format.cpp):
  // HF's Llama-style names, config.json's common entries and checks; a family's hugging_face
  // adds its own.
  HfFormat hf_format_of(const ModelArgs& args, std::string architecture, std::string model_type) const;

 private:
  std::string name_;
  const std::vector<NamedFlavor>& flavors_;
};

}  // namespace titan::model
