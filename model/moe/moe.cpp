// model/moe/moe.cpp — see moe.h.
#include "model/moe/moe.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/_grouped_mm.h>
#include <ATen/ops/argsort.h>
#include <ATen/ops/bincount.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/sign.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/split_with_sizes.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/unbind.h>
#include <ATen/ops/zeros.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "model/kernels/fused_ops.h"

namespace titan::model::moe {
namespace {

[[noreturn]] void bad(const std::string& what) { throw std::invalid_argument("moe: " + what); }

}  // namespace

void check_moe_args(const MoEArgs& a) {
  const std::string E = std::to_string(a.num_experts);
  if (a.num_experts < 1) bad("num_experts " + E + " must be at least 1");
  if (a.top_k < 1 || a.top_k > a.num_experts)
    bad("top_k " + std::to_string(a.top_k) + " must be between 1 and num_experts " + E);
  if (a.score_func != "softmax" && a.score_func != "sigmoid")
    bad("score_func '" + a.score_func + "' is not one of: softmax, sigmoid");
  if (a.num_shared_experts < 0) bad("num_shared_experts " + std::to_string(a.num_shared_experts) + " is negative");
  if (!std::isfinite(a.route_scale)) bad("route_scale must be a finite number");
  if (a.load_balance_coeff && !(*a.load_balance_coeff >= 0))
    bad("load_balance_coeff " + std::to_string(*a.load_balance_coeff) +
        " must be >= 0 (0: a bias that never moves; unset: no bias)");
  if (a.num_limited_groups && !a.num_expert_groups)
    bad("num_limited_groups is set without num_expert_groups (group-limited routing needs both)");
  if (a.num_expert_groups) {
    const int64_t G = *a.num_expert_groups;
    if (G < 1 || a.num_experts % G != 0)
      bad("num_expert_groups " + std::to_string(G) + " must divide num_experts " + E);
    if (a.num_experts / G < 2)
      bad("num_expert_groups " + std::to_string(G) + " leaves " + std::to_string(a.num_experts / G) +
          " expert(s) per group; group-limited routing scores a group by its best two (need >= 2)");
    if (!a.num_limited_groups) bad("num_expert_groups is set but num_limited_groups is not");
    const int64_t L = *a.num_limited_groups;
    if (L < 1 || L > G) bad("num_limited_groups " + std::to_string(L) + " must be between 1 and num_expert_groups " +
                            std::to_string(G));
    if (a.top_k > L * (a.num_experts / G))
      bad("top_k " + std::to_string(a.top_k) + " exceeds the " + std::to_string(L * (a.num_experts / G)) +
          " experts of the num_limited_groups " + std::to_string(L) + " groups a token may use");
  }
}

Routing route(const at::Tensor& scores_logits, const at::Tensor& expert_bias, const MoEArgs& args) {
  TORCH_CHECK(scores_logits.dim() == 2 && scores_logits.size(1) == args.num_experts, "moe router: scores must be [N, ",
              args.num_experts, "], got ", scores_logits.sizes());
  const int64_t N = scores_logits.size(0), E = args.num_experts, K = args.top_k;
  // In float32 whatever the compute dtype (torchtitan: "to avoid loss explosion").
  const at::Tensor logits = scores_logits.to(at::kFloat);
  const at::Tensor scores = args.score_func == "sigmoid" ? logits.sigmoid() : at::softmax(logits, 1);
  at::Tensor selected;
  {
    at::NoGradGuard no_grad;  // the choice is not differentiated
    at::Tensor choice = expert_bias.defined() ? scores + expert_bias : scores;
    if (args.num_expert_groups) {
      const int64_t G = *args.num_expert_groups;
      const at::Tensor grouped = choice.view({N, G, E / G});
      const at::Tensor group_scores = std::get<0>(grouped.topk(2, -1)).sum(-1);  // [N, G]
      const at::Tensor kept = std::get<1>(group_scores.topk(*args.num_limited_groups, -1, true, /*sorted=*/false));
      const at::Tensor dropped = at::ones_like(group_scores, at::kBool).scatter_(1, kept, false);
      choice = grouped.masked_fill(dropped.unsqueeze(-1), -std::numeric_limits<double>::infinity()).view({N, E});
    }
    selected = std::get<1>(choice.topk(K, -1, true, /*sorted=*/false));
    if (args.force_load_balance)
      selected = at::arange(N * K, scores.options().dtype(at::kLong)).view({N, K}).remainder(E);
  }
  at::Tensor top_scores = scores.gather(1, selected);  // the unbiased scores weigh
  if (args.route_norm) top_scores = top_scores / (top_scores.sum(-1, true) + 1e-20);
  top_scores = top_scores * args.route_scale;
  const at::Tensor counts = at::bincount(selected.view(-1), {}, E).to(at::kFloat);
  return {top_scores, selected, counts};
}

namespace {
std::atomic<bool> grouped_mm_disabled{false};
bool grouped_mm_usable() { return !grouped_mm_disabled.load(); }
void disable_grouped_mm(const std::string& why) {
  if (!grouped_mm_disabled.exchange(true))
    TORCH_WARN("MoE experts: LibTorch's grouped GEMM is not usable here (", why.substr(0, why.find('\n')),
               "); the experts run as one matmul chain per expert from now on");
}
}  // namespace

std::string ExpertComputes::describe() const { return defined() ? w1->describe() : "hp"; }

at::Tensor grouped_linear(const at::Tensor& x, const at::Tensor& w, const std::vector<int64_t>& counts,
                          LinearCompute& compute, int64_t alignment, const QuantizedOperand& x_cast) {
  TORCH_CHECK(!x_cast.defined() || (alignment == 1 && x_cast.data.sizes() == x.sizes()),
              "grouped linear: a per-row cast of x ", x.sizes(), " must have its shape and no group padding");
  TORCH_CHECK(x.dim() == 2 && w.dim() == 3 && static_cast<int64_t>(counts.size()) == w.size(0) && x.size(1) == w.size(2),
              "grouped linear: x ", x.sizes(), ", w ", w.sizes(), ", ", counts.size(), " group sizes");
  // Split and unbind (one cat / one stack in backward; see grouped_experts below).
  const std::vector<at::Tensor> xs = x.split_with_sizes(counts, 0);
  const std::vector<at::Tensor> ws = w.unbind(0);
  std::vector<at::Tensor> outputs;
  int64_t begin = 0;  // the group's first row
  for (size_t e = 0; e < counts.size(); begin += counts[e], ++e) {
    if (counts[e] == 0) continue;
    const int64_t pad = (alignment - counts[e] % alignment) % alignment;
    if (pad == 0) {
      if (x_cast.defined()) {
        const QuantizedOperand rows{x_cast.data.narrow(0, begin, counts[e]), x_cast.scale.narrow(0, begin, counts[e])};
        outputs.push_back(compute.forward(LinearOperand(xs[e], rows), ws[e]));
      } else {
        outputs.push_back(compute.forward(xs[e], ws[e]));  // [rows, N]
      }
      continue;
    }
    // Zero rows change no amax and add nothing to the weight gradient (Note [Low-precision experts]).
    const at::Tensor padded = at::constant_pad_nd(xs[e], {0, 0, 0, pad});
    outputs.push_back(compute.forward(padded, ws[e]).narrow(0, 0, counts[e]));
  }
  if (outputs.empty()) return at::zeros({0, w.size(1)}, x.options());
  return outputs.size() == 1 ? outputs[0] : at::cat(outputs, 0);
}

at::Tensor grouped_projection(const at::Tensor& x, const at::Tensor& w, const std::vector<int64_t>& counts) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 3 && static_cast<int64_t>(counts.size()) == w.size(0) && x.size(1) == w.size(2),
              "grouped projection: x ", x.sizes(), ", w ", w.sizes(), ", ", counts.size(), " group sizes");
  if (x.is_cuda() && x.scalar_type() == at::kBFloat16 && w.scalar_type() == at::kBFloat16 && grouped_mm_usable()) {
    try {  // See Note [Grouped GEMM]
      std::vector<int32_t> ends(counts.size());
      int64_t end = 0;
      for (size_t e = 0; e < counts.size(); ++e) ends[e] = static_cast<int32_t>(end += counts[e]);
      return at::_grouped_mm(x, w.transpose(-2, -1), at::tensor(ends, at::kInt).to(x.device()));
    } catch (const c10::Error& e) {
      disable_grouped_mm(e.what_without_backtrace());
    }
  }
  // Split and unbind: one cat and one stack in backward (See grouped_experts below).
  const std::vector<at::Tensor> xs = x.split_with_sizes(counts, 0);
  const std::vector<at::Tensor> ws = w.unbind(0);
  std::vector<at::Tensor> outputs;
  for (size_t e = 0; e < counts.size(); ++e)
    if (counts[e] > 0) outputs.push_back(xs[e].matmul(ws[e].t()));
  if (outputs.empty()) return at::zeros({0, w.size(1)}, x.options());
  return outputs.size() == 1 ? outputs[0] : at::cat(outputs, 0);
}

