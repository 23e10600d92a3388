#include "trainer/observe/memory_estimate.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>
#include <stdexcept>

#include "data/tokenizer.h"
#include "float8/recipe.h"
#include "model/flavors.h"
#include "model/kernels/attention.h"
#include "model/kernels/fused_ops.h"
#include "parallel/parallel_model.h"
#include "trainer/config/pipeline_keys.h"
#include "float8/block_scaled_linear.h"
#include "trainer/observe/memory.h"

namespace titan::trainer::observe {
namespace {

// Calibrated constants (See docs/memory.md "The estimator"): measured on the CPU with the
// tracked allocator, debug model and 100M model, float32.
// kNormSaved: tensors ATen's composite RMSNorm keeps besides its input and output (x * rstd,
// kept by the product with the weight), in units of its input's size.
constexpr double kNormSaved = 1.0;
// kBackwardTransient: activation gradients alive at once inside a block's backward, in units
// of (D + ffn hidden) x compute bytes per token (measured: ~1 while the block's own
// activations are being freed).
constexpr double kBackwardTransient = 1.0;

}  // namespace

// What one block keeps (outside the anonymous namespace: BlockTermsMemo::Impl holds them).
struct BlockTerms {
  std::vector<std::pair<const char*, double>> full;  // bytes per token, nothing checkpointed (names: literals)
  double input = 0;                                   // bytes per token, the block's input
  double kept_op = 0;                                 // bytes per token per-op AC keeps (+input)
  double backward_transient = 0;                      // bytes per token
  // Read per layer by the other terms (the block's attention and feed-forward, once):
  double ffn_width = 0;         // the feed-forward's width per token, all TP ranks' (ffn_width)
  double kv_width = 0;          // the attention's k + v width per token (its CP exchange)
  double q_and_output_width = 0;  // q's + the attention output's (Ulysses' re-shard)
  double deferred_outputs = 0;  // elements per token a split I keeps for its W (Note [Pipeline memory])
};

namespace {


// The feed-forward's width per token on one TP rank as the terms below model it: a dense
// SwiGLU's hidden size; an MoE layer's token reaches top_k (+ shared) SwiGLUs of moe_hidden_dim,
// modeled as one SwiGLU of that width (parameters, gradients and optimizer state count every
// expert: count_params).
double ffn_width(const model::ModelArgs& a, model::FeedForwardKind kind) {
  switch (kind) {
    case model::FeedForwardKind::kDense: return static_cast<double>(a.ffn_hidden_dim());
    case model::FeedForwardKind::kMoE:
      return static_cast<double>((a.moe->top_k + a.moe->num_shared_experts) * a.moe_hidden_dim);
    case model::FeedForwardKind::kNone: return 0;
  }
  return 0;
}

// What an RMSNorm over `width` keeps per token besides its input and its output (each kept by
// whoever reads it), `share` of the tokens on this rank: the fused kernel (model/kernels/
// fused_ops.h) keeps rstd, one float32 a row; ATen's composite also keeps x * rstd and,
// computing in bf16, the float32 copy of x.
double rms_norm_internals(const EstimateInputs& in, double width, double share) {
  const double e = static_cast<double>(in.compute_bytes), f = 4.0;
  if (in.fused_ops) return f;
  return kNormSaved * width * e * share + f + (in.compute_bytes != 4 ? width * f * share : 0);
}

model::AttentionActivations attention_activations(const EstimateInputs& in, int64_t layer) {
  model::AttentionActivationsQuery where;
  where.tp = in.tp;
  where.compute_bytes = in.compute_bytes;
  where.cuda = in.cuda;
  where.seq_len = in.seq_len;
  return model::family(in.args.family).attention_activations(in.args, layer, where);
}

// What block `layer` keeps, by its attention's declaration (Note [Attention activations] in
// model/family.h) and its feed-forward kind.
BlockTerms block_terms(const EstimateInputs& in, int64_t layer) {
  const auto& a = in.args;
  const double e = static_cast<double>(in.compute_bytes), f = 4.0;
  const double tp = static_cast<double>(in.tp);
  const double d = static_cast<double>(a.dim);
  const model::FeedForwardKind kind = model::family(a.family).feed_forward(a, layer);
  const double hid = ffn_width(a, kind) / tp;
  const model::AttentionActivations att = attention_activations(in, layer);
  // Sequence parallel: norms and residuals hold 1/tp of the sequence.
  const double seq_share = 1.0 / tp;
  const auto norm_internals = [&](double width, double share) { return rms_norm_internals(in, width, share); };
  // The gathered input of the attention's projections and of w1/w3: kept in float8 (1 byte) when
  // TP gathers it so (Note [Float8 operands from the producer] in float8/float8_linear.h), else in
  // the compute dtype.
  const double gathered = in.float8_tp_input_all_gather && in.tp > 1 ? 1.0 : e;

  BlockTerms t;
  t.input = d * e * seq_share;
  auto& full = t.full;
  full.reserve(12 + att.saved.size());  // one allocation (the planner estimates every candidate)
  full.push_back({"block input (residual, kept by attention_norm)", t.input});
  full.push_back({"attention_norm internals", norm_internals(d, seq_share)});
  full.push_back({"normed input of the attention's projections", d * gathered});
  for (const auto& [name, width] : att.saved) full.push_back({name, width * e});
  double inner_norms = 0;
  for (double width : att.norm_widths) inner_norms += norm_internals(width, 1.0);
  if (inner_norms > 0) full.push_back({"the attention's inner norms' internals", inner_norms});
  full.push_back({"attention output (wo input) + logsumexp", att.output * e + att.heads * f});
  std::vector<double> matmuls = att.matmul_outputs;
  if (kind != model::FeedForwardKind::kNone) {
    full.push_back({"residual h (kept by ffn_norm)", d * e * seq_share});
    full.push_back({"ffn_norm internals", norm_internals(d, seq_share)});
    full.push_back({"normed input of w1/w3", d * gathered});
    full.push_back({"w1, w3 outputs", 2 * hid * e});
    // silu(w1 x) * w3 x: the fused kernel (model/kernels/fused_ops.h) keeps only its inputs and
    // recomputes silu in its backward; the composite also keeps silu's output. The product is
    // w2's input. An MoE block's routed experts multiply by the composite (their grouped GEMM
    // path), its shared experts by the fused kernel.
    if (kind == model::FeedForwardKind::kDense) {
      if (in.fused_ops)
        full.push_back({"the product silu(w1 x) * w3 x (w2 input)", hid * e});
      else
        full.push_back({"silu(w1 x) and the product (w2 input)", 2 * hid * e});
    } else {
      const double routed = static_cast<double>(a.moe->top_k * a.moe_hidden_dim) / tp;
      const double shared = hid - routed;
      full.push_back({"silu(w1 x) and the products (w2 input; shared experts fused: the product)",
                      (2 * routed + (in.fused_ops ? 1 : 2) * shared) * e});
    }
    if (kind == model::FeedForwardKind::kMoE) {
      // A family's experts that keep more (or less) per row than SwiGLU's 4 moe_hidden_dim.
      const double beyond_swiglu =
          static_cast<double>(model::family(a.family).routed_expert_saved_per_row(a) - 4 * a.moe_hidden_dim);
      if (beyond_swiglu != 0)
        full.push_back({"the routed experts' own saved tensors beyond SwiGLU's",
                        static_cast<double>(a.moe->top_k) * beyond_swiglu / tp * e});
    }
    matmuls.insert(matmuls.end(), {hid, hid, d});  // w1, w3, w2
  }
  // Per-op AC keeps every second matrix product of the block (the 1st, 3rd, ...: wq, wv, w1, w2
  // of a grouped-query block) and attention's outputs.
  double kept_products = 0;
  for (size_t i = 0; i < matmuls.size(); i += 2) kept_products += matmuls[i];
  t.kept_op = t.input + kept_products * e + att.output * e + att.heads * f;
  t.backward_transient = kBackwardTransient * (d + hid) * e;
  t.ffn_width = ffn_width(a, kind);
  t.kv_width = att.kv_width;
  t.q_and_output_width = att.q_width + att.output;
  // A split I defers every high-precision linear's weight GEMM with its output gradient (its
  // input is saved already): the attention's projections' outputs, w1, w3, w2 (an MoE block:
  // its gate, its shared experts') (Note [Deferred weight gradients]).
  for (double width : att.matmul_outputs) t.deferred_outputs += width;
  switch (kind) {
    case model::FeedForwardKind::kDense: t.deferred_outputs += (2.0 * static_cast<double>(a.ffn_hidden_dim()) + d) / tp; break;
    case model::FeedForwardKind::kMoE:
      t.deferred_outputs += (static_cast<double>(a.moe->num_experts) +
                             (a.moe->num_shared_experts > 0
                                  ? 2.0 * static_cast<double>(a.moe_hidden_dim * a.moe->num_shared_experts) + d
                                  : 0.0)) / tp;
      break;
    case model::FeedForwardKind::kNone: break;
  }
  return t;
}

// Every block's terms, by layer, then multi-token prediction's depths (See Note [Multi-token
// prediction] in model/mtp.h): the last block's terms plus what its fuse keeps (the embedding
// and hidden state it concatenates, the two norms' internals, eh_proj's output) and mtp_norm's.
std::vector<BlockTerms> all_block_terms(const EstimateInputs& in) {
  std::vector<BlockTerms> blocks;
  blocks.reserve(static_cast<size_t>(in.args.n_layers + in.args.mtp_layers));
  for (int64_t i = 0; i < in.args.n_layers; ++i) blocks.push_back(block_terms(in, i));
  const double e = static_cast<double>(in.compute_bytes), share = 1.0 / static_cast<double>(in.tp);
  const double d = static_cast<double>(in.args.dim);
  for (int64_t k = 0; k < in.args.mtp_layers; ++k) {
    BlockTerms t = blocks.back();
    const double norms = 3 * rms_norm_internals(in, d, share);
    t.full.push_back({"multi-token prediction's fuse (its input, eh_proj's output) and norms", 3 * d * e * share + norms});
    t.input = 2 * d * e * share;  // what full AC keeps: the concatenated input
    t.kept_op += t.input;
    blocks.push_back(std::move(t));
  }
  return blocks;
}

double sum_terms(const std::vector<std::pair<const char*, double>>& terms) {
  double s = 0;
  for (const auto& [name, v] : terms) s += v;
  return s;
}

std::string gib(double bytes) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%9.3f GiB", bytes / double(1ll << 30));
  return buf;
}

// Bytes block `layer` keeps from its forward to its backward for `tokens` tokens, by its AC mode.
double block_saved_bytes(const EstimateInputs& in, const std::vector<BlockTerms>& blocks, int64_t layer,
                         double tokens) {
  const BlockTerms& bt = blocks[static_cast<size_t>(layer)];
  if (!parallel::block_is_checkpointed(in.ac, layer)) return sum_terms(bt.full) * tokens;
  return (in.ac.mode == parallel::AcMode::kSelectiveOp ? bt.kept_op : bt.input) * tokens;
}

// The head: final norm (x * rstd and the normed output the output projection keeps) and the
// float32 log-softmax the loss keeps (the logits themselves are freed once it exists); its
// backward briefly holds two [T, V] float32 gradients (+ the compute-dtype logits grad).
struct HeadBytes {
  double saved = 0;     // kept from forward to backward
  double backward = 0;  // alive during its backward
};
HeadBytes head_bytes(const EstimateInputs& in, double tokens) {
  const double e = static_cast<double>(in.compute_bytes), d = static_cast<double>(in.args.dim);
  const double vloc = static_cast<double>(in.args.vocab_size) / static_cast<double>(in.tp);
  return {tokens * (d * e * (1 + kNormSaved) + vloc * 4), tokens * (2 * vloc * 4 + (in.compute_bytes != 4 ? vloc * e : 0))};
}

// HSDP: the replicas' gradient sum keeps one bucket between steps (Note [Gradient buckets] in
// parallel/gradients.cpp), the size of the gradients when they are smaller. (TP's sum of
// the replicated norms' gradients uses the same bucket; they are far smaller.)
double replica_bucket_bytes(const EstimateInputs& in, double gradient_bytes) {
  return in.dp_replicate > 1 ? std::min(static_cast<double>(parallel::kReduceBucketBytes), gradient_bytes) : 0.0;
}

// Note [Pipeline memory]: a pp rank holds its stages' parameters (the embedding on the first
// stage, norm + output on the last) with their gradients and AdamW state, FSDP-sharded as
// without pp; under FSDP every group of its stages stays gathered for the whole step and their
// unsharded gradients accumulate until the step's one reduce-scatter (Note [Pipeline execution]).
// Activations: each micro-batch a stage has run forward but not yet backward (B, or W after a
// split I) keeps that stage's saved activations for micro-batch-sized tokens; the rank's order is
// replayed and the largest sum, plus the transients of the backward running at that moment, is
// the peak. So 1F1B holds at most (p - stage) micro-batches and GPipe all m.
// Note [Context parallel memory]: a cp rank keeps every per-token term for its seq_len / cp
// positions only, and while one attention runs it holds the exchange's buffers on top, per
// layer in flight (local K/V = 2 x tokens x kv dim x compute bytes):
//   allgather: every rank's K/V (cp x), in the backward again plus their float32 gradients;
//   alltoall:  two K/V blocks (the current and the arriving one) and float32 gradient
//              accumulators (the own, the outgoing and the incoming);
//   titan_ulysses: q, k, v and the output re-sharded (sent and received copies).
double context_parallel_buffers(const EstimateInputs& in, const std::vector<BlockTerms>& blocks, double tokens) {
  if (in.cp <= 1) return 0;
  const double e = static_cast<double>(in.compute_bytes), cp = static_cast<double>(in.cp);
  // The widest attention's exchange (every block's attention runs alone).
  double kv = 0, q_and_out = 0;
  for (int64_t i = 0; i < in.args.n_layers; ++i) {
    const BlockTerms& bt = blocks[static_cast<size_t>(i)];
    kv = std::max(kv, tokens * bt.kv_width * e);
    q_and_out = std::max(q_and_out, tokens * bt.q_and_output_width * e);
  }
  switch (in.cp_rotate_method) {
    case parallel::context_parallel::CpRotateMethod::kAllGather: return cp * kv * (1 + 4 / e);
    case parallel::context_parallel::CpRotateMethod::kAllToAll: return 2 * kv + 3 * kv * 4 / e;
    case parallel::context_parallel::CpRotateMethod::kUlysses: return 2 * (q_and_out + kv);
  }
  return 0;
}

MemoryEstimate estimate_pipeline_rank(const EstimateInputs& in, const model::ParamCount& pc,
                                      const std::vector<BlockTerms>& blocks) {
  const auto& a = in.args;
  const parallel::pipeline::PipelinePlan& plan = *in.pipeline;
  const double e = static_cast<double>(in.compute_bytes), tp = static_cast<double>(in.tp);
  const double shard = static_cast<double>(in.dp_shard) * tp;
  const double d = static_cast<double>(a.dim), vocab = static_cast<double>(a.vocab_size);
  const double tokens = static_cast<double>(plan.microbatch_rows) * static_cast<double>(in.seq_len / in.cp);
  const std::vector<int> stages = plan.stages_of(in.pp_rank);
  double params = 0;
  // By stage (the rank's own set; the order below looks them up for every action).
  const size_t n_stages = static_cast<size_t>(plan.num_stages());
  std::vector<double> saved(n_stages, 0.0);      // per stage: bytes one micro-batch keeps
  std::vector<double> transient(n_stages, 0.0);  // per stage: what its backward adds while it runs
  std::vector<double> deferred(n_stages, 0.0);   // per stage: the output gradients a split I keeps for its W
  const HeadBytes head = head_bytes(in, tokens);
  // A tied embedding is one tensor where this rank holds the embedding's stage; the output's
  // stage elsewhere holds a copy of it.
  bool holds_embedding = false;
  for (int s : stages) holds_embedding = holds_embedding || plan.stage_parts[static_cast<size_t>(s)].embedding;
  for (int s : stages) {
    const model::ModelPart& part = plan.stage_parts[static_cast<size_t>(s)];
    double keep = 0, back = 0;
    for (int64_t i = part.first_layer; i < part.end_layer; ++i) {
      params += static_cast<double>(pc.per_block[static_cast<size_t>(i)]);
      keep += block_saved_bytes(in, blocks, i, tokens);
      back = std::max(back, blocks[static_cast<size_t>(i)].backward_transient * tokens + tokens * d * e);
    }
    if (part.embedding) params += static_cast<double>(pc.embedding);
    if (part.head) {
      params += (a.tie_embeddings && holds_embedding ? 0 : d * vocab) + d;
      keep += head.saved;
      back = std::max(back, head.backward);
    }
    if (!part.embedding) keep += tokens * d * e / tp;  // the received hidden states (a leaf)
    if (!part.head) keep += tokens * d * e / tp;       // its output, kept for the backward's start
    saved[static_cast<size_t>(s)] = keep;
    transient[static_cast<size_t>(s)] = back;
    // What a split I keeps for its W: each block's deferred outputs (BlockTerms), the head's
    // logits (Note [Deferred weight gradients]).
    double outputs = 0;
    for (int64_t i = part.first_layer; i < part.end_layer; ++i) outputs += blocks[static_cast<size_t>(i)].deferred_outputs;
    if (part.head) outputs += vocab / tp;
    deferred[static_cast<size_t>(s)] = tokens * outputs * e;
  }
  double live = 0, peak_acts = 0;
  const bool split = in.ac.mode == parallel::AcMode::kNone;  // I defers the weight GEMMs (build_schedule)
  for (const auto& slot : (*plan.order)[static_cast<size_t>(in.pp_rank)]) {
    if (!slot) continue;
    const parallel::pipeline::Action& act = *slot;
    const size_t st = static_cast<size_t>(act.stage);
    if (act.type == parallel::pipeline::ActionType::kForward) {
      live += saved[st];
      peak_acts = std::max(peak_acts, live);
    } else if (act.type == parallel::pipeline::ActionType::kBackwardWeight) {
      peak_acts = std::max(peak_acts, live + transient[st]);
      live -= saved[st] + (split ? deferred[st] : 0);
    } else {
      peak_acts = std::max(peak_acts, live + transient[st]);
      if (act.type == parallel::pipeline::ActionType::kBackward) live -= saved[st];
      if (act.type == parallel::pipeline::ActionType::kBackwardInput && split) {
        live += deferred[st];
        peak_acts = std::max(peak_acts, live);
      }
    }
  }
  MemoryEstimate est;
  const double masters = params * 4 / shard;
  est.parameters = static_cast<int64_t>(masters + ((in.compute_bytes != 4 && in.dp_shard == 1) ? params * e / tp : 0));
  est.optimizer_state = static_cast<int64_t>(params * 8 / shard);
  est.gradients = static_cast<int64_t>(params * 4 / shard);
  // FSDP: the stages' gathered parameters and their unsharded gradients, all step long.
  est.communication = static_cast<int64_t>(in.dp_shard > 1 ? params * e / tp + params * 4 / tp : 0) +
                      static_cast<int64_t>(in.tp > 1 ? 2 * tokens * d * e : 0) +
                      static_cast<int64_t>(2 * tokens * d * e / tp) +  // the two posted receives (Note [Pipeline execution])
                      static_cast<int64_t>(context_parallel_buffers(in, blocks, tokens)) +
                      static_cast<int64_t>(replica_bucket_bytes(in, params * 4 / shard));
  est.activations = static_cast<int64_t>(peak_acts);
  est.total = est.parameters + est.optimizer_state + est.gradients + est.communication + est.activations;
  est.peak_phase = "pp rank " + std::to_string(in.pp_rank) + ": the most micro-batches in flight on its stages";
  for (int s : stages)
    est.activation_detail.push_back({"stage " + std::to_string(s) + ", one micro-batch in flight",
                                     static_cast<int64_t>(saved[static_cast<size_t>(s)])});
  return est;
}

}  // namespace

