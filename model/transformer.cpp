// model/transformer.cpp — see transformer.h.
#include "model/transformer.h"
#include "model/param_path.h"

#include <ATen/ops/zeros.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <vector>

#include "model/document_attention.h"
#include "model/scope.h"

namespace titan::model {

// ---------------------------------------------------------------- TransformerBlock

TransformerBlock::TransformerBlock(int64_t id, const ModelArgs& args, const Family& family)
    : layer_id(id),
      feed_forward_kind(family.feed_forward(args, id)),
      attention(family.make_attention(layer_path(id, "attention"), args, id)),
      attention_norm(layer_path(id, "attention_norm"), args.dim, args.norm_eps),
      ffn_norm(layer_path(id, "ffn_norm"), args.dim, args.norm_eps) {
  switch (feed_forward_kind) {
    case FeedForwardKind::kDense:
      feed_forward.emplace(layer_path(id, "feed_forward"), args.dim, args.ffn_hidden_dim());
      break;
    case FeedForwardKind::kMoE:
      TORCH_CHECK(args.moe, "layer ", id, " is an MoE block, but the model arguments hold no MoE layer (ModelArgs::moe)");
      moe = std::make_unique<moe::MoE>(layer_path(id, "moe"), *args.moe, args.dim, args.moe_hidden_dim);
      break;
    case FeedForwardKind::kNone:
      break;
  }
}

at::Tensor TransformerBlock::forward(const at::Tensor& x, const RotaryTable& rope, const at::Tensor& documents) const {
  at::Tensor h;
  {
    NamedScope scope("attention");
    h = x + attention->forward(attention_norm.forward(x), rope, documents);
  }
  if (moe) {
    NamedScope scope("moe");
    return h + moe->forward(ffn_norm.forward(h));
  }
  if (!feed_forward) return h;
  NamedScope scope("feed_forward");
  return h + feed_forward->forward(ffn_norm.forward(h));
}

// torchtitan's parameter order within a block: attention, feed_forward (or moe), attention_norm, ffn_norm.
void TransformerBlock::visit_params(const ParamVisitor& visit) {
  attention->visit_params(visit);
  if (moe) moe->visit_params(visit);
  if (feed_forward) feed_forward->visit_params(visit);
  attention_norm.visit_params(visit);
  if (feed_forward_kind != FeedForwardKind::kNone) ffn_norm.visit_params(visit);
}

std::vector<Linear*> TransformerBlock::linears() {
  std::vector<Linear*> all = attention->linears();
  if (feed_forward)
    for (Linear* l : feed_forward->linears()) all.push_back(l);
  if (moe)
    for (Linear* l : moe->linears()) all.push_back(l);
  return all;
}

std::vector<TpRule> TransformerBlock::tp_plan() const {
  std::vector<TpRule> rules = {{attention_norm.fqn, TpStyle::kReplicated}};
  for (TpRule& r : attention->tp_plan()) rules.push_back(std::move(r));
  if (feed_forward_kind != FeedForwardKind::kNone) rules.push_back({ffn_norm.fqn, TpStyle::kReplicated});
  if (feed_forward)
    for (TpRule& r : feed_forward->tp_plan()) rules.push_back(std::move(r));
  if (moe)
    for (TpRule& r : moe->tp_plan()) rules.push_back(std::move(r));
  return rules;
}

ModuleInputHook* TransformerBlock::input_hook(const std::string& module) {
  if (module == attention->prefix) return &attention->prepare_input;
  if (feed_forward && module == feed_forward->prefix) return &feed_forward->prepare_input;
  return nullptr;
}

// ---------------------------------------------------------------- Transformer

Transformer::Transformer(const ModelArgs& args)
    : args_(args),
      family_(&model::family(args.family)),
      tok_embeddings_weight_(meta_tensor({args.vocab_size, args.dim})),
      norm_("norm", args.dim, family_->final_norm_eps(args)),
      output_("output", args.dim, args.vocab_size) {
  TORCH_CHECK(args.vocab_size > 0, "model vocab_size must be set (got ", args.vocab_size, ")");
  for (int64_t i = 0; i < args.n_layers; ++i)
    layers_.push_back(std::make_unique<TransformerBlock>(i, args, *family_));
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
  for (auto& layer : layers_)
    for (Linear* l : layer->linears()) all.push_back(l);
  all.push_back(&output_);
  return all;
}

std::vector<TpRule> Transformer::tp_plan() const {
  std::vector<TpRule> rules;
  for (const auto& layer : layers_)
    for (TpRule& r : layer->tp_plan()) rules.push_back(std::move(r));
  rules.push_back({"tok_embeddings", TpStyle::kVocabParallelEmbedding});
  rules.push_back({norm_.fqn, TpStyle::kReplicated});
  rules.push_back({output_.fqn(), TpStyle::kVocabParallelOutput});
  return rules;
}

void Transformer::materialize(c10::Device device, c10::ScalarType dtype) {
  visit_params([&](const std::string&, at::Tensor& p) {
    p = at::empty(p.sizes(), at::TensorOptions().device(device).dtype(dtype));
  });
  materialize_buffers(device);
}

void Transformer::materialize_buffers(c10::Device device) {
  rope_ = make_rotary_table(family_->rope_frequencies(args_), args_.max_seq_len, device);
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
    for (const Linear* l : layer->linears())
      add(layer->layer_id, layer_pattern(l->fqn(), "#") + ": " + l->compute()->describe());
    if (!layer->attention->sdpa_name.empty())
      add(layer->layer_id, layer_pattern(layer->attention->prefix, "#") + ".sdpa: " + layer->attention->sdpa_name);
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
