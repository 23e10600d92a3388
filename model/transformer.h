// model/transformer.h — the decoder-only transformer the model families share (Llama 3 today):
// embedding -> N x (attention, SwiGLU FFN) -> norm -> output. A family is its flavors (ModelArgs).
//
// Modules are plain structs that own their parameters as tensor members. The model is first
// built on the meta device (shapes only), then `materialize` gives every parameter real storage
// on the target device and `init_weights` fills it. Parameters are reached through
// `visit_params`, which hands out torchtitan's fully-qualified names
// ("layers.0.attention.wq.weight") and a reference to the tensor slot, so that later stages
// (mixed precision, FSDP sharding, checkpoint loading) can replace a slot without the model
// knowing. Linears are `model::Linear` so float8/ and parallel/ can swap their compute.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/args.h"
#include "model/init_fill.h"
#include "model/linear.h"
#include "model/moe/moe.h"

namespace titan::model {

using ParamVisitor = std::function<void(const std::string& fqn, at::Tensor& param)>;

struct RMSNorm {
  RMSNorm(std::string fqn, int64_t dim, double eps);
  at::Tensor forward(const at::Tensor& x) const;  // [..., dim] -> [..., dim]
  void visit_params(const ParamVisitor& visit);

  std::string fqn;
  double eps;
  at::Tensor weight;  // [dim]
};

// Rotary position embedding tables, computed once for max_seq_len positions.
struct RotaryTable {
  at::Tensor cos;  // [max_seq_len, head_dim / 2] float32
  at::Tensor sin;  // [max_seq_len, head_dim / 2] float32
};
// `scaling` (Llama 3.1's, see model/args.h) rescales the frequencies; the default is none.
RotaryTable make_rotary_table(int64_t head_dim, int64_t max_seq_len, double theta,
                              c10::Device device, const RopeScaling& scaling = {});
// x: [B, S, H, head_dim]; rotates the pairs (x[2i], x[2i+1]) by position, as Meta's complex form.
at::Tensor apply_rotary(const at::Tensor& x, const RotaryTable& table);
// The same rotations over the pairs (x[i], x[i + head_dim/2]) (HF's rotate_half; Qwen3).
at::Tensor apply_rotary_half(const at::Tensor& x, const RotaryTable& table);

// Transforms a module's input before its first linear (torchtitan's PrepareModuleInput):
// sequence parallel all-gathers the sequence shards here once for wq/wk/wv (or w1/w3), possibly
// already cast to float8 (See Note [Linear operands as data] in model/linear.h).
using ModuleInputHook = std::function<LinearOperand(const at::Tensor& x)>;

// Causal attention of the positions this rank holds: q [B, H, S, hd], k/v [B, KV, S, hd] ->
// [B, H, S, hd]; `documents` (defined under block-causal attention) holds the document of every
// position of the whole rows [B, S_row], also where this rank holds a share of them. Context
// parallelism installs one that exchanges keys and values with the other ranks of its group
// (parallel/context_parallel/context_parallel.h); empty: attention_op over the local sequence.
using AttentionCompute = std::function<at::Tensor(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                  const at::Tensor& documents)>;

struct Attention {
  Attention(const std::string& prefix, const ModelArgs& args);
  // `documents` [B, S_row] int64 (defined under block-causal attention): the document of each
  // position of the whole rows (model/document_attention.h); attention stays within a document.
  // Without context parallelism S_row is the local S.
  at::Tensor forward(const at::Tensor& x, const RotaryTable& rope, const at::Tensor& documents = {}) const;  // [B, S, D]
  void visit_params(const ParamVisitor& visit);

  int64_t n_heads, n_kv_heads, head_dim;
  Linear wq, wk, wv, wo;  // wq [H*hd, D], wk/wv [KV*hd, D], wo [D, H*hd]
  std::optional<RMSNorm> q_norm, k_norm;  // [head_dim] each, "<prefix>.q_norm.weight" (qk_norm)
  bool rope_rotate_half = false;           // ModelArgs::rope_rotate_half
  ModuleInputHook prepare_input;  // empty: identity
  AttentionCompute sdpa;          // empty: attention_op
  std::string sdpa_name;          // what describe() prints for it ("ring(cp 2, alltoall)")
};

struct FeedForward {
  FeedForward(const std::string& prefix, int64_t dim, int64_t hidden_dim);
  at::Tensor forward(const at::Tensor& x) const;  // w2(silu(w1 x) * w3 x)
  void visit_params(const ParamVisitor& visit);

  Linear w1, w2, w3;  // w1/w3 [hidden, D], w2 [D, hidden]
  ModuleInputHook prepare_input;  // empty: identity
};

struct TransformerBlock {
  TransformerBlock(int64_t layer_id, const ModelArgs& args);
  at::Tensor forward(const at::Tensor& x, const RotaryTable& rope, const at::Tensor& documents = {}) const;
  void visit_params(const ParamVisitor& visit);

