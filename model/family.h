// model/family.h — what a model family declares: everything in which one family's model differs
// from another's. The shared decoder (model/transformer.h), parallelism, checkpoints, the memory
// estimate, mfu and the planner read a family only through this declaration, never by its name.
//
// Note [A family is a declaration]: a family lives in its own folder (model/llama3/, model/qwen3/)
// as one Family object and its flavor table; model/families.cpp lists the families (one line
// each). A family says, per block, which attention module it builds and which feed-forward kind
// it has (dense, MoE, none: so DeepSeek-V3's dense first blocks or Llama 4's interleaving are a
// function of the layer index), how its parameters are initialized, how many parameters and
// FLOPs its attention has (from the arguments alone, so a 671B model's numbers need no tensor),
// and what a tensor-parallel degree must divide; its modules declare their tensor-parallel rules
// (model/sharding_plan.h); and how Hugging Face spells its model (model/hf_format.h). The
// family's own switches ride in ModelArgs.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/args.h"
#include "model/init_fill.h"
#include "model/sharding_plan.h"

namespace titan::model {

class AttentionModule;
struct HfFormat;  // model/hf_format.h
namespace moe {
class RoutedExperts;  // model/moe/experts.h
}

// What a block's feed-forward is.
enum class FeedForwardKind {
  kDense,  // the SwiGLU FeedForward of ModelArgs::ffn_hidden_dim() ("layers.<i>.feed_forward")
  kMoE,    // a mixture of experts of ModelArgs::moe ("layers.<i>.moe": model/moe/moe.h)
  kNone,   // attention only
};

// Note [Attention activations]: what one block's attention keeps from its forward for its
// backward, per token on one tensor-parallel rank, in elements: the memory estimate's attention
// terms (trainer/observe/memory_estimate.cpp), from the arguments alone. The block's input, its
// norm and the normed input the projections share are the estimator's, as is the feed-forward.
struct AttentionActivations {
  // Compute-dtype tensors kept after the normed input (rotated q and k, v, low-rank latents).
  // Names are string literals: the planner asks for these terms of every candidate layout, and a
  // std::string per term was most of its search time.
  std::vector<std::pair<const char*, double>> saved;
  // RMSNorms inside the attention (widths): each keeps what the estimator's norm model says.
  std::vector<double> norm_widths;
  // Its projections' outputs, in forward order: per-op AC keeps every second matrix product of
  // the block (the 1st, 3rd, ...; the feed-forward's continue the count), and a pipeline's
  // split backward keeps their output gradients until its weight step.
  std::vector<double> matmul_outputs;
  double output = 0;  // the attention kernel's output (the output projection's input)
  double heads = 0;   // its float32 logsumexp: one per head
  // Context parallelism exchanges q (titan_ulysses) and k + v (every method) per token.
  double q_width = 0, kv_width = 0;
};
// Where the attention runs, as far as what it keeps depends on it.
struct AttentionActivationsQuery {
  int64_t tp = 1;
  int64_t compute_bytes = 4;
  bool cuda = false;
  int64_t seq_len = 0;
};

// One flavor of a family: its name (model.flavor) and its arguments.
struct NamedFlavor {
  const char* name;
  ModelArgs args;
};

class Family {
 public:
  virtual ~Family() = default;

  // model.name: "llama3".
  virtual std::string name() const = 0;
  // The flavors, in the order the config's error messages list them.
  virtual const std::vector<NamedFlavor>& flavors() const = 0;