// See Note [Block terms memo]: per model, its parameter count and, per (tp, compute dtype,
// device, seq_len, float8 TP gather), every block's terms.
struct BlockTermsMemo::Impl {
  struct Key {
    int64_t tp, compute_bytes, seq_len;
    bool cuda, float8_tp_input_all_gather, fused_ops;
    bool operator==(const Key& o) const {
      return tp == o.tp && compute_bytes == o.compute_bytes && seq_len == o.seq_len && cuda == o.cuda &&
             float8_tp_input_all_gather == o.float8_tp_input_all_gather && fused_ops == o.fused_ops;
    }
  };
  model::ModelArgs args;  // the model it serves (the first estimate's)
  bool bound = false;
  model::ParamCount params;
  std::vector<std::pair<Key, std::shared_ptr<const std::vector<BlockTerms>>>> blocks;

  // The memo's model is `a`: the fields the terms read.
  bool serves(const model::ModelArgs& a) const {
    return a.family == args.family && a.n_layers == args.n_layers && a.dim == args.dim &&
           a.vocab_size == args.vocab_size && a.mtp_layers == args.mtp_layers && a.n_heads == args.n_heads &&
           a.n_kv_heads == args.n_kv_heads && a.moe_hidden_dim == args.moe_hidden_dim &&
           a.ffn_hidden_dim() == args.ffn_hidden_dim() && a.tie_embeddings == args.tie_embeddings;
  }
};