at::Tensor grouped_experts(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& w2, const at::Tensor& w3,
                           const std::vector<int64_t>& counts, const ExpertComputes& computes,
                           const QuantizedOperand& x_cast) {
  TORCH_CHECK(!x_cast.defined() || computes.defined(), "grouped experts: a float8 input needs low-precision experts");
  TORCH_CHECK(x.dim() == 2 && w1.dim() == 3 && static_cast<int64_t>(counts.size()) == w1.size(0),
              "grouped experts: x ", x.sizes(), ", w1 ", w1.sizes(), ", ", counts.size(), " group sizes");
  int64_t total = 0;
  for (int64_t rows : counts) total += rows;
  TORCH_CHECK(total == x.size(0), "grouped experts: the group sizes add up to ", total, " rows, x has ", x.size(0));
  if (!computes.defined() && x.is_cuda() && x.scalar_type() == at::kBFloat16 && w1.scalar_type() == at::kBFloat16 &&
      grouped_mm_usable()) {
    // Note [Grouped GEMM]: on CUDA in bfloat16, LibTorch's grouped GEMM runs every expert's rows in
    // one kernel per projection (groups given by their end offsets, empty ones allowed), as
    // torchtitan's _run_experts_grouped_mm; its backward is LibTorch's too. Where the GPU or this
    // LibTorch has none, the first call says so once and the loop below runs from then on.
    try {
      std::vector<int32_t> ends(counts.size());
      int64_t end = 0;
      for (size_t e = 0; e < counts.size(); ++e) ends[e] = static_cast<int32_t>(end += counts[e]);
      const at::Tensor offs = at::tensor(ends, at::kInt).to(x.device());
      const at::Tensor gate = at::_grouped_mm(x, w1.transpose(-2, -1), offs);  // [T, H]
      const at::Tensor up = at::_grouped_mm(x, w3.transpose(-2, -1), offs);
      return at::_grouped_mm(at::silu(gate) * up, w2.transpose(-2, -1), offs);  // [T, D]
    } catch (const c10::Error& e) {
      disable_grouped_mm(e.what_without_backtrace());
    }
  }
  if (computes.defined()) {  // See Note [Low-precision experts]
    const int64_t a = computes.group_alignment;
    const at::Tensor gate = grouped_linear(x, w1, counts, *computes.w1, a, x_cast);  // [T, H]
    const at::Tensor up = grouped_linear(x, w3, counts, *computes.w3, a, x_cast);
    return grouped_linear(at::silu(gate) * up, w2, counts, *computes.w2, a);  // [T, D]
  }
  // Split and unbind, not narrow / select per expert: their backward is ONE cat of the row
  // gradients and ONE stack of the experts' weight gradients. Per-expert views would each
  // allocate and zero-fill a gradient of the whole input / stacked weight in backward, E times
  // per layer (measured: 69% of a debugmodel_moe step in fill_ on the CPU).
  const std::vector<at::Tensor> xs = x.split_with_sizes(counts, 0);
  const std::vector<at::Tensor> w1s = w1.unbind(0), w2s = w2.unbind(0), w3s = w3.unbind(0);
  std::vector<at::Tensor> outputs;
  for (size_t e = 0; e < counts.size(); ++e) {
    if (counts[e] == 0) continue;
    const at::Tensor gate = xs[e].matmul(w1s[e].t());  // [rows, H]
    const at::Tensor up = xs[e].matmul(w3s[e].t());
    outputs.push_back((at::silu(gate) * up).matmul(w2s[e].t()));  // [rows, D]
  }
  if (outputs.empty()) return at::zeros({0, w2.size(1)}, x.options());
  return outputs.size() == 1 ? outputs[0] : at::cat(outputs, 0);
}

