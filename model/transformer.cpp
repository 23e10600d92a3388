// model/transformer.cpp — see transformer.h.
#include "model/transformer.h"
#include "model/param_path.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/rms_norm.h>
#include <ATen/ops/outer.h>
#include <ATen/ops/pow.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <vector>

#include "model/activation_checkpoint_ops.h"
#include "model/document_attention.h"
#include "model/kernels/fused_ops.h"
#include "model/scope.h"

namespace titan::model {
namespace {

at::Tensor meta_tensor(at::IntArrayRef shape) {
  return at::empty(shape, at::TensorOptions().device(c10::kMeta).dtype(at::kFloat));
}

void make_linear_meta(Linear& linear) {
  linear.weight = meta_tensor({linear.out_features(), linear.in_features()});
}

}  // namespace

// ---------------------------------------------------------------- RMSNorm

RMSNorm::RMSNorm(std::string fqn_, int64_t dim, double eps_)
    : fqn(std::move(fqn_)), eps(eps_), weight(meta_tensor({dim})) {}

at::Tensor RMSNorm::forward(const at::Tensor& x) const {
  // torchtitan's nn.RMSNorm (F.rms_norm): normalized and scaled in float32 whatever the compute
  // dtype, one rounding to it at the end; bf16 activations with bf16 weights (the compute copies)
  // run the fused kernel's bf16 form, which is exactly that (model/kernels/fused_ops.h); float64
  // and mixed dtypes run ATen's composite, which promotes the same way.
  return fused_rms_norm(x, weight, eps);
}

void RMSNorm::visit_params(const ParamVisitor& visit) { visit(fqn + ".weight", weight); }

// ---------------------------------------------------------------- RoPE

RotaryTable make_rotary_table(int64_t head_dim, int64_t max_seq_len, double theta,
                              c10::Device device, const RopeScaling& scaling) {
  TORCH_CHECK(head_dim % 2 == 0, "RoPE needs an even head_dim, got ", head_dim);
  auto f64 = at::TensorOptions().dtype(at::kDouble);
  // freqs[i] = theta^(-2i / head_dim), then Llama 3.1's scaling (head_dim / 2 scalars, so a
  // plain loop); angles computed in float64 then stored as float32.
  std::vector<double> scaled(head_dim / 2);
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    scaled[i] = scaling.scale(1.0 / std::pow(theta, 2.0 * i / static_cast<double>(head_dim)));
  }
  at::Tensor freqs = at::tensor(scaled, f64);
  at::Tensor angles = at::outer(at::arange(max_seq_len, f64), freqs);
  return {angles.cos().to(at::kFloat).to(device), angles.sin().to(at::kFloat).to(device)};
}

at::Tensor apply_rotary(const at::Tensor& x, const RotaryTable& table) {
  const int64_t seq_len = x.size(1);
  TORCH_CHECK(seq_len <= table.cos.size(0), "sequence length ", seq_len,
              " exceeds the RoPE table (", table.cos.size(0), " positions)");
  // One fused pass for float32 (bit-identical to the composite, which runs for other dtypes).
  return fused_rotary(x, table.cos, table.sin);
}

at::Tensor apply_rotary_half(const at::Tensor& x, const RotaryTable& table) {
  const int64_t seq_len = x.size(1), half = x.size(3) / 2;
  TORCH_CHECK(seq_len <= table.cos.size(0), "sequence length ", seq_len,
              " exceeds the RoPE table (", table.cos.size(0), " positions)");
  // [S, hd/2] -> [1, S, 1, hd/2]: every batch row and head; in the activations' dtype, as
  // torchtitan's Qwen3 casts its cache.
  const at::Tensor cos = table.cos.narrow(0, 0, seq_len).view({1, seq_len, 1, half}).to(x.scalar_type());
  const at::Tensor sin = table.sin.narrow(0, 0, seq_len).view({1, seq_len, 1, half}).to(x.scalar_type());
  const at::Tensor x1 = x.narrow(3, 0, half), x2 = x.narrow(3, half, half);
  return at::cat({x1 * cos - x2 * sin, x2 * cos + x1 * sin}, 3);
}