BlockTermsMemo::BlockTermsMemo() : impl(std::make_unique<Impl>()) {}
BlockTermsMemo::~BlockTermsMemo() = default;

namespace {

// The parameter count and block terms of `in`, from `memo` when it holds them.
std::pair<model::ParamCount, std::shared_ptr<const std::vector<BlockTerms>>> params_and_blocks(
    const EstimateInputs& in, BlockTermsMemo* memo) {
  if (!memo) return {model::count_params(in.args), std::make_shared<const std::vector<BlockTerms>>(all_block_terms(in))};
  BlockTermsMemo::Impl& m = *memo->impl;
  if (!m.bound) {
    m.args = in.args, m.params = model::count_params(in.args), m.bound = true;
  } else if (!m.serves(in.args)) {
    throw std::invalid_argument("memory estimate: a block terms memo serves one model (" + m.args.family + ", " +
                                std::to_string(m.args.n_layers) + " layers), not " + in.args.family + " with " +
                                std::to_string(in.args.n_layers) + " layers");
  }
  const BlockTermsMemo::Impl::Key key{in.tp, in.compute_bytes, in.seq_len, in.cuda, in.float8_tp_input_all_gather,
                                      in.fused_ops};
  for (const auto& [k, blocks] : m.blocks)
    if (k == key) return {m.params, blocks};
  m.blocks.emplace_back(key, std::make_shared<const std::vector<BlockTerms>>(all_block_terms(in)));
  return {m.params, m.blocks.back().second};
}

}  // namespace