namespace {
thread_local int uncounted_depth = 0;
}  // namespace

UncountedForward::UncountedForward() { ++uncounted_depth; }
UncountedForward::~UncountedForward() { --uncounted_depth; }
bool UncountedForward::active() { return uncounted_depth > 0; }

void update_expert_bias(at::Tensor& expert_bias, const at::Tensor& tokens_per_expert, double coeff) {
  at::NoGradGuard no_grad;
  const at::Tensor counts = tokens_per_expert.to(at::kFloat);
  at::Tensor delta = coeff * at::sign(counts.mean() - counts);
  delta = delta - delta.mean();
  expert_bias.add_(delta.to(expert_bias.device()));
}

SwiGluExperts::SwiGluExperts(const std::string& prefix_, int64_t num_experts, int64_t dim, int64_t hidden_dim)
    : RoutedExperts(prefix_),
      w1(meta_tensor({num_experts, hidden_dim, dim})),
      w2(meta_tensor({num_experts, dim, hidden_dim})),
      w3(meta_tensor({num_experts, hidden_dim, dim})) {}

void SwiGluExperts::visit_params(const ParamVisitor& visit) {
  visit(prefix + ".w1", w1);
  visit(prefix + ".w2", w2);
  visit(prefix + ".w3", w3);
}