  // Block `layer`'s feed-forward. Default: every block an MoE layer when args.moe is set, else dense.
  virtual FeedForwardKind feed_forward(const ModelArgs& args, int64_t layer) const;
  // Block `layer`'s attention, its parameters on the meta device under `prefix` ("layers.<i>.attention").
  virtual std::unique_ptr<AttentionModule> make_attention(const std::string& prefix, const ModelArgs& args,
                                                          int64_t layer) const = 0;
  // Block `layer`'s routed experts under `prefix` ("layers.<i>.moe.experts"), on the meta device,
  // and one routed expert's parameter count. Default: null, the MoE layer's SwiGLU experts of
  // moe_hidden_dim (moe::SwiGluExperts).
  virtual std::unique_ptr<moe::RoutedExperts> make_experts(const std::string& prefix, const ModelArgs& args,
                                                           int64_t layer) const;
  virtual int64_t routed_expert_params(const ModelArgs& args) const;
  // What one routed expert keeps for its backward per row it computes, in elements of the compute
  // dtype (the memory estimate's term; its input row is counted with the MoE layer's). Default:
  // SwiGLU's 4 moe_hidden_dim (the w1 and w3 outputs, silu(w1 x) and the product).
  virtual int64_t routed_expert_saved_per_row(const ModelArgs& args) const;
  // One block's attention parameters, and its score and value products' training FLOPs per
  // token when every query meets seq_len keys (the square: torchtitan's convention).
  virtual int64_t attention_params(const ModelArgs& args, int64_t layer) const = 0;
  virtual double attention_flops_per_token(const ModelArgs& args, int64_t layer, int64_t seq_len) const = 0;
  // What block `layer`'s attention keeps for its backward (Note [Attention activations]).
  virtual AttentionActivations attention_activations(const ModelArgs& args, int64_t layer,
                                                     const AttentionActivationsQuery& where) const = 0;
  // The sizes a tensor-parallel degree must divide (heads, hidden sizes), each named for the error.
  virtual std::vector<ShardedSize> tp_sharded_sizes(const ModelArgs& args) const = 0;
  // Parameter `fqn`'s initial distribution (what Transformer::init_weights draws it from).
  virtual InitSpec init_spec(const ModelArgs& args, const std::string& fqn) const = 0;
  // Block `layer`'s attention confined to fixed chunks of this many positions of the row (block-
  // causal within each chunk, and within each document where the model is block-causal: Llama 4's
  // iRoPE layers); 0 (default): no chunks. Any layer's chunk makes the rows' documents an input of
  // every block (model/attention_masks.h).
  virtual int64_t attention_chunk(const ModelArgs&, int64_t) const { return 0; }
  // Block `layer`'s sliding window: a query at position p sees keys at p - window + 1 .. p (within
  // its document where block-causal); 0 (default): every earlier key (gpt-oss's even layers: 128).
  virtual int64_t attention_window(const ModelArgs&, int64_t) const { return 0; }
  // The rotary frequencies of the rotated part of a head (its size / 2 of them), position 0's
  // angle step each. Default: theta^(-2i / head_dim) through Llama 3.1's scaling when on.
  virtual std::vector<double> rope_frequencies(const ModelArgs& args) const;
  // The final norm's epsilon; a negative value: the epsilon of the input's dtype
  // (torch.finfo(dtype).eps: an nn.RMSNorm built without eps, as DeepSeek-V3's). Default norm_eps.
  virtual double final_norm_eps(const ModelArgs& args) const { return args.norm_eps; }
  // The model's Hugging Face format (its names, layouts and config.json). Throws
  // std::invalid_argument (refuse_hugging_face) where HF's class would compute the model
  // differently. Default: the family declares none.
  virtual HfFormat hugging_face(const ModelArgs& args) const;
};

// torchtitan's decoder init (its llama3 scheme, which Qwen3's and DeepSeek-V3's repeat): the
// embedding normal(0, 1) (untied), the output projection (and a tied embedding)
// trunc_normal(dim^-1/2, +-3 std), norms ones, a block's weights trunc_normal(0.02, +-2) and
// the projections that feed the residual (wo, w2, w3, the MoE router and experts' w2/w3) at the
// depth std 0.02 / sqrt(2 (layer + 1)) (ModelArgs::depth_init; else 2 n_layers).
InitSpec decoder_init_spec(const ModelArgs& args, const std::string& fqn);

// The families titan trains, in registry order (model/families.cpp).
const std::vector<const Family*>& families();
// Family `name`; throws std::invalid_argument naming model.name and listing the families.
const Family& family(const std::string& name);

}  // namespace titan::model