MemoryEstimate estimate_memory(const EstimateInputs& in, BlockTermsMemo* memo) {
  const auto& a = in.args;
  const auto [pc, blocks_memo] = params_and_blocks(in, memo);
  const std::vector<BlockTerms>& blocks = *blocks_memo;
  if (in.local_batch_size < 1 || in.seq_len < 1 || in.grad_accumulation_steps < 1 || in.dp_shard < 1 || in.tp < 1 ||
      in.cp < 1)
    throw std::invalid_argument("memory estimate: batch size, seq_len, gradient accumulation steps and parallel "
                                "degrees must be >= 1");
  // In double: local_batch_size x seq_len may exceed int64 (seq_len 2^62); bytes() refuses
  // what does not fit below.
  // The positions this rank computes: a 1/cp share under context parallelism.
  const double tokens = static_cast<double>(in.local_batch_size) * static_cast<double>(in.seq_len / in.cp);
  const double e = static_cast<double>(in.compute_bytes);
  const double dp = static_cast<double>(in.dp_shard), tp = static_cast<double>(in.tp);
  const double shard = dp * tp;  // every parameter is split over FSDP and TP ranks
  const double block_params = static_cast<double>(pc.per_layer);
  const double params = static_cast<double>(pc.total);
  const double vocab = static_cast<double>(a.vocab_size), d = static_cast<double>(a.dim);

  MemoryEstimate est;
  // Masters float32 + a compute copy when computing in another dtype (single rank: the whole
  // model; FSDP: the gathered copies are communication buffers below).
  const double masters = params * 4 / shard;
  const double compute_copies = (in.compute_bytes != 4 && in.dp_shard == 1) ? params * e / tp : 0;
  const double adam = params * 8 / shard + static_cast<double>(a.n_layers * 9 + 3) * 4;
  const double grad_head = (d * vocab + d) * 4 / shard;   // output + final norm
  const double grads_all = params * 4 / shard;

  // Communication buffers: FSDP keeps the gathered block being computed plus the prefetched
  // next one and reduce-scatters one block's float32 grads; TP all-gathers the sequence shards
  // of a block input. A block gathers its linear weights in float8 (1 byte) under
  // float8.enable_fsdp_float8_all_gather, its two norm weights in the compute dtype. Measured:
  // debugmodel FSDP 2, float32, batch 2 x 32: estimate 0.057 GiB vs 0.060 GiB peak (-5.5%).
  double comm = 0;
  // Under expert parallelism a block's gather holds this rank's experts only (1/ep of them).
  const double expert_params =
      a.moe ? static_cast<double>(a.moe->num_experts * model::family(a.family).routed_expert_params(a)) : 0;
  const double gathered_params = block_params - expert_params * (1.0 - 1.0 / static_cast<double>(in.ep));
  if (in.dp_shard > 1) {
    const double norms = 2 * d;
    const double gathered = in.float8_all_gather ? (gathered_params - norms) * 1 + norms * e : gathered_params * e;
    comm += 2 * gathered / tp + gathered_params * 4 / tp;
  }
  // Expert parallel dispatch: a layer's top_k rows per token sent, received, grouped by expert
  // and returned, in the compute dtype, while the layer runs.
  if (in.ep > 1 && a.moe) comm += 4 * tokens * static_cast<double>(a.moe->top_k) * d * e;
  if (in.tp > 1) comm += 2 * tokens * d * e;
  comm += context_parallel_buffers(in, blocks, tokens);  // See Note [Context parallel memory]
  comm += replica_bucket_bytes(in, grads_all);

  if (in.pipeline) return estimate_pipeline_rank(in, pc, blocks);
  // Block `layer`'s activations, whole (nothing checkpointed) and as its AC mode keeps them.
  auto full_block = [&](int64_t layer) { return sum_terms(blocks[static_cast<size_t>(layer)].full) * tokens; };
  auto saved = [&](int64_t layer) { return block_saved_bytes(in, blocks, layer, tokens); };
  double acts_all = 0;
  const int64_t n_blocks = static_cast<int64_t>(blocks.size());  // with multi-token prediction's
  for (int64_t i = 0; i < n_blocks; ++i) acts_all += saved(i);

  // Multi-token prediction projects every depth's rows through the output too.
  const HeadBytes head = head_bytes(in, tokens * static_cast<double>(1 + a.mtp_layers));
  const double head_fwd = head.saved, head_bwd = head.backward;
  // float8: the 1-byte data of both operands of the largest linear coexist (the high-precision
  // x and W are what the linear saves, as without float8). Casts make no operand-sized
  // temporaries: on the CPU they run in 64 Ki-element slices (Note [Chunked CPU casts]) and the
  // emulated GEMM dequantizes tiles (Note [Emulated GEMM in tiles]); on CUDA the fused
  // kernels cast in one pass, except the TP-sharded tensorwise casts, which take the composite
  // path (x * scale, then the clamp: two float32 temporaries, three from bf16).
  double float8_transient = 0;
  if (!in.float8_recipe.empty()) {
    double hid = 0;  // the widest feed-forward
    for (int64_t i = 0; i < a.n_layers; ++i) hid = std::max(hid, blocks[static_cast<size_t>(i)].ffn_width);
    const double act = tokens * std::max(hid, d) / tp, weight = hid * d / tp;
    float8_transient = act + weight;
    if (!in.cuda) {  // two tiles: >= 512 KiB and >= 256 rows of the longest contraction (d, hidden, tokens)
      const double tile = std::max(double{512 << 10}, 256.0 * 4 * std::max({hid, d, tokens}));
      float8_transient += 2 * tile + 2 * (64 << 10) * 4;
    }
    else if (in.tp > 1) float8_transient += std::max(act, weight) * (in.compute_bytes == 4 ? 8 : 12);
  }

  const double static_bytes = masters + compute_copies + adam + comm;
  const double grads_before = in.grad_accumulation_steps > 1 ? grads_all : 0;
  auto transient_block = [&](int64_t layer) {
    return blocks[static_cast<size_t>(layer)].backward_transient * tokens + float8_transient;
  };

  struct Phase {
    std::string name;
    double grads;        // gradient bytes alive
    double activations;  // activation (and activation-gradient) bytes alive
  };
  // Backward of block i: blocks < i keep what they saved; block i holds its full activations
  // (recomputed if checkpointed); gradients of blocks >= i exist. Linear in i where the blocks
  // are alike (the extremes i = L-1 and i = 0 bound it); every block is a candidate where they
  // differ (DeepSeek-V3's dense first blocks).
  // Each block's parameters; a multi-token prediction depth's: what count_params has beyond the
  // layers, the embedding, the final norm and the output, per depth.
  std::vector<double> block_param_counts(pc.per_block.begin(), pc.per_block.end());
  if (a.mtp_layers > 0) {
    double rest = params - static_cast<double>(pc.embedding) - d - (a.tie_embeddings ? 0.0 : vocab * d);
    for (int64_t p : pc.per_block) rest -= static_cast<double>(p);
    block_param_counts.insert(block_param_counts.end(), static_cast<size_t>(a.mtp_layers),
                              rest / static_cast<double>(a.mtp_layers));
  }
  std::vector<double> grads_from(static_cast<size_t>(n_blocks) + 1, grad_head);  // head + blocks >= i
  for (int64_t i = n_blocks - 1; i >= 0; --i)
    grads_from[static_cast<size_t>(i)] =
        grads_from[static_cast<size_t>(i) + 1] + block_param_counts[static_cast<size_t>(i)] * 4 / shard;
  auto block_phase = [&](std::string name, int64_t i) {
    double acts = 0;
    for (int64_t j = 0; j < i; ++j) acts += saved(j);
    acts += parallel::block_is_checkpointed(in.ac, i) ? full_block(i) : saved(i);
    acts += transient_block(i) + tokens * d * e;  // + the incoming gradient [T, D]
    return Phase{std::move(name), std::max(grads_before, grads_from[static_cast<size_t>(i)]), acts};
  };
  std::vector<Phase> phases = {
      {"backward of the output layer (all activations alive)", std::max(grads_before, grad_head),
       acts_all + head_fwd + head_bwd},
      block_phase("backward of the last block", n_blocks - 1),
      block_phase("backward of the first block", 0),
  };
  bool alike = true;
  for (int64_t i = 1; i < n_blocks; ++i)
    alike = alike && block_param_counts[static_cast<size_t>(i)] == block_param_counts[0] &&
            sum_terms(blocks[static_cast<size_t>(i)].full) == sum_terms(blocks[0].full);
  for (int64_t i = 1; !alike && i + 1 < n_blocks; ++i) phases.push_back(block_phase("backward of block " + std::to_string(i), i));
  phases.push_back({"end of backward (all gradients)", grads_all, 0.0});
  const Phase* peak = &phases[0];
  for (const Phase& p : phases)
    if (p.grads + p.activations > peak->grads + peak->activations) peak = &p;
  est.peak_phase = peak->name;
  const double grads_at_peak = peak->grads;
  const double peak_dynamic = peak->grads + peak->activations;

  // A byte count the report can hold: anything at or beyond 2^63 bytes (8 EiB) is an input
  // error (seq_len or batch far too large), said as such instead of a wrapped negative number.
  auto bytes = [&](double v) {
    if (!(v < 9.2e18)) {
      throw std::overflow_error("memory estimate: more than 8 EiB per rank (local_batch_size " +
                                std::to_string(in.local_batch_size) + " x seq_len " +
                                std::to_string(in.seq_len) + " tokens per micro-batch); lower them");
    }
    return static_cast<int64_t>(v);
  };
  est.parameters = bytes(masters + compute_copies);
  est.optimizer_state = bytes(adam);
  est.communication = bytes(comm);
  est.gradients = bytes(grads_at_peak);
  est.activations = bytes(std::max(0.0, peak_dynamic - grads_at_peak));
  est.total = bytes(static_bytes + peak_dynamic);
  // The detail is the last block's (an MoE one where a family starts dense).
  const BlockTerms& bt = blocks.back();
  for (const auto& [name, v] : bt.full)
    est.activation_detail.push_back({name, bytes(v * tokens)});
  est.activation_detail.push_back({"per block, kept by per-op AC", bytes(bt.kept_op * tokens)});
  est.activation_detail.push_back({"per block, kept by full AC (its input)", bytes(bt.input * tokens)});
  est.activation_detail.push_back({"head (norm, logits, log-softmax)", bytes(head_fwd)});
  return est;
}

