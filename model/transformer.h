// model/transformer.h — the decoder-only transformer the model families share: embedding -> N x
// (attention, feed-forward) -> norm -> output, each block's attention module and feed-forward
// kind as its family declares them (model/family.h).
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
#include "model/attention_module.h"
#include "model/family.h"
#include "model/init_fill.h"
#include "model/layers.h"
#include "model/linear.h"
#include "model/moe/moe.h"
#include "model/mtp.h"

namespace titan::model {

struct TransformerBlock {
  // Block `layer_id` of the model ("layers.<layer_id>").
  TransformerBlock(int64_t layer_id, const ModelArgs& args, const Family& family);
  // Multi-token prediction's depth k (See Note [Multi-token prediction] in model/mtp.h): at
  // "mtp_layers.<k>", declared as block `like` (the last one), with its MtpParts; its layer_id is
  // n_layers + k (its wrappers' index).
  TransformerBlock(int64_t mtp_depth, int64_t like, const ModelArgs& args, const Family& family);
  // x [B, S, D] -> [B, S, D]; a multi-token prediction block takes cat(embedding, previous
  // hidden) [B, S, 2 D] and returns its mtp_norm's output.
  at::Tensor forward(const at::Tensor& x, const RotaryTable& rope, const at::Tensor& documents = {}) const;
  void visit_params(const ParamVisitor& visit);
  // Every linear of the block, in parameter order (an MoE layer's router gate and shared experts
  // included; its experts are stacked tensors, not linears).
  std::vector<Linear*> linears();
  // The block's tensor-parallel rules (model/sharding_plan.h): its norms', its attention's, its
  // feed-forward's, in that order.
  std::vector<TpRule> tp_plan() const;
  // The input hook of the module at `module` (a kGatherInput rule's), or nullptr.
  ModuleInputHook* input_hook(const std::string& module);

  int64_t layer_id;
  std::string path;  // "layers.<i>" or "mtp_layers.<k>": its modules' prefix, its FSDP group's name
  FeedForwardKind feed_forward_kind;
  std::unique_ptr<AttentionModule> attention;  // "layers.<i>.attention", the family's kind
  std::optional<FeedForward> feed_forward;  // kDense ("layers.<i>.feed_forward")
  std::unique_ptr<moe::MoE> moe;            // kMoE ("layers.<i>.moe": model/moe/moe.h)
  RMSNorm attention_norm, ffn_norm;
  std::optional<MtpParts> mtp;  // a multi-token prediction block's own modules

 private:
  TransformerBlock(int64_t layer_id, std::string path, int64_t like, const ModelArgs& args, const Family& family);
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
  // "tok_embeddings", "layers.3", "norm", "output"; multi-token prediction's "mtp_layers.<k>" go
  // with the head.
  bool holds(const std::string& module) const;
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

  // tokens [B, S] int64 -> logits [B, S, vocab] in the parameters' dtype ([(1 + mtp_layers) B, S,
  // vocab] with multi-token prediction: See Note [Multi-token prediction]). `rope`: the positions
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
  std::vector<Linear*> linears();  // every linear, in parameter order (each block's linears(), output)
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
  // This rank's share of a whole row's per-position tensor [B, S, ...] as the embedding compute
  // shards the sequence (tensor parallel's sequence shard); unset: all of it. Multi-token
  // prediction masks its hidden states with it.
  void set_sequence_share(std::function<at::Tensor(const at::Tensor&)> share) { sequence_share_ = std::move(share); }
  // Every block: the model's layers, then multi-token prediction's.
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
  const Family& family() const { return *family_; }
  // The whole model's tensor-parallel rules: the embedding's, every block's, norm's and output's.
  std::vector<TpRule> tp_plan() const;

 private:
  ModelArgs args_;
  const Family* family_;
  at::Tensor tok_embeddings_weight_;  // [vocab, D] "tok_embeddings.weight"
  std::vector<std::unique_ptr<TransformerBlock>> layers_;
  std::vector<std::unique_ptr<TransformerBlock>> mtp_layers_;  // See Note [Multi-token prediction]
  RMSNorm norm_;
  Linear output_;  // [vocab, D]
  RotaryTable rope_;
  std::vector<std::vector<ForwardWrapper>> block_wrappers_;  // per layer, innermost first
  std::vector<ForwardWrapper> embedding_wrappers_, head_wrappers_;
  std::string embedding_compute_name_ = "lookup";
  EmbeddingCompute embedding_compute_;
  std::function<at::Tensor(const at::Tensor&)> sequence_share_;
  OutputObserver output_observer_;
  at::Tensor embed(const at::Tensor& tokens) const;  // the lookup (embedding_compute_ when set)
};

}  // namespace titan::model