std::vector<std::string> RoutedExperts::param_names() const {
  std::vector<std::string> names;
  // Visiting hands out each slot without changing it.
  const_cast<RoutedExperts*>(this)->visit_params([&](const std::string& fqn, at::Tensor&) { names.push_back(fqn); });
  return names;
}

std::vector<TpRule> SwiGluExperts::tp_plan() const {
  // The hidden rows (w1, w3 [E, H, D]) and columns (w2 [E, D, H]: a partial output) sharded.
  return {{prefix + ".w1", TpStyle::kShardTensor, {}, 1},
          {prefix + ".w3", TpStyle::kShardTensor, {}, 1},
          {prefix + ".w2", TpStyle::kShardTensor, {}, 2}};
}

at::Tensor SwiGluExperts::forward(const at::Tensor& rows, const std::vector<int64_t>& counts,
                                  const ExpertComputes& computes, const QuantizedOperand& x_cast) const {
  return grouped_experts(rows, w1, w2, w3, counts, computes, x_cast);
}

MoE::MoE(const std::string& prefix_, const MoEArgs& args_, int64_t dim_, int64_t hidden_dim_,
         std::unique_ptr<RoutedExperts> routed)
    : prefix(prefix_), args(args_), dim(dim_), hidden_dim(hidden_dim_), gate(prefix_ + ".router.gate", dim_, args_.num_experts) {
  check_moe_args(args);
  const int64_t E = args.num_experts;
  make_linear_meta(gate);
  gate.keeps_precision = true;  // routing decisions in the parameters' dtype, whatever the converters
  if (args.gate_bias) gate_bias = meta_tensor({E});
  experts = routed ? std::move(routed) : std::make_unique<SwiGluExperts>(prefix + ".experts", E, dim, hidden_dim);
  TORCH_CHECK(experts->prefix == prefix + ".experts", "moe ", prefix, ": its experts are named '", experts->prefix,
              "', expected '", prefix, ".experts'");
  if (args.num_shared_experts > 0) {
    const int64_t shared_hidden = hidden_dim * args.num_shared_experts;
    shared_w1.emplace(prefix + ".shared_experts.w1", dim, shared_hidden);
    shared_w2.emplace(prefix + ".shared_experts.w2", shared_hidden, dim);
    shared_w3.emplace(prefix + ".shared_experts.w3", dim, shared_hidden);
    for (Linear* l : {&*shared_w1, &*shared_w2, &*shared_w3}) make_linear_meta(*l);
  }
  if (args.load_balance_coeff) expert_bias = meta_tensor({E});
  tokens_per_expert = meta_tensor({E});
}