EstimateInputs estimate_inputs_from_config(const config::JobConfig& cfg) {
  int64_t vocab = 0;
  std::string vocab_note;
  try {
    vocab = model::trained_model_args(cfg.model.name, cfg.model.flavor,
                                      data::make_tokenizer(cfg.model.tokenizer_path)->vocab_size())
                .vocab_size;
  } catch (const std::exception& e) {
    // The estimate should answer before the assets are in place: the flavor's vocabulary.
    vocab_note = std::string("tokenizer not readable (") + e.what() + "): assuming the " + cfg.model.flavor +
                 " flavor's vocab " + std::to_string(model::model_flavor(cfg.model.name, cfg.model.flavor).vocab_size);
  }
  const char* ws = std::getenv("WORLD_SIZE");
  EstimateInputs in = estimate_inputs_from_config(cfg, ws ? std::max<int64_t>(1, std::atoll(ws)) : 1, vocab);
  if (!vocab_note.empty()) in.notes.push_back(vocab_note);
  in.cuda = cfg.training.device == "cuda";
  if (in.cuda) {
    in.device_name = "cuda";
#ifdef TITAN_WITH_CUDA
    in.device_capacity = memory_stats(c10::Device(c10::kCUDA, 0)).device_capacity;
#else
    in.device_capacity = 0;  // a CPU-only build cannot ask the GPU; the verdict says "unknown"
#endif
  } else {
    in.device_name = "cpu (total RAM)";
    in.device_capacity = total_ram_bytes();
  }
  return in;
}

