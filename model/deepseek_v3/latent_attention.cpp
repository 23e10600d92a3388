// model/deepseek_v3/latent_attention.cpp — see latent_attention.h.
#include "model/deepseek_v3/latent_attention.h"

#include <ATen/ops/cat.h>
#include <c10/util/Exception.h>

#include <cmath>

#include "model/activation_checkpoint_ops.h"
#include "model/document_attention.h"
#include "model/kernels/attention.h"

namespace titan::model::deepseek_v3 {

double DeepSeekV3Args::softmax_scale(int64_t max_seq_len) const {
  double scale = 1.0 / std::sqrt(static_cast<double>(qk_head_dim()));
  if (yarn(max_seq_len)) {
    const double m = 0.1 * mscale * std::log(rope_factor) + 1.0;
    scale *= m * m;
  }
  return scale;
}

LatentAttention::LatentAttention(const std::string& prefix, const ModelArgs& args)
    : AttentionModule(prefix),
      mla(args.family_args_as<DeepSeekV3Args>()),
      softmax_scale(mla.softmax_scale(args.max_seq_len)),
      wkv_a(prefix + ".wkv_a", args.dim, mla.kv_lora_rank + mla.qk_rope_head_dim),
      kv_norm(prefix + ".kv_norm", mla.kv_lora_rank, args.norm_eps),
      wkv_b(prefix + ".wkv_b", mla.kv_lora_rank, args.n_heads * (mla.qk_nope_head_dim + mla.v_head_dim)),
      wo(prefix + ".wo", args.n_heads * mla.v_head_dim, args.dim) {
  const int64_t q_out = args.n_heads * mla.qk_head_dim();
  if (mla.q_lora_rank == 0) {
    wq.emplace(prefix + ".wq", args.dim, q_out);
  } else {
    wq_a.emplace(prefix + ".wq_a", args.dim, mla.q_lora_rank);
    q_norm.emplace(prefix + ".q_norm", mla.q_lora_rank, args.norm_eps);
    wq_b.emplace(prefix + ".wq_b", mla.q_lora_rank, q_out);
  }
  for (Linear* l : linears()) make_linear_meta(*l);
}

at::Tensor LatentAttention::forward(const at::Tensor& x_in, const RotaryTable& rope, const at::Tensor& documents) const {
  const LinearOperand x = prepare_input ? prepare_input(x_in) : LinearOperand(x_in);
  const int64_t batch = x.hp.size(0), seq = x.hp.size(1);
  const int64_t nope = mla.qk_nope_head_dim, rot = mla.qk_rope_head_dim;
  // Head counts come from the weights' outputs, so a tensor-parallel shard (fewer local heads) works too.
  at::Tensor q = (wq ? wq->forward(x) : wq_b->forward(q_norm->forward(wq_a->forward(x))))
                     .view({batch, seq, -1, mla.qk_head_dim()});  // [B, S, H, qk]
  const int64_t heads = q.size(2);
  q = at::cat({q.narrow(3, 0, nope), apply_rotary(q.narrow(3, nope, rot), rope)}, 3);
  const at::Tensor kv_a = wkv_a.forward(x);  // [B, S, kv_lora + rot]
  const at::Tensor k_pe = apply_rotary(kv_a.narrow(2, mla.kv_lora_rank, rot).unsqueeze(2), rope);  // [B, S, 1, rot]
  const at::Tensor kv = wkv_b.forward(kv_norm.forward(kv_a.narrow(2, 0, mla.kv_lora_rank)))
                            .view({batch, seq, heads, nope + mla.v_head_dim});
  const at::Tensor k = at::cat({kv.narrow(3, 0, nope), k_pe.expand({batch, seq, heads, rot})}, 3);
  const at::Tensor v = kv.narrow(3, nope, mla.v_head_dim);
  const at::Tensor qt = q.transpose(1, 2), kt = k.transpose(1, 2), vt = v.transpose(1, 2);  // [B, H, S, .]
  // As grouped-query attention's, through the op layer (per-op AC keeps its output), over
  // context-parallel ranks when installed, per document when block-causal; with the softmax
  // scale of the qk head (and YaRN's mscale), the output of the v head size.
  at::Tensor out = sdpa                  ? sdpa(qt, kt, vt, documents, softmax_scale, 0, at::Tensor())
                   : documents.defined() ? document_causal_attention(qt, kt, vt, documents, softmax_scale)
                                         : attention_op(qt, kt, vt, softmax_scale);  // [B, H, S, v]
  return wo.forward(out.transpose(1, 2).reshape({batch, seq, -1}));  // [B, S, D]
}

// torchtitan's order (its module registration): wq | wq_a, q_norm, wq_b; wkv_a, kv_norm, wkv_b, wo.
void LatentAttention::visit_params(const ParamVisitor& visit) {
  if (wq) {
    visit(wq->fqn() + ".weight", wq->weight);
  } else {
    visit(wq_a->fqn() + ".weight", wq_a->weight);
    q_norm->visit_params(visit);
    visit(wq_b->fqn() + ".weight", wq_b->weight);
  }
  visit(wkv_a.fqn() + ".weight", wkv_a.weight);
  kv_norm.visit_params(visit);
  visit(wkv_b.fqn() + ".weight", wkv_b.weight);
  visit(wo.fqn() + ".weight", wo.weight);
}

std::vector<Linear*> LatentAttention::linears() {
  std::vector<Linear*> all;
  if (wq) all.push_back(&*wq);
  else all.insert(all.end(), {&*wq_a, &*wq_b});
  all.insert(all.end(), {&wkv_a, &wkv_b, &wo});
  return all;
}

std::vector<TpRule> LatentAttention::tp_plan() const {
  std::vector<TpRule> rules = {{prefix, TpStyle::kGatherInput, {wq ? wq->fqn() : wq_a->fqn(), wkv_a.fqn()}}};
  if (wq) {
    rules.push_back({wq->fqn(), TpStyle::kColwise});
  } else {
    rules.push_back({wq_a->fqn(), TpStyle::kReplicated});
    rules.push_back({q_norm->fqn, TpStyle::kReplicated});
    rules.push_back({wq_b->fqn(), TpStyle::kColwise});
  }
  rules.push_back({wkv_a.fqn(), TpStyle::kReplicated});
  rules.push_back({kv_norm.fqn, TpStyle::kReplicated});
  rules.push_back({wkv_b.fqn(), TpStyle::kColwise});
  rules.push_back({wo.fqn(), TpStyle::kRowwise});
  return rules;
}

int64_t LatentAttention::param_count(const ModelArgs& args) {
  const DeepSeekV3Args& m = args.family_args_as<DeepSeekV3Args>();
  const int64_t q_out = args.n_heads * m.qk_head_dim();
  const int64_t q = m.q_lora_rank == 0 ? args.dim * q_out : args.dim * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * q_out;
  return q + args.dim * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank +
         m.kv_lora_rank * args.n_heads * (m.qk_nope_head_dim + m.v_head_dim) + args.n_heads * m.v_head_dim * args.dim;
}

double LatentAttention::score_flops_per_token(const ModelArgs& args, int64_t seq_len) {
  // torchtitan's get_moe_model_nparams_and_flops with head_dims = qk_nope + qk_rope + v: the
  // score product over the qk head and the value product over the v head, 6 FLOPs each per
  // multiply-add (forward and backward).
  const DeepSeekV3Args& m = args.family_args_as<DeepSeekV3Args>();
  return 6.0 * static_cast<double>(args.n_heads) * static_cast<double>(m.qk_head_dim() + m.v_head_dim) *
         static_cast<double>(seq_len);
}

AttentionActivations LatentAttention::activations(const ModelArgs& args, const AttentionActivationsQuery& where) {
  const DeepSeekV3Args& m = args.family_args_as<DeepSeekV3Args>();
  const double tp = static_cast<double>(where.tp), d = static_cast<double>(args.dim);
  const double heads = static_cast<double>(args.n_heads) / tp;  // whole heads per TP rank
  const double qk = heads * static_cast<double>(m.qk_head_dim()), v = heads * static_cast<double>(m.v_head_dim);
  const double kv_b = heads * static_cast<double>(m.qk_nope_head_dim + m.v_head_dim);
  const double q_lora = static_cast<double>(m.q_lora_rank), kv_lora = static_cast<double>(m.kv_lora_rank);
  const double kv_a = kv_lora + static_cast<double>(m.qk_rope_head_dim);
  AttentionActivations act;
  // The low-rank projections are replicated over TP (whole widths on every rank). Their outputs
  // are kept by the norms that read them (kv_norm reads a view of wkv_a's output: all of it
  // stays), the norms' outputs by wq_b and wkv_b. q and k are new tensors (the rotated part
  // concatenated to the rest); v is a view of wkv_b's output, which attention keeps whole.
  if (m.q_lora_rank > 0) {
    act.saved.push_back({"wq_a output (q_norm input) and q_norm output (wq_b input)", 2 * q_lora});
    act.norm_widths.push_back(q_lora);
  }
  act.saved.push_back({"wkv_a output (kv_norm input) and kv_norm output (wkv_b input)", kv_a + kv_lora});
  act.norm_widths.push_back(kv_lora);
  act.saved.push_back({"q and k with their rotated parts, wkv_b output (v's storage)", 2 * qk + kv_b});
  // LibTorch's flash kernels take one head size: v is padded to q/k's (a copy kept); titan's
  // bf16 CPU kernel takes v as it is.
  const bool titan_cpu_kernel =
      !where.cuda && where.compute_bytes == 2 &&
      cpu_attention_kernel_applies(at::kBFloat16, m.qk_head_dim(), m.v_head_dim, where.seq_len);
  if (m.v_head_dim != m.qk_head_dim() && !titan_cpu_kernel) act.saved.push_back({"v padded to the q/k head size", qk});
  if (m.q_lora_rank > 0) act.matmul_outputs = {q_lora, qk};  // wq_a, wq_b
  else act.matmul_outputs = {qk};                              // wq
  act.matmul_outputs.insert(act.matmul_outputs.end(), {kv_a, kv_b, d});  // wkv_a, wkv_b, wo
  act.output = v;
  act.heads = heads;
  act.q_width = qk;
  act.kv_width = qk + v;
  return act;
}

}  // namespace titan::model::deepseek_v3