at::Tensor MoE::forward(const at::Tensor& x_in) {
  const at::Tensor x = gather_input ? gather_input(x_in) : x_in;
  TORCH_CHECK(x.dim() == 3 && x.size(2) == dim, "moe ", prefix, ": expects [B, S, ", dim, "], got ", x.sizes());
  const int64_t N = x.size(0) * x.size(1), K = args.top_k;
  const at::Tensor xf = x.reshape({N, dim});
  at::Tensor logits = gate.forward(xf);  // [N, E]
  if (gate_bias.defined()) logits = logits + gate_bias;
  const Routing r = route(logits, expert_bias, args);
  if (!UncountedForward::active()) {  // See Note [Counted tokens]
    at::NoGradGuard no_grad;
    tokens_per_expert.add_(r.tokens_per_expert.to(tokens_per_expert.device()));
  }
  // The (token, choice) pairs sorted by expert, stably: each expert's rows contiguous.
  const at::Tensor order = at::argsort(r.selected_experts.view(-1), /*stable=*/true);  // [N K]
  const at::Tensor counts_cpu = r.tokens_per_expert.to(at::kCPU, at::kLong);
  const std::vector<int64_t> counts(counts_cpu.data_ptr<int64_t>(), counts_cpu.data_ptr<int64_t>() + counts_cpu.numel());
  at::Tensor rows = xf.index_select(0, order.div(K, "floor"));  // [N K, D]
  if (args.score_before_experts) {
    const at::Tensor sorted_scores = r.top_scores.reshape({-1}).index_select(0, order);
    rows = (rows.to(at::kFloat) * sorted_scores.unsqueeze(1)).to(x.scalar_type());
  }
  // The shared experts do not need the routed rows: under expert parallelism they run while the
  // combine's all-to-all is in flight (See Note [Expert parallelism]).
  at::Tensor shared;
  const std::function<void()> shared_experts = [&] {
    if (!shared_w1) return;
    const at::Tensor g = shared_w1->forward(xf);
    const at::Tensor u = shared_w3->forward(xf);
    shared = shared_w2->forward(fused_swiglu(g, u));
  };
  at::Tensor routed;
  if (experts_compute) {
    routed = experts_compute(rows, counts, *experts, expert_computes, shared_experts);
  } else {
    routed = experts->forward(rows, counts, expert_computes, {});
    shared_experts();
  }
  // Back to (token, choice) order: the inverse permutation of `order`.
  const at::Tensor unsorted = routed.index_select(0, at::argsort(order)).view({N, K, dim});
  at::Tensor out = args.score_before_experts
                       ? unsorted.sum(1)
                       : at::bmm(r.top_scores.view({N, 1, K}), unsorted.to(at::kFloat)).to(x.scalar_type()).squeeze(1);
  if (shared.defined()) out = shared + out;
  return reduce_output ? reduce_output(out.view(x.sizes())) : out.view(x.sizes());
}

void MoE::visit_params(const std::function<void(const std::string& fqn, at::Tensor& param)>& visit) {
  visit(gate.fqn() + ".weight", gate.weight);
  if (gate_bias.defined()) visit(gate.fqn() + ".bias", gate_bias);
  experts->visit_params(visit);
  if (shared_w1)
    for (Linear* l : {&*shared_w1, &*shared_w2, &*shared_w3}) visit(l->fqn() + ".weight", l->weight);
}

std::vector<Linear*> MoE::linears() {
  std::vector<Linear*> all = {&gate};
  if (shared_w1)
    for (Linear* l : {&*shared_w1, &*shared_w2, &*shared_w3}) all.push_back(l);
  return all;
}

std::vector<std::string> MoE::expert_params() const { return experts->param_names(); }

std::vector<TpRule> MoE::tp_plan() const {
  // torchtitan's apply_moe_ep_tp with the experts sharded on their hidden dimension: the router
  // replicated (its gradient a partial sum on every rank, summed over TP), the routed experts'
  // hidden dim sharded (their rules: a partial output), the shared experts column- then
  // row-sharded with the partial output left to the layer's reduce.
  std::vector<TpRule> rules = {{prefix, TpStyle::kGatherInputReduceOutput}, {gate.fqn(), TpStyle::kReplicated}};
  for (TpRule& r : experts->tp_plan()) rules.push_back(std::move(r));
  if (shared_w1) {
    rules.push_back({shared_w1->fqn(), TpStyle::kColwise});
    rules.push_back({shared_w3->fqn(), TpStyle::kColwise});
    rules.push_back({shared_w2->fqn(), TpStyle::kRowwisePartial});
  }
  for (TpRule& r : rules) r.experts_sharded = true;
  return rules;
}

}  // namespace titan::model::moe