  int64_t layer_id;
  Attention attention;
  std::optional<FeedForward> feed_forward;  // a dense block's (every block without ModelArgs::moe)
  std::unique_ptr<moe::MoE> moe;            // an MoE block's ("layers.<i>.moe": model/moe/moe.h)
  RMSNorm attention_norm, ffn_norm;
};

// A block's (or a stage's) forward, x -> y.
using ForwardFn = std::function<at::Tensor(const at::Tensor& x)>;

// One wrapper of a block's or stage's forward (activation checkpointing, FSDP's gathers): `run`
// calls `inner` itself, its own way. Wrappers nest in the order they are added, the last added
// outermost; `name` is what describe() prints ("ac(full)", "fsdp(group 4)").
struct ForwardWrapper {
  std::string name;
  std::function<at::Tensor(const at::Tensor& x, const ForwardFn& inner)> run;
};

// tokens [B, S] int64 + embedding weight -> [B, S', D]. Default: at::embedding (S' = S);
// tensor parallel installs a vocab-parallel lookup whose output is sequence-sharded.
using EmbeddingCompute = std::function<at::Tensor(const at::Tensor& tokens, const at::Tensor& weight)>;

// The stages outside the blocks: kEmbedding maps tokens -> h, kHead maps h -> logits (final
// norm + output projection). FSDP wraps them as parameter groups of their own.
enum class Stage { kEmbedding, kHead };

// A contiguous run of the model's modules (a pipeline stage holds one or two): the embedding
// (tokens in) or not (hidden states in), blocks [first_layer, end_layer), the final norm and
// output projection (logits out) or not (hidden states out). The default is the whole model.
struct ModelPart {
  bool embedding = true;
  int64_t first_layer = 0;
  int64_t end_layer = -1;  // -1: to the last block
  bool head = true;
  bool holds(const std::string& module) const;  // "tok_embeddings", "layers.3", "norm", "output"
};

class Transformer {
 public:
  // Builds every parameter on the meta device: no memory is allocated.
  explicit Transformer(const ModelArgs& args);

  // Replaces every (meta) parameter with uninitialized storage on `device` of `dtype`.
  void materialize(c10::Device device, c10::ScalarType dtype);
  // Only the non-parameter buffers (RoPE tables, MoE layers' expert_bias and token counts): for
  // sharded training, whose parameters never exist in full on one rank.
  void materialize_buffers(c10::Device device);
  // torchtitan's init (the distributions are listed in init.cpp) from `seed`, by the
  // counter-based generator: the same values on every device and in every layout.
  void init_weights(uint64_t seed);
  // Parameter `fqn`'s distribution (what init_weights draws it from; sharded init fills each
  // rank's box of it with model::fill_init_box).
  InitSpec init_spec(const std::string& fqn) const;

  // tokens [B, S] int64 -> logits [B, S, vocab] in the parameters' dtype. `rope`: the positions
  // of the tokens, row s for tokens[:, s] (at least S rows): rope_table() for a whole sequence from
  // position 0; a rank's share of it under context parallelism (parallel/context_parallel/sequence_shard.h).
  // Block-causal models find the documents from `tokens` (document_ids) unless given.
  at::Tensor forward(const at::Tensor& tokens, const RotaryTable& rope, const at::Tensor& documents = {});
  // One part's forward: tokens [B, S] int64 when it has the embedding, else hidden states
  // [B, S', D]; returns logits when it has the head, else hidden states. `documents` [B, S_row]
  // int64: required by a block-causal model (every part needs them, and a later pipeline stage or
  // a context-parallel share cannot find them from its input), ignored by a causal one.
  at::Tensor forward_part(const at::Tensor& input, const RotaryTable& rope, const ModelPart& part,
                          const at::Tensor& documents = {});
  // The RoPE table of positions 0 .. max_seq_len - 1 (after materialize / materialize_buffers).
  const RotaryTable& rope_table() const { return rope_; }

  void visit_params(const ParamVisitor& visit);
  // The persistent buffers a checkpoint holds beside the parameters: each MoE layer's
  // "layers.<i>.moe.expert_bias" (load balancing's state; not a parameter: no gradient, no optimizer).
  void visit_buffers(const ParamVisitor& visit);
  std::vector<Linear*> linears();  // every linear, in parameter order
  // Adds `wrapper` around block `layer_id`'s forward (outermost so far).
  void wrap_block(int64_t layer_id, ForwardWrapper wrapper);
  void wrap_stage(Stage stage, ForwardWrapper wrapper);
  // When set, forward hands each top-level module's output to `observer` as it is computed:
  // "tok_embeddings", "layers.<i>" (outside the block's wrappers), "output" (the logits). The
  // trainer's non-finite step diagnosis uses it to name the first module whose output is not
  // finite; unset (the default), forward does nothing extra.
  using OutputObserver = std::function<void(const std::string& fqn, const at::Tensor& output)>;
  void set_output_observer(OutputObserver observer) { output_observer_ = std::move(observer); }
  // `name` for describe(), e.g. "vocab_parallel".
  void set_embedding_compute(std::string name, EmbeddingCompute compute);
  std::vector<TransformerBlock*> blocks();
  // How the model runs, one line per module that something was applied to, for the start-up
  // log: each linear's compute chain ("layers.3.attention.wq: colwise(float8[rowwise])") and each
  // block's and stage's wrappers, outermost first ("layers.3: fsdp(group 4) > ac(full)"). Lines
  // that differ only in the layer number are merged ("layers.0-5.attention.wq: ...").
  // `holds` (when set) keeps the lines of the modules this rank holds (a pipeline stage's).
  std::vector<std::string> describe(const std::function<bool(const std::string& module)>& holds = {}) const;
  RMSNorm& norm() { return norm_; }
  Linear& output() { return output_; }

  const ModelArgs& args() const { return args_; }

 private:
  ModelArgs args_;
  at::Tensor tok_embeddings_weight_;  // [vocab, D] "tok_embeddings.weight"
  std::vector<std::unique_ptr<TransformerBlock>> layers_;
  RMSNorm norm_;
  Linear output_;  // [vocab, D]
  RotaryTable rope_;
  std::vector<std::vector<ForwardWrapper>> block_wrappers_;  // per layer, innermost first
  std::vector<ForwardWrapper> embedding_wrappers_, head_wrappers_;
  std::string embedding_compute_name_ = "lookup";
  EmbeddingCompute embedding_compute_;
  OutputObserver output_observer_;
};

}  // namespace titan::model