EstimateInputs estimate_inputs_from_config(const config::JobConfig& cfg, int64_t world, int64_t vocab_size,
                                           const parallel::pipeline::PipelinePlan* pipeline) {
  EstimateInputs in;
  in.args = model::model_flavor(cfg.model.name, cfg.model.flavor);
  in.args.mtp_layers = cfg.model.mtp_layers;
  if (in.args.moe) {
    // The MoE blocks' terms model one SwiGLU per token of a token's rows (ffn_width).
    const int64_t rows = in.args.moe->top_k + in.args.moe->num_shared_experts;
    in.notes.push_back("mixture of experts: an MoE block's activations as one SwiGLU of (top_k + shared) x "
                       "moe_hidden_dim = " + std::to_string(rows * in.args.moe_hidden_dim) +
                       " per token; the router's and the reorder's buffers are not modeled yet");
  }
  for (const char* converter : {"quantize.grouped_mm.float8", "quantize.grouped_mm.mx"})
    if (in.args.moe && std::find(cfg.model.converters.begin(), cfg.model.converters.end(), converter) !=
                           cfg.model.converters.end())
      // Each expert's low-precision linears save their high-precision operands, as the
      // high-precision experts do; the casts live within one expert's GEMM, a fraction of a group.
      in.notes.push_back(std::string(converter) + ": the experts' saved activations as in high precision (each "
                         "expert's linears save their high-precision rows); the casts are transient per expert GEMM");
  if (vocab_size > 0) in.args.vocab_size = vocab_size;
  in.args.max_seq_len = cfg.training.seq_len;
  in.local_batch_size = cfg.training.local_batch_size;
  in.seq_len = cfg.training.seq_len;
  in.compute_bytes = cfg.training.mixed_precision_param == "bfloat16" ? 2 : 4;
  in.ac = parallel::parse_ac_options(cfg.activation_checkpoint.mode,
                                     cfg.activation_checkpoint.selective_ac_option);
  const bool float8 = cfg.float8.enable_float8_linear ||
                      std::find(cfg.model.converters.begin(), cfg.model.converters.end(),
                                "float8") != cfg.model.converters.end();
  if (float8) in.float8_recipe = cfg.float8.recipe_name;
  in.float8_all_gather = float8 && cfg.float8.enable_fsdp_float8_all_gather;
  // The TP input gather in float8 is a tensorwise recipe's (block-scaled recipes have no such
  // gather: their names are not float8::recipe_names()).
  if (float8 && cfg.float8.tp_input_all_gather && !float8::is_block_scaled_recipe_name(cfg.float8.recipe_name)) {
    const float8::Float8Recipe r = float8::recipe_from_name(cfg.float8.recipe_name);
    in.float8_tp_input_all_gather = !r.delayed && !r.grad_weight_high_precision &&
                                    r.input.granularity == float8::ScalingGranularity::Tensorwise;
  }
  in.tp = cfg.parallelism.tensor_parallel_degree;
  const int64_t replicate = cfg.parallelism.data_parallel_replicate_degree;
  in.dp_replicate = replicate;
  const int64_t pp = cfg.parallelism.pipeline_parallel_degree;
  in.cp = cfg.parallelism.context_parallel_degree;
  if (in.args.moe) in.ep = cfg.parallelism.expert_parallel_degree;
  try {
    in.cp_rotate_method = parallel::context_parallel::cp_rotate_method_from_name(cfg.parallelism.context_parallel_rotate_method);
  } catch (const std::invalid_argument&) {
    // the key table admits only valid names; keep the default for a hand-built config
  }
  const int64_t dp_shard = cfg.parallelism.data_parallel_shard_degree > 0
                               ? cfg.parallelism.data_parallel_shard_degree
                               : std::max<int64_t>(1, world / (replicate * in.tp * pp * in.cp));
  in.dp_shard = dp_shard * in.cp;  // FSDP's group: dp_shard x cp
  if (pp > 1 && pipeline)
    in.pipeline = std::shared_ptr<const parallel::pipeline::PipelinePlan>(std::shared_ptr<void>(), pipeline);  // the caller's, not owned
  else if (pp > 1)
    in.pipeline = std::make_shared<const parallel::pipeline::PipelinePlan>(parallel::pipeline::plan_pipeline(
        config::pipeline_config(cfg), static_cast<int>(pp), in.args.n_layers, cfg.training.local_batch_size));
  const int64_t dp = dp_shard * replicate;  // the batch splits over dp only, not cp
  const int64_t global = cfg.training.global_batch_size > 0 ? cfg.training.global_batch_size
                                                            : cfg.training.local_batch_size * dp;
  in.grad_accumulation_steps = std::max<int64_t>(1, global / (cfg.training.local_batch_size * dp));
  in.cuda = cfg.training.device == "cuda";
  in.fused_ops = model::fused_ops_run_on(in.cuda);
  return in;
}

