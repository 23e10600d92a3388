// model/transformer.cpp — see transformer.h.
#include "model/transformer.h"
#include "model/param_path.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <vector>

#include "model/attention_masks.h"
#include "model/document_attention.h"
#include "model/scope.h"

namespace titan::model {

// ---------------------------------------------------------------- TransformerBlock

TransformerBlock::TransformerBlock(int64_t id, const ModelArgs& args, const Family& family)
    : TransformerBlock(id, layer_path(id), id, args, family) {}

TransformerBlock::TransformerBlock(int64_t mtp_depth, int64_t like, const ModelArgs& args, const Family& family)
    : TransformerBlock(args.n_layers + mtp_depth, layer_path(mtp_depth, {}, kMtpLayersPrefix), like, args, family) {
  mtp.emplace(path, args);
}

TransformerBlock::TransformerBlock(int64_t id, std::string path_, int64_t like, const ModelArgs& args,
                                   const Family& family)
    : layer_id(id),
      path(std::move(path_)),
      feed_forward_kind(family.feed_forward(args, like)),
      attention(family.make_attention(path + ".attention", args, like)),
      attention_norm(path + ".attention_norm", args.dim, args.norm_eps),
      ffn_norm(path + ".ffn_norm", args.dim, args.norm_eps) {
  switch (feed_forward_kind) {
    case FeedForwardKind::kDense:
      feed_forward.emplace(path + ".feed_forward", args.dim, args.ffn_hidden_dim());
      break;
    case FeedForwardKind::kMoE:
      TORCH_CHECK(args.moe, path, " is an MoE block, but the model arguments hold no MoE layer (ModelArgs::moe)");
      moe = std::make_unique<moe::MoE>(path + ".moe", *args.moe, args.dim, args.moe_hidden_dim,
                                       family.make_experts(path + ".moe.experts", args, like));
      break;
    case FeedForwardKind::kNone:
      break;
  }
}

at::Tensor TransformerBlock::forward(const at::Tensor& x_in, const RotaryTable& rope, const at::Tensor& documents) const {
  const at::Tensor x = mtp ? mtp->fuse(x_in) : x_in;
  at::Tensor h;
  {
    NamedScope scope("attention");
    h = x + attention->forward(attention_norm.forward(x), rope, documents);
  }
  if (moe) {
    NamedScope scope("moe");
    h = h + moe->forward(ffn_norm.forward(h));
  } else if (feed_forward) {
    NamedScope scope("feed_forward");
    h = h + feed_forward->forward(ffn_norm.forward(h));
  }
  return mtp ? mtp->mtp_norm.forward(h) : h;
}

// torchtitan's parameter order within a block: attention, feed_forward (or moe), attention_norm, ffn_norm.
void TransformerBlock::visit_params(const ParamVisitor& visit) {
  attention->visit_params(visit);
  if (moe) moe->visit_params(visit);
  if (feed_forward) feed_forward->visit_params(visit);
  attention_norm.visit_params(visit);
  if (feed_forward_kind != FeedForwardKind::kNone) ffn_norm.visit_params(visit);
  if (mtp) mtp->visit_params(visit);
}

std::vector<Linear*> TransformerBlock::linears() {
  std::vector<Linear*> all = attention->linears();
  if (feed_forward)
    for (Linear* l : feed_forward->linears()) all.push_back(l);
  if (moe)
    for (Linear* l : moe->linears()) all.push_back(l);
  if (mtp) all.push_back(&mtp->eh_proj);
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
  // A depth's own modules run per token on the sequence shards: replicated weights.
  if (mtp)
    for (const std::string& m : {mtp->enorm.fqn, mtp->hnorm.fqn, mtp->eh_proj.fqn(), mtp->mtp_norm.fqn})
      rules.push_back({m, TpStyle::kReplicated});
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
  TORCH_CHECK(args.mtp_layers >= 0 && (args.mtp_layers == 0 || args.n_layers > 0),
              "multi-token prediction needs mtp_layers >= 0 and a block to repeat, got mtp_layers ", args.mtp_layers);
  for (int64_t k = 0; k < args.mtp_layers; ++k)
    mtp_layers_.push_back(std::make_unique<TransformerBlock>(k, args.n_layers - 1, args, *family_));
  make_linear_meta(output_);
}

void Transformer::visit_params(const ParamVisitor& visit) {
  visit("tok_embeddings.weight", tok_embeddings_weight_);
  for (auto& layer : layers_) layer->visit_params(visit);
  for (auto& layer : mtp_layers_) layer->visit_params(visit);
  norm_.visit_params(visit);
  if (!args_.tie_embeddings) visit("output.weight", output_.weight);  // tied: the embedding itself
}

std::vector<TransformerBlock*> Transformer::blocks() {
  std::vector<TransformerBlock*> all;
  for (auto& layer : layers_) all.push_back(layer.get());
  for (auto& layer : mtp_layers_) all.push_back(layer.get());
  return all;
}

std::vector<Linear*> Transformer::linears() {
  std::vector<Linear*> all;
  for (TransformerBlock* block : blocks())
    for (Linear* l : block->linears()) all.push_back(l);
  all.push_back(&output_);
  return all;
}

std::vector<TpRule> Transformer::tp_plan() const {
  std::vector<TpRule> rules;
  for (const auto& layer : layers_)
    for (TpRule& r : layer->tp_plan()) rules.push_back(std::move(r));
  for (const auto& layer : mtp_layers_)
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
  for (TransformerBlock* layer : blocks()) {
    if (!layer->moe) continue;
    const auto f32 = at::TensorOptions().device(device).dtype(at::kFloat);
    layer->moe->tokens_per_expert = at::zeros({args_.moe->num_experts}, f32);
    if (args_.moe->load_balance_coeff) layer->moe->expert_bias = at::zeros({args_.moe->num_experts}, f32);
  }
}

void Transformer::visit_buffers(const ParamVisitor& visit) {
  for (TransformerBlock* layer : blocks())
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
  const int64_t blocks = args_.n_layers + args_.mtp_layers;
  TORCH_CHECK(layer_id >= 0 && layer_id < blocks, "wrap_block: no layer ", layer_id);
  if (block_wrappers_.empty()) block_wrappers_.resize(static_cast<size_t>(blocks));
  block_wrappers_[static_cast<size_t>(layer_id)].push_back(std::move(wrapper));
}

void Transformer::wrap_stage(Stage stage, ForwardWrapper wrapper) {
  (stage == Stage::kEmbedding ? embedding_wrappers_ : head_wrappers_).push_back(std::move(wrapper));
}

at::Tensor Transformer::embed(const at::Tensor& tokens) const {
  return embedding_compute_ ? embedding_compute_(tokens, tok_embeddings_weight_)
                            : at::embedding(tok_embeddings_weight_, tokens);  // [B, S, D]
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
  for (const auto* list : {&layers_, &mtp_layers_})
    for (const auto& layer : *list) {
      if (!held(layer->path)) continue;
      const size_t id = static_cast<size_t>(layer->layer_id);
      const int64_t index = layer->mtp ? layer->layer_id - args_.n_layers : layer->layer_id;  // the name's
      if (id < block_wrappers_.size() && !block_wrappers_[id].empty())
        add(index, layer_pattern(layer->path, "#") + ": " + chain(block_wrappers_[id]));
      for (const Linear* l : layer->linears())
        add(index, layer_pattern(l->fqn(), "#") + ": " + l->compute()->describe());
      if (!layer->attention->sdpa_name.empty())
        add(index, layer_pattern(layer->attention->prefix, "#") + ".sdpa: " + layer->attention->sdpa_name);
      if (layer->moe && layer->moe->expert_computes.defined())  // the routed experts, when in low precision
        add(index, layer_pattern(layer->moe->prefix + ".experts", "#") + ": " + layer->moe->expert_computes.describe() +
                       (layer->moe->expert_computes.float8_dispatch ? ", rows dispatched in float8" : ""));
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
  if (parse_layer_path(module, kMtpLayersPrefix)) return head;  // See Note [Multi-token prediction]
  const std::optional<LayerPath> block = parse_layer_path(module);
  if (!block) return false;
  return block->layer >= first_layer && (end_layer < 0 || block->layer < end_layer);
}

at::Tensor Transformer::forward(const at::Tensor& tokens, const RotaryTable& rope, const at::Tensor& documents) {
  const bool find = uses_row_documents(args_) && !documents.defined() && tokens.dim() == 2;
  return forward_part(tokens, rope, {}, find ? row_documents(args_, tokens) : documents);
}

at::Tensor Transformer::forward_part(const at::Tensor& input, const RotaryTable& rope, const ModelPart& part,
                               const at::Tensor& documents_in) {
  const int64_t end_layer = part.end_layer < 0 ? args_.n_layers : part.end_layer;
  TORCH_CHECK(part.first_layer >= 0 && part.first_layer <= end_layer && end_layer <= args_.n_layers,
              "Transformer::forward_part: layers [", part.first_layer, ", ", end_layer, ") of ", args_.n_layers);
  at::Tensor h = input;
  // Block-causal or chunked: each position's document (row_documents, found from the rows' EOS by
  // the caller); causal: none.
  const bool uses_documents = uses_row_documents(args_);
  TORCH_CHECK(!uses_documents || (documents_in.defined() && documents_in.dim() == 2 &&
                                  documents_in.size(0) == input.size(0)),
              "Transformer::forward_part: a block-causal or chunked model needs the documents of the rows [batch, seq] (row_documents), got ",
              documents_in.defined() ? documents_in.sizes() : at::IntArrayRef{}, " for input ", input.sizes());
  const at::Tensor documents = uses_documents ? documents_in : at::Tensor();
  if (part.embedding) {
    TORCH_CHECK(input.dim() == 2, "Transformer::forward expects tokens [batch, seq], got shape ", input.sizes());
    TORCH_CHECK(rope.cos.size(0) >= input.size(1), "Transformer::forward: the RoPE table has ", rope.cos.size(0),
                " positions for ", input.size(1), " tokens");
    ForwardFn embed = [this](const at::Tensor& t) { return this->embed(t); };
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
  const int64_t rows = h.size(0);
  if (!mtp_layers_.empty()) {
    // See Note [Multi-token prediction]. The embedding's parameters are still gathered (FSDP
    // counts these lookups among its uses); under sequence parallelism the lookups come back
    // sequence-sharded as the first one did, and the masks are cut alike.
    TORCH_CHECK(part.embedding, "multi-token prediction needs the tokens: the part with the head must hold the "
                "embedding too (no pipeline split)");
    std::vector<at::Tensor> depths = {h};
    at::Tensor previous = h;
    for (const auto& block : mtp_layers_) {
      const int64_t k = block->layer_id - args_.n_layers + 1;
      const RolledSequence shifted = roll_sequence(input, k, documents, 0);
      const at::Tensor valid = sequence_share_ ? sequence_share_(shifted.valid) : shifted.valid;
      previous = previous * valid.unsqueeze(-1).to(previous.scalar_type());
      const at::Tensor fused_input = at::cat({embed(shifted.values), previous}, -1);  // [B, S', 2 D]
      TransformerBlock* b = block.get();
      ForwardFn run = [b, rope, documents](const at::Tensor& x) { return b->forward(x, rope, documents); };
      NamedScope scope(block->path);
      const size_t id = static_cast<size_t>(block->layer_id);
      previous = compose(std::move(run), id < block_wrappers_.size() ? block_wrappers_[id] : kNoWrappers)(fused_input);
      if (output_observer_) output_observer_(block->path, previous);
      depths.push_back(previous);
    }
    h = at::cat(depths, 0);  // [(1 + D) B, S', D]
  }
  ForwardFn head = [this, rows](const at::Tensor& x) {
    // Tied (Qwen3's small flavors): the output projection multiplies by the embedding's slot as it
    // is now (whatever materialize or a checkpoint load put there), so both uses share one
    // parameter and its gradient sums theirs.
    if (args_.tie_embeddings) output_.weight = tok_embeddings_weight_;
    if (x.size(0) == rows) return output_.forward(norm_.forward(x));
    // Multi-token prediction: the main rows through the final norm; each depth's rows are
    // through their mtp_norm already.
    return output_.forward(at::cat({norm_.forward(x.narrow(0, 0, rows)), x.narrow(0, rows, x.size(0) - rows)}, 0));
  };
  NamedScope scope("output");
  at::Tensor logits = compose(std::move(head), head_wrappers_)(h);  // [B, S, vocab]
  if (output_observer_) output_observer_("output", logits);
  return logits;
}

}  // namespace titan::model
