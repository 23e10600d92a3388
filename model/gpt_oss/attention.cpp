// model/gpt_oss/attention.cpp — see attention.h.
#include "model/gpt_oss/attention.h"

#include <c10/util/Exception.h>

#include <cmath>

#include "model/gpt_oss/args.h"
#include "model/sink_attention.h"

namespace titan::model::gpt_oss {

GptOssAttention::GptOssAttention(const std::string& prefix, const ModelArgs& args, int64_t layer)
    : AttentionModule(prefix),
      head_dim(args.head_dim()),
      window(args.family_args_as<GptOssArgs>().window(layer)),
      block_causal(args.block_causal),
      softmax_scale(std::pow(args.family_args_as<GptOssArgs>().mscale(), 2) /
                    std::sqrt(static_cast<double>(args.head_dim()))),
      wq(prefix + ".wq", args.dim, args.n_heads * args.head_dim()),
      wk(prefix + ".wk", args.dim, args.kv_heads() * args.head_dim()),
      wv(prefix + ".wv", args.dim, args.kv_heads() * args.head_dim()),
      wo(prefix + ".wo", args.n_heads * args.head_dim(), args.dim) {
  TORCH_CHECK(args.n_heads % args.kv_heads() == 0, "n_heads ", args.n_heads, " is not divisible by n_kv_heads ",
              args.kv_heads());
  for (Linear* l : {&wq, &wk, &wv, &wo}) make_linear_meta(*l);
  wq_bias = meta_tensor({args.n_heads * head_dim});
  wk_bias = meta_tensor({args.kv_heads() * head_dim});
  wv_bias = meta_tensor({args.kv_heads() * head_dim});
  wo_bias = meta_tensor({args.dim});
  sinks = meta_tensor({args.n_heads});
}

at::Tensor GptOssAttention::forward(const at::Tensor& x_in, const RotaryTable& rope, const at::Tensor& documents) const {
  const LinearOperand x = prepare_input ? prepare_input(x_in) : LinearOperand(x_in);
  const int64_t batch = x.hp.size(0), seq = x.hp.size(1);
  const auto dt = x.hp.scalar_type();
  // Head counts come from the weights, so a tensor-parallel shard (fewer local heads) works too.
  at::Tensor q = (wq.forward(x) + wq_bias.to(dt)).view({batch, seq, -1, head_dim});  // [B, S, H, hd]
  at::Tensor k = (wk.forward(x) + wk_bias.to(dt)).view({batch, seq, -1, head_dim});  // [B, S, KV, hd]
  at::Tensor v = (wv.forward(x) + wv_bias.to(dt)).view({batch, seq, -1, head_dim});
  q = apply_rotary_half(q, rope).transpose(1, 2);  // [B, H, S, hd]
  k = apply_rotary_half(k, rope).transpose(1, 2);
  v = v.transpose(1, 2);
  // YaRN's mscale^2 in the softmax scale (See the header); the block's window and the sinks.
  const at::Tensor docs = block_causal ? documents : at::Tensor();
  const at::Tensor out = sdpa ? sdpa(q, k, v, docs, softmax_scale, window, sinks)
                              : sink_attention(q, k, v, docs, window, sinks, softmax_scale);
  return wo.forward(out.transpose(1, 2).reshape({batch, seq, -1})) + wo_bias.to(dt);  // [B, S, D]
}

void GptOssAttention::visit_params(const ParamVisitor& visit) {
  visit(wq.fqn() + ".weight", wq.weight);
  visit(wq.fqn() + ".bias", wq_bias);
  visit(wk.fqn() + ".weight", wk.weight);
  visit(wk.fqn() + ".bias", wk_bias);
  visit(wv.fqn() + ".weight", wv.weight);
  visit(wv.fqn() + ".bias", wv_bias);
  visit(wo.fqn() + ".weight", wo.weight);
  visit(wo.fqn() + ".bias", wo_bias);
  visit(prefix + ".sinks", sinks);
}

std::vector<Linear*> GptOssAttention::linears() { return {&wq, &wk, &wv, &wo}; }

std::vector<TpRule> GptOssAttention::tp_plan() const {
  return {{prefix, TpStyle::kGatherInput, {wq.fqn(), wk.fqn(), wv.fqn()}},
          {wq.fqn(), TpStyle::kColwise},
          {wk.fqn(), TpStyle::kColwise},
          {wv.fqn(), TpStyle::kColwise},
          {wo.fqn(), TpStyle::kRowwise},
          {wq.fqn() + ".bias", TpStyle::kShardTensor, {}, 0},
          {wk.fqn() + ".bias", TpStyle::kShardTensor, {}, 0},
          {wv.fqn() + ".bias", TpStyle::kShardTensor, {}, 0},
          {prefix + ".sinks", TpStyle::kShardTensor, {}, 0}};
}

int64_t GptOssAttention::param_count(const ModelArgs& a) {
  const int64_t q = a.n_heads * a.head_dim(), kv = a.kv_heads() * a.head_dim();
  return (a.dim + 1) * q + 2 * (a.dim + 1) * kv + q * a.dim + a.dim + a.n_heads;
}

}  // namespace titan::model::gpt_oss