std::string format_memory_estimate(const EstimateInputs& in, const MemoryEstimate& e) {
  std::ostringstream os;
  const auto& a = in.args;
  os << "memory estimate per rank: " << a.family << " dim " << a.dim << ", " << a.n_layers << " layers, vocab "
     << a.vocab_size << "; batch " << in.local_batch_size << " x seq " << in.seq_len
     << (in.grad_accumulation_steps > 1 ? " (" + std::to_string(in.grad_accumulation_steps) +
                                              " micro-batches)" : std::string())
     << "; compute " << (in.compute_bytes == 2 ? "bfloat16" : "float32") << "; AC "
     << parallel::describe_ac(in.ac) << "; float8 "
     << (in.float8_recipe.empty() ? std::string("off") : in.float8_recipe)
     << (in.float8_all_gather && in.dp_shard > 1 ? " (float8 all-gather)" : "") << "; FSDP " << in.dp_shard
     << " x TP " << in.tp;
  if (in.cp > 1) os << " x CP " << in.cp << " (" << parallel::context_parallel::cp_rotate_method_name(in.cp_rotate_method) << ")";
  if (in.ep > 1) os << "; EP " << in.ep << " (experts FSDP-sharded over the other " << in.dp_shard / in.ep << ")";
  if (in.pipeline)
    os << " x PP " << in.pipeline->pp << " (" << in.pipeline->schedule_name << ", pp rank " << in.pp_rank << ", "
       << in.pipeline->microbatches << " micro-batches of " << in.pipeline->microbatch_rows << " rows)";
  os << "\n";
  os << "  parameters       " << gib(e.parameters) << "\n"
     << "  gradients        " << gib(e.gradients) << "   (at the peak)\n"
     << "  optimizer state  " << gib(e.optimizer_state) << "\n"
     << "  activations      " << gib(e.activations) << "   (at the peak: " << e.peak_phase << ")\n"
     << "  communication    " << gib(e.communication) << "\n"
     << "  total (peak)     " << gib(e.total) << "   (" << e.total << " bytes)\n";
  os << "  activation terms (one block unless stated):\n";
  for (const auto& [name, bytes] : e.activation_detail)
    os << "    " << gib(bytes) << "  " << name << "\n";
  for (const auto& note : in.notes) os << "  note: " << note << "\n";
  if (in.device_capacity > 0) {
    const double pct = 100.0 * e.total / in.device_capacity;
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.1f%%", pct);
    os << "  device " << in.device_name << ": " << gib(in.device_capacity) << " -> "
       << (e.total <= in.device_capacity ? "fits" : "does NOT fit") << " (" << buf << ")\n";
  } else {
    os << "  device " << in.device_name << ": capacity unknown\n";
  }
  return os.str();
}

