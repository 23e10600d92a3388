// model/grouped_query_attention.cpp — see grouped_query_attention.h.
#include "model/grouped_query_attention.h"

#include <c10/util/Exception.h>

#include "model/activation_checkpoint_ops.h"
#include "model/document_attention.h"
#include "model/kernels/attention.h"

namespace titan::model {

GroupedQueryAttention::GroupedQueryAttention(const std::string& prefix, const ModelArgs& args)
    : AttentionModule(prefix),
      n_heads(args.n_heads),
      n_kv_heads(args.kv_heads()),
      head_dim(args.head_dim()),
      wq(prefix + ".wq", args.dim, args.n_heads * args.head_dim()),
      wk(prefix + ".wk", args.dim, args.kv_heads() * args.head_dim()),
      wv(prefix + ".wv", args.dim, args.kv_heads() * args.head_dim()),
      wo(prefix + ".wo", args.n_heads * args.head_dim(), args.dim),
      rope_rotate_half(args.rope_rotate_half),
      block_causal(args.block_causal) {
  TORCH_CHECK(args.explicit_head_dim > 0 || args.dim % args.n_heads == 0, "dim ", args.dim,
              " is not divisible by n_heads ", args.n_heads);
  if (args.qk_norm) {
    q_norm.emplace(prefix + ".q_norm", args.head_dim(), args.norm_eps);
    k_norm.emplace(prefix + ".k_norm", args.head_dim(), args.norm_eps);
  }
  TORCH_CHECK(args.n_heads % args.kv_heads() == 0, "n_heads ", args.n_heads,
              " is not divisible by n_kv_heads ", args.kv_heads());
  for (Linear* l : {&wq, &wk, &wv, &wo}) make_linear_meta(*l);
}

at::Tensor GroupedQueryAttention::forward(const at::Tensor& x_in, const RotaryTable& rope, const at::Tensor& documents) const {
  const LinearOperand x = prepare_input ? prepare_input(x_in) : LinearOperand(x_in);
  const int64_t batch = x.hp.size(0), seq = x.hp.size(1);
  // Head counts come from the weights, so a tensor-parallel shard (fewer local heads) works too.
  at::Tensor q = wq.forward(x).view({batch, seq, -1, head_dim});  // [B, S, H, hd]
  at::Tensor k = wk.forward(x).view({batch, seq, -1, head_dim});  // [B, S, KV, hd]
  at::Tensor v = wv.forward(x).view({batch, seq, -1, head_dim});  // [B, S, KV, hd]
  if (q_norm) {  // Qwen3: each head's q and k normalized before RoPE
    q = q_norm->forward(q);
    k = k_norm->forward(k);
  }
  if (use_rope) {
    const auto rotate = rope_rotate_half ? apply_rotary_half : apply_rotary;
    q = rotate(q, rope);
    k = rotate(k, rope);
  }
  q = q.transpose(1, 2);  // [B, H, S, hd]
  k = k.transpose(1, 2);
  v = v.transpose(1, 2);
  // Causal SDPA through the op layer, so per-op selective AC can keep its output; under context
  // parallelism, attention over the whole sequence with keys and values from the other ranks;
  // block-causal or chunked: per document, or per chunk of a document (See Note
  // [Document-masked attention]; model/attention_masks.h). The scale is SDPA's default
  // 1/sqrt(head_dim), as torchtitan's Llama 3, Llama 4 and Qwen3 (whose head_dim**-0.5 is the same).
  const std::optional<double> scale;
  const at::Tensor spans = attention_chunk > 0 ? chunked_documents(documents, attention_chunk)
                           : block_causal      ? documents
                                               : at::Tensor();
  at::Tensor out = sdpa              ? sdpa(q, k, v, spans, scale, 0, at::Tensor())
                   : spans.defined() ? document_causal_attention(q, k, v, spans, scale)
                                     : attention_op(q, k, v, scale);  // [B, H, S, hd]
  return wo.forward(out.transpose(1, 2).reshape({batch, seq, -1}));  // [B, S, D]
}

void GroupedQueryAttention::visit_params(const ParamVisitor& visit) {
  for (Linear* l : linears()) visit(l->fqn() + ".weight", l->weight);
  if (q_norm) {
    q_norm->visit_params(visit);
    k_norm->visit_params(visit);
  }
}

std::vector<Linear*> GroupedQueryAttention::linears() { return {&wq, &wk, &wv, &wo}; }

std::vector<TpRule> GroupedQueryAttention::tp_plan() const {
  std::vector<TpRule> rules = {{prefix, TpStyle::kGatherInput, {wq.fqn(), wk.fqn(), wv.fqn()}},
                               {wq.fqn(), TpStyle::kColwise},
                               {wk.fqn(), TpStyle::kColwise},
                               {wv.fqn(), TpStyle::kColwise},
                               {wo.fqn(), TpStyle::kRowwise}};
  if (q_norm) {
    rules.push_back({q_norm->fqn, TpStyle::kReplicated});
    rules.push_back({k_norm->fqn, TpStyle::kReplicated});
  }
  return rules;
}

int64_t GroupedQueryAttention::param_count(const ModelArgs& a) {
  const int64_t head_dim = a.head_dim();
  return a.dim * a.n_heads * head_dim             // wq
         + 2 * a.dim * a.kv_heads() * head_dim    // wk, wv
         + a.n_heads * head_dim * a.dim           // wo
         + (a.qk_norm ? 2 * head_dim : 0);        // q_norm, k_norm
}

double GroupedQueryAttention::score_flops_per_token(const ModelArgs& a, int64_t seq_len) {
  return 12.0 * static_cast<double>(a.n_heads) * static_cast<double>(a.head_dim()) * static_cast<double>(seq_len);
}

std::vector<ShardedSize> GroupedQueryAttention::tp_sharded_sizes(const ModelArgs& a) {
  return {{"the number of attention heads n_heads", a.n_heads}, {"the number of kv heads n_kv_heads", a.kv_heads()}};
}

AttentionActivations GroupedQueryAttention::activations(const ModelArgs& a, const AttentionActivationsQuery& where) {
  const double tp = static_cast<double>(where.tp), d = static_cast<double>(a.dim);
  const double dq = static_cast<double>(a.n_heads * a.head_dim()) / tp;
  const double dkv = static_cast<double>(a.kv_heads() * a.head_dim()) / tp;
  AttentionActivations act;
  // q and k projections are not kept: RoPE's products with the (constant) tables keep only the
  // tables; the rotated copies are what attention keeps. LibTorch's CPU flash kernel gets k and
  // v repeated to every head (the un-repeated are freed); titan's bf16 CPU kernel takes them as
  // they are (Note [Where the CPU attention kernel runs] in model/kernels/attention.h). CUDA as
  // the CPU flash kernel: an upper bound.
  const bool titan_cpu_kernel = !where.cuda && where.compute_bytes == 2 &&
                                cpu_attention_kernel_applies(at::kBFloat16, a.head_dim(), a.head_dim(), where.seq_len);
  if (a.kv_heads() != a.n_heads && !titan_cpu_kernel)
    act.saved.push_back({"RoPE-rotated q; k, v repeated to all heads (GQA)", 3 * dq});
  else
    act.saved.push_back({"RoPE-rotated q, k and the v projection", dq + 2 * dkv});
  act.matmul_outputs = {dq, dkv, dkv, d};  // wq, wk, wv, wo (its partial sums: the whole width)
  act.output = dq;
  act.heads = static_cast<double>(a.n_heads) / tp;
  act.q_width = dq;
  act.kv_width = 2 * dkv;
  return act;
}

}  // namespace titan::model