// ---------------------------------------------------------------- Attention

Attention::Attention(const std::string& prefix, const ModelArgs& args)
    : n_heads(args.n_heads),
      n_kv_heads(args.kv_heads()),
      head_dim(args.head_dim()),
      wq(prefix + ".wq", args.dim, args.n_heads * args.head_dim()),
      wk(prefix + ".wk", args.dim, args.kv_heads() * args.head_dim()),
      wv(prefix + ".wv", args.dim, args.kv_heads() * args.head_dim()),
      wo(prefix + ".wo", args.n_heads * args.head_dim(), args.dim),
      rope_rotate_half(args.rope_rotate_half) {
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

at::Tensor Attention::forward(const at::Tensor& x_in, const RotaryTable& rope, const at::Tensor& documents) const {
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
  const auto rotate = rope_rotate_half ? apply_rotary_half : apply_rotary;
  q = rotate(q, rope).transpose(1, 2);  // [B, H, S, hd]
  k = rotate(k, rope).transpose(1, 2);
  v = v.transpose(1, 2);
  // Causal SDPA through the op layer, so per-op selective AC can keep its output; under context
  // parallelism, attention over the whole sequence with keys and values from the other ranks;
  // block-causal: per document (See Note [Document-masked attention]).
  at::Tensor out = sdpa                  ? sdpa(q, k, v, documents)
                   : documents.defined() ? document_causal_attention(q, k, v, documents)
                                         : attention_op(q, k, v);  // [B, H, S, hd]
  return wo.forward(out.transpose(1, 2).reshape({batch, seq, -1}));  // [B, S, D]
}

void Attention::visit_params(const ParamVisitor& visit) {
  for (Linear* l : {&wq, &wk, &wv, &wo}) visit(l->fqn() + ".weight", l->weight);
  if (q_norm) {
    q_norm->visit_params(visit);
    k_norm->visit_params(visit);
  }
}

// ---------------------------------------------------------------- FeedForward

FeedForward::FeedForward(const std::string& prefix, int64_t dim, int64_t hidden_dim)
    : w1(prefix + ".w1", dim, hidden_dim),
      w2(prefix + ".w2", hidden_dim, dim),
      w3(prefix + ".w3", dim, hidden_dim) {
  for (Linear* l : {&w1, &w2, &w3}) make_linear_meta(*l);
}

at::Tensor FeedForward::forward(const at::Tensor& x_in) const {
  const LinearOperand x = prepare_input ? prepare_input(x_in) : LinearOperand(x_in);
  // w1 before w3, explicitly: per-op AC counts matrix products in call order (every second one
  // is recomputed), so the order must not be left to unspecified argument evaluation.
  at::Tensor gate = w1.forward(x);  // [B, S, hidden]
  at::Tensor up = w3.forward(x);    // [B, S, hidden]
  return w2.forward(fused_swiglu(gate, up));  // silu(gate) * up, one pass
}

void FeedForward::visit_params(const ParamVisitor& visit) {
  for (Linear* l : {&w1, &w2, &w3}) visit(l->fqn() + ".weight", l->weight);
}

// ---------------------------------------------------------------- TransformerBlock

TransformerBlock::TransformerBlock(int64_t id, const ModelArgs& args)
    : layer_id(id),
      attention(layer_path(id, "attention"), args),
      attention_norm(layer_path(id, "attention_norm"), args.dim, args.norm_eps),
      ffn_norm(layer_path(id, "ffn_norm"), args.dim, args.norm_eps) {
  if (args.moe)
    moe = std::make_unique<moe::MoE>(layer_path(id, "moe"), *args.moe, args.dim, args.moe_hidden_dim);
  else
    feed_forward.emplace(layer_path(id, "feed_forward"), args.dim, args.ffn_hidden_dim());
}

at::Tensor TransformerBlock::forward(const at::Tensor& x, const RotaryTable& rope, const at::Tensor& documents) const {
  at::Tensor h;
  {
    NamedScope scope("attention");
    h = x + attention.forward(attention_norm.forward(x), rope, documents);
  }
  if (moe) {
    NamedScope scope("moe");
    return h + moe->forward(ffn_norm.forward(h));
  }
  NamedScope scope("feed_forward");
  return h + feed_forward->forward(ffn_norm.forward(h));
}

// torchtitan's parameter order within a block: attention, feed_forward (or moe), attention_norm, ffn_norm.
void TransformerBlock::visit_params(const ParamVisitor& visit) {
  attention.visit_params(visit);
  if (moe)
    moe->visit_params(visit);
  else
    feed_forward->visit_params(visit);
  attention_norm.visit_params(visit);
  ffn_norm.visit_params(visit);
}

// ---------------------------------------------------------------- Transformer

Transformer::Transformer(const ModelArgs& args)
    : args_(args),
      tok_embeddings_weight_(meta_tensor({args.vocab_size, args.dim})),
      norm_("norm", args.dim, args.norm_eps),
      output_("output", args.dim, args.vocab_size) {
  TORCH_CHECK(args.vocab_size > 0, "model vocab_size must be set (got ", args.vocab_size, ")");
  for (int64_t i = 0; i < args.n_layers; ++i)
    layers_.push_back(std::make_unique<TransformerBlock>(i, args));
  make_linear_meta(output_);
}

void Transformer::visit_params(const ParamVisitor& visit) {
  visit("tok_embeddings.weight", tok_embeddings_weight_);
  for (auto& layer : layers_) layer->visit_params(visit);
  norm_.visit_params(visit);
  if (!args_.tie_embeddings) visit("output.weight", output_.weight);  // tied: the embedding itself
}

std::vector<TransformerBlock*> Transformer::blocks() {
  std::vector<TransformerBlock*> all;
  for (auto& layer : layers_) all.push_back(layer.get());
  return all;
}

std::vector<Linear*> Transformer::linears() {
  std::vector<Linear*> all;
  for (auto& layer : layers_) {
    Attention& a = layer->attention;
    for (Linear* l : {&a.wq, &a.wk, &a.wv, &a.wo}) all.push_back(l);
    if (layer->feed_forward)
      for (Linear* l : {&layer->feed_forward->w1, &layer->feed_forward->w2, &layer->feed_forward->w3}) all.push_back(l);
    // An MoE layer's shared experts are linears; its router gate is not converted (torchtitan's
    // MoE configs filter "router.gate" from float8) and its experts are stacked weights.
    if (layer->moe && layer->moe->shared_w1)
      for (Linear* l : {&*layer->moe->shared_w1, &*layer->moe->shared_w2, &*layer->moe->shared_w3}) all.push_back(l);
  }
  all.push_back(&output_);
  return all;
}

void Transformer::materialize(c10::Device device, c10::ScalarType dtype) {
  visit_params([&](const std::string&, at::Tensor& p) {
    p = at::empty(p.sizes(), at::TensorOptions().device(device).dtype(dtype));
  });
  materialize_buffers(device);
}

void Transformer::materialize_buffers(c10::Device device) {
  rope_ = make_rotary_table(args_.head_dim(), args_.max_seq_len, args_.rope_theta, device,
                            args_.rope_scaling);
  // MoE layers: the load-balancing bias starts at zero (a checkpoint may then restore it) and the
  // token counts are zero until the first forward.
  for (auto& layer : layers_) {
    if (!layer->moe) continue;
    const auto f32 = at::TensorOptions().device(device).dtype(at::kFloat);
    layer->moe->tokens_per_expert = at::zeros({args_.moe->num_experts}, f32);
    if (args_.moe->load_balance_coeff) layer->moe->expert_bias = at::zeros({args_.moe->num_experts}, f32);
  }
}

void Transformer::visit_buffers(const ParamVisitor& visit) {
  for (auto& layer : layers_)
    if (layer->moe && layer->moe->expert_bias.defined()) visit(layer->moe->prefix + ".expert_bias", layer->moe->expert_bias);
}

namespace {

// wrappers[0] innermost: each one's run calls the forward composed so far.
ForwardFn compose(ForwardFn run, const std::vector<ForwardWrapper>& wrappers) {
  for (const ForwardWrapper& w : wrappers)
    run = [wrap = w.run, inner = std::move(run)](const at::Tensor& x) { return wrap(x, inner); };
  return run;
}

// "fsdp(group 4) > ac(full)": outermost first.
std::string chain(const std::vector<ForwardWrapper>& wrappers) {
  std::string out;
  for (auto it = wrappers.rbegin(); it != wrappers.rend(); ++it) out += (out.empty() ? "" : " > ") + it->name;
  return out;
}

}  // namespace

void Transformer::wrap_block(int64_t layer_id, ForwardWrapper wrapper) {
  TORCH_CHECK(layer_id >= 0 && layer_id < args_.n_layers, "wrap_block: no layer ", layer_id);
  if (block_wrappers_.empty()) block_wrappers_.resize(static_cast<size_t>(args_.n_layers));
  block_wrappers_[static_cast<size_t>(layer_id)].push_back(std::move(wrapper));
}

void Transformer::wrap_stage(Stage stage, ForwardWrapper wrapper) {
  (stage == Stage::kEmbedding ? embedding_wrappers_ : head_wrappers_).push_back(std::move(wrapper));
}

void Transformer::set_embedding_compute(std::string name, EmbeddingCompute compute) {
  embedding_compute_name_ = std::move(name);
  embedding_compute_ = std::move(compute);
}

std::vector<std::string> Transformer::describe(const std::function<bool(const std::string& module)>& holds) const {
  auto held = [&](const std::string& module) { return !holds || holds(module); };
  // (line with the layer number replaced by '#', layer ids) in first-seen order.
  std::vector<std::pair<std::string, std::vector<int64_t>>> lines;
  auto add = [&](int64_t layer, const std::string& line) {
    for (auto& l : lines)
      if (l.first == line) return l.second.push_back(layer);
    lines.push_back({line, {layer}});
  };
  std::string embedding = "tok_embeddings: " + embedding_compute_name_;
  if (!embedding_wrappers_.empty()) embedding += " > " + chain(embedding_wrappers_);
  if (held("tok_embeddings")) add(-1, embedding);
  for (const auto& layer : layers_) {
    if (!held(layer_path(layer->layer_id))) continue;
    const size_t id = static_cast<size_t>(layer->layer_id);
    if (id < block_wrappers_.size() && !block_wrappers_[id].empty())
      add(layer->layer_id, "layers.#: " + chain(block_wrappers_[id]));
    const Attention& a = layer->attention;
    std::vector<const Linear*> linears = {&a.wq, &a.wk, &a.wv, &a.wo};
    if (layer->feed_forward)
      for (const Linear* l : {&layer->feed_forward->w1, &layer->feed_forward->w2, &layer->feed_forward->w3})
        linears.push_back(l);
    if (layer->moe) {
      linears.push_back(&layer->moe->gate);
      if (layer->moe->shared_w1)
        for (const Linear* l : {&*layer->moe->shared_w1, &*layer->moe->shared_w2, &*layer->moe->shared_w3})
          linears.push_back(l);
    }
    for (const Linear* l : linears) {
      const std::string& fqn = l->fqn();
      add(layer->layer_id, layer_pattern(fqn, "#") + ": " + l->compute()->describe());
    }
    if (!a.sdpa_name.empty()) add(layer->layer_id, "layers.#.attention.sdpa: " + a.sdpa_name);
  }
  std::string head = "output: " + output_.compute()->describe();
  if (!head_wrappers_.empty()) head = "norm+output: " + chain(head_wrappers_) + "; " + head;
  if (held("output")) add(-1, head);
  std::vector<std::string> out;
  for (const auto& [line, ids] : lines) {
    const size_t hash = line.find('#');
    if (hash == std::string::npos) {
      out.push_back(line);
      continue;
    }
    std::string ranges;  // "0-5" or "1,3,5"
    for (size_t i = 0; i < ids.size();) {
      size_t j = i;
      while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
      ranges += (ranges.empty() ? "" : ",") + std::to_string(ids[i]) +
                (j > i ? "-" + std::to_string(ids[j]) : std::string());
      i = j + 1;
    }
    out.push_back(line.substr(0, hash) + ranges + line.substr(hash + 1));
  }
  return out;
}

bool ModelPart::holds(const std::string& module) const {
  if (module == "tok_embeddings") return embedding;
  if (module == "norm" || module == "output") return head;
  const std::optional<LayerPath> block = parse_layer_path(module);
  if (!block) return false;
  return block->layer >= first_layer && (end_layer < 0 || block->layer < end_layer);
}

at::Tensor Transformer::forward(const at::Tensor& tokens, const RotaryTable& rope, const at::Tensor& documents) {
  const bool find = args_.block_causal && !documents.defined() && tokens.dim() == 2;
  return forward_part(tokens, rope, {}, find ? document_ids(tokens, args_.eos_id) : documents);
}

at::Tensor Transformer::forward_part(const at::Tensor& input, const RotaryTable& rope, const ModelPart& part,
                               const at::Tensor& documents_in) {
  const int64_t end_layer = part.end_layer < 0 ? args_.n_layers : part.end_layer;
  TORCH_CHECK(part.first_layer >= 0 && part.first_layer <= end_layer && end_layer <= args_.n_layers,
              "Transformer::forward_part: layers [", part.first_layer, ", ", end_layer, ") of ", args_.n_layers);
  at::Tensor h = input;
  // Block-causal: each position's document (found from the rows' EOS by the caller); causal: none.
  TORCH_CHECK(!args_.block_causal || (documents_in.defined() && documents_in.dim() == 2 &&
                                      documents_in.size(0) == input.size(0)),
              "Transformer::forward_part: a block-causal model needs the documents of the rows [batch, seq] (document_ids), got ",
              documents_in.defined() ? documents_in.sizes() : at::IntArrayRef{}, " for input ", input.sizes());
  const at::Tensor documents = args_.block_causal ? documents_in : at::Tensor();
  if (part.embedding) {
    TORCH_CHECK(input.dim() == 2, "Transformer::forward expects tokens [batch, seq], got shape ", input.sizes());
    TORCH_CHECK(rope.cos.size(0) >= input.size(1), "Transformer::forward: the RoPE table has ", rope.cos.size(0),
                " positions for ", input.size(1), " tokens");
    ForwardFn embed = [this](const at::Tensor& t) {
      return embedding_compute_ ? embedding_compute_(t, tok_embeddings_weight_)
                                : at::embedding(tok_embeddings_weight_, t);  // [B, S, D]
    };
    h = compose(std::move(embed), embedding_wrappers_)(input);
    if (output_observer_) output_observer_("tok_embeddings", h);
  } else {
    TORCH_CHECK(input.dim() == 3 && input.size(2) == args_.dim, "Transformer::forward_part expects hidden states [batch, seq, ",
                args_.dim, "], got shape ", input.sizes());
  }
  static const std::vector<ForwardWrapper> kNoWrappers;
  for (int64_t i = part.first_layer; i < end_layer; ++i) {
    TransformerBlock* block = layers_[static_cast<size_t>(i)].get();
    const size_t id = static_cast<size_t>(block->layer_id);
    // The table by value: activation checkpointing calls `run` again in backward, after the
    // caller's table may be gone.
    ForwardFn run = [block, rope, documents](const at::Tensor& x) { return block->forward(x, rope, documents); };
    NamedScope scope(layer_path(block->layer_id));
    h = compose(std::move(run), id < block_wrappers_.size() ? block_wrappers_[id] : kNoWrappers)(h);
    if (output_observer_) output_observer_(layer_path(block->layer_id), h);
  }
  if (!part.head) return h;
  ForwardFn head = [this](const at::Tensor& x) {
    // Tied (Qwen3's small flavors): the output projection multiplies by the embedding's slot as it
    // is now (whatever materialize or a checkpoint load put there), so both uses share one
    // parameter and its gradient sums theirs.
    if (args_.tie_embeddings) output_.weight = tok_embeddings_weight_;
    return output_.forward(norm_.forward(x));
  };
  NamedScope scope("output");
  at::Tensor logits = compose(std::move(head), head_wrappers_)(h);  // [B, S, vocab]
  if (output_observer_) output_observer_("output", logits);
  return logits;
}

}  // namespace titan::model