std::string memory_shortfall(const config::JobConfig& cfg, int pp_rank, double margin) {
  EstimateInputs in = estimate_inputs_from_config(cfg);
  in.pp_rank = pp_rank;
  const int64_t capacity = in.device_capacity;
  if (capacity <= 0) return "";
  auto gib = [](int64_t bytes) {  // "12.3 GiB"
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.1f GiB", static_cast<double>(bytes) / double(1ll << 30));
    return std::string(buf);
  };
  const MemoryEstimate e = estimate_memory(in);
  if (static_cast<double>(e.total) <= margin * static_cast<double>(capacity)) return "";
  const int64_t state = e.parameters + e.gradients + e.optimizer_state;
  std::ostringstream os;
  os << "the memory estimate for this rank is " << gib(e.total) << ", more than the " << gib(capacity) << " of "
     << in.device_name << ": ";
  if (e.activations >= state) {
    os << "activations " << gib(e.activations) << " for training.local_batch_size " << in.local_batch_size
       << " x training.seq_len " << in.seq_len << " (activation checkpointing: " << parallel::describe_ac(in.ac)
       << "); lower training.local_batch_size or training.seq_len (training.global_batch_size keeps the batch "
          "through gradient accumulation), checkpoint activations (activation_checkpoint.mode full), or split the "
          "sequence over more ranks (parallelism.context_parallel_degree)";
  } else {
    os << "parameters, gradients and optimizer state " << gib(state) << " for model.flavor " << cfg.model.flavor
       << "; shard them over more ranks (parallelism.data_parallel_shard_degree, tensor_parallel_degree, "
          "pipeline_parallel_degree)";
  }
  os << ". titan-train --estimate-memory prints the whole estimate";
  return os.str();
}

}  // namespace titan::trainer::observe
