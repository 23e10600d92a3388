// model/attention_module.h — what every family's attention is to the rest of titan: a module
// with a forward, its parameters, its linears and its tensor-parallel plan, and the two hooks
// parallel/ installs (the input gathered once under sequence parallelism, the scaled-dot-product
// part computed across context-parallel ranks). Grouped-query attention (Llama 3, Qwen3) is one
// (model/grouped_query_attention.h); a family with another attention adds its own class.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "model/layers.h"

namespace titan::model {

class AttentionModule {
 public:
  explicit AttentionModule(std::string prefix) : prefix(std::move(prefix)) {}
  virtual ~AttentionModule() = default;
  AttentionModule(const AttentionModule&) = delete;
  AttentionModule& operator=(const AttentionModule&) = delete;

  // x [B, S, D] -> [B, S, D]. `rope`: the positions' rotary table rows; `documents` [B, S_row]
  // int64 (defined under block-causal attention): the document of each position of the whole
  // rows (model/document_attention.h); attention stays within a document. Without context
  // parallelism S_row is the local S.
  virtual at::Tensor forward(const at::Tensor& x, const RotaryTable& rope, const at::Tensor& documents) const = 0;
  // Every parameter, in torchtitan's order.
  virtual void visit_params(const ParamVisitor& visit) = 0;
  virtual std::vector<Linear*> linears() = 0;
  // Its rules (See Note [A plan as data] in model/sharding_plan.h), `prefix`'s module first.
  virtual std::vector<TpRule> tp_plan() const = 0;

  std::string prefix;             // "layers.<i>.attention"
  ModuleInputHook prepare_input;  // empty: identity
  AttentionCompute sdpa;          // empty: attention_op (document_causal_attention when masked)
  std::string sdpa_name;          // what describe() prints for it ("ring(cp 2, alltoall)")
};

}  // namespace titan::model
