// Activation checkpointing: gradients bit for bit equal to no AC for every mode (full, every
// 2nd block, per-op selective; also with float8 rowwise linears), the per-op policy's kept set,
// runner composition, and option validation.
#include <ATen/core/grad_mode.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/amax.h>
#include <ATen/ops/clamp.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <torch/csrc/autograd/autograd.h>

#include <catch2/catch.hpp>
#include <cmath>

#include "float8/convert.h"
#include "float8/scaling.h"
#include "model/activation_checkpoint_ops.h"
#include "model/flavors.h"
#include "model/transformer.h"
#include "parallel/activation_checkpoint.h"

using namespace titan;
using parallel::AcMode;
using parallel::AcOptions;

namespace {

model::ModelArgs tiny_args(int64_t kv_heads = 0) {
  model::ModelArgs a;
  a.dim = 64;
  a.n_layers = 4;
  a.n_heads = 4;
  a.n_kv_heads = kv_heads;
  a.vocab_size = 64;
  a.multiple_of = 16;
  a.max_seq_len = 16;
  return a;
}

struct Grads {
  double loss = 0;
  std::vector<std::string> names;
  std::vector<at::Tensor> grads;
};

// One forward + backward of a fresh model (same init every time) under `ac`; `convert` may
// swap the linears' computes (float8).
Grads run_once(const model::ModelArgs& args, const AcOptions& ac,
               const std::function<void(model::Transformer&)>& convert = {}) {
  model::Transformer m(args);
  m.materialize(c10::kCPU, at::kFloat);
  m.init_weights(7);
  std::vector<at::Tensor> params;
  Grads out;
  m.visit_params([&](const std::string& n, at::Tensor& p) {
    p.requires_grad_(true);
    params.push_back(p);
    out.names.push_back(n);
  });
  if (convert) convert(m);
  parallel::apply_ac(m, ac);
  at::manual_seed(3);
  at::Tensor tokens = at::randint(args.vocab_size, {2, 16});
  at::Tensor labels = at::randint(args.vocab_size, {2, 16});
  at::Tensor logits = m.forward(tokens, m.rope_table());
  at::Tensor loss = at::cross_entropy_loss(logits.flatten(0, 1), labels.flatten());
  torch::autograd::backward({loss});
  out.loss = loss.item<double>();
  for (auto& p : params) out.grads.push_back(p.grad());
  return out;
}

void require_bitwise_equal(const Grads& a, const Grads& b) {
  REQUIRE(a.loss == b.loss);
  REQUIRE(a.grads.size() == b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i) {
    INFO(a.names[i]);
    REQUIRE(a.grads[i].defined());
    REQUIRE(b.grads[i].defined());
    CHECK(at::equal(a.grads[i], b.grads[i]));
  }
}

const std::vector<std::pair<std::string, AcOptions>>& modes() {
  static const std::vector<std::pair<std::string, AcOptions>> m = {
      {"full", parallel::parse_ac_options("full", "")},
      {"every 2", parallel::parse_ac_options("selective", "2")},
      {"op", parallel::parse_ac_options("selective", "op")},
  };
  return m;
}

}  // namespace

TEST_CASE("every AC mode gives the gradients of no AC, bit for bit", "[ac]") {
  for (int64_t kv : {0, 2}) {  // plain multi-head and grouped-query attention
    const auto args = tiny_args(kv);
    const Grads reference = run_once(args, AcOptions{});
    for (const auto& [name, opts] : modes()) {
      INFO("mode " << name << ", kv_heads " << kv);
      require_bitwise_equal(reference, run_once(args, opts));
    }
  }
}

TEST_CASE("AC with float8 rowwise linears keeps gradients bit for bit", "[ac][float8]") {
  const auto args = tiny_args();
  auto to_float8 = [](model::Transformer& m) {
    float8::Float8Options o;
    o.recipe_name = "rowwise";
    o.emulate = true;
    o.filter_fqns = {"output"};
    float8::convert_to_float8_training(m.linears(), o);
  };
  const Grads reference = run_once(args, AcOptions{}, to_float8);
  for (const auto& [name, opts] : modes()) {
    INFO("mode " << name);
    require_bitwise_equal(reference, run_once(args, opts, to_float8));
  }
}

// The ops block 0's forward offers to per-op AC (on a random [2, 16, 64] input), recorded in `store`.
namespace {
void record_first_block(model::Transformer& m, model::OpCheckpointStore& store) {
  auto rope = model::make_rotary_table(16, 16, 500000.0, c10::kCPU);
  at::Tensor x = at::randn({2, 16, 64});
  at::NoGradGuard no_grad;
  model::OpCheckpointScope record(&store, model::OpCheckpointPhase::kRecord);
  m.blocks()[0]->forward(x, rope);
}
}  // namespace

TEST_CASE("per-op AC on float8 rowwise linears keeps products and amaxes, never abs", "[ac][float8]") {
  for (const char* recipe : {"rowwise", "tensorwise"}) {
    INFO(recipe);
    model::Transformer m(tiny_args());
    m.materialize(c10::kCPU, at::kFloat);
    m.init_weights(1);
    float8::Float8Options o;
    o.recipe_name = recipe;
    o.emulate = true;
    float8::convert_to_float8_training(m.linears(), o);
    model::OpCheckpointStore store(parallel::selective_ac_save_list());
    record_first_block(m, store);
    std::vector<std::string> kept_big;  // kept ops other than the amax scalars/vectors
    int64_t amax_kept = 0;
    for (const auto& e : store.entries()) {
      // The composite cast offers abs (never kept); the fused CPU cast has no abs at all
      // (Note [Fused CPU casts] in float8/kernels/fused_cast.h).
      if (e.op == "abs") {
        CHECK_FALSE(e.kept);
        CHECK(e.outputs.empty());
      }
      if (e.op == "amax" && e.kept) ++amax_kept;
      if (e.kept && e.op != "amax") kept_big.push_back(e.op);
    }
    CHECK(amax_kept == 14);  // input and weight of each of the 7 float8 linears
    CHECK(kept_big == std::vector<std::string>{"mm", "mm", "sdpa", "mm", "mm"});
  }
}

namespace {
// A linear compute that, like a float8 cast, offers abs(W) and its amax to the op layer before
// the product: the policy must keep the amax and never the abs.
class AbsAmaxLinear final : public model::LinearCompute {
 public:
  at::Tensor forward(const model::LinearOperand& x, const model::LinearOperand& w_op) override {
    const at::Tensor& w = w_op.hp;
    at::Tensor a = model::checkpointable_op("abs", [&] { return at::abs(w); });  // [N, K]
    model::checkpointable_op("amax", [&] { return at::amax(a); });               // []
    return model::HighPrecisionLinearCompute().forward(x, w);
  }
  std::string describe() const override { return "abs-amax-hp"; }
};
}  // namespace

TEST_CASE("per-op AC keeps every other mm and sdpa, never abs", "[ac]") {
  model::Transformer m(tiny_args());
  m.materialize(c10::kCPU, at::kFloat);
  m.init_weights(1);
  model::TransformerBlock* block = m.blocks()[0];
  auto rope = model::make_rotary_table(16, 16, 500000.0, c10::kCPU);
  at::Tensor x = at::randn({2, 16, 64});
  at::NoGradGuard no_grad;

  SECTION("high-precision block: the 1st/3rd/5th/7th mm (wq, wv, w1, w2) and attention") {
    model::OpCheckpointStore store(parallel::selective_ac_save_list());
    {
      model::OpCheckpointScope record(&store, model::OpCheckpointPhase::kRecord);
      block->forward(x, rope);
    }
    CHECK(store.kept_ops() == std::vector<std::string>{"mm", "mm", "sdpa", "mm", "mm"});
    int64_t mm_calls = 0;
    for (const auto& e : store.entries()) mm_calls += e.op == "mm";
    CHECK(mm_calls == 7);
    // T = 32 tokens, float32: wq out [T, 64], wv out [T, 64], attention out [B, H, S, hd] =
    // T x 64 and logsumexp [B, H, S] = 128, w1 out [T, 176], w2 out [T, 64].
    CHECK(store.kept_bytes() == 4 * (32 * 64 * 4 + 128 + 32 * 176));
  }
  SECTION("abs offered by a cast is recomputed, amax is kept") {
    for (model::Linear* l : m.linears()) l->set_compute(std::make_shared<AbsAmaxLinear>());
    model::OpCheckpointStore store(parallel::selective_ac_save_list());
    {
      model::OpCheckpointScope record(&store, model::OpCheckpointPhase::kRecord);
      block->forward(x, rope);
    }
    int64_t abs_seen = 0, amax_kept = 0;
    for (const auto& e : store.entries()) {
      if (e.op == "abs") {
        ++abs_seen;
        CHECK_FALSE(e.kept);
        CHECK(e.outputs.empty());
      }
      amax_kept += e.op == "amax" && e.kept;
    }
    CHECK(abs_seen == 7);
    CHECK(amax_kept == 7);
    for (const auto& op : store.kept_ops()) CHECK(parallel::op_on_save_list(op));
  }
  SECTION("the save list is the one table, without abs") {
    std::vector<std::string> ops;
    for (const auto& e : parallel::selective_ac_save_list()) ops.push_back(e.op);
    CHECK(ops == std::vector<std::string>{"mm", "sdpa", "reduce_scatter", "cp_all_to_all", "ep_all_to_all", "amax"});
    CHECK_FALSE(parallel::op_on_save_list("abs"));
  }
}

TEST_CASE("per-op AC treats every linear arithmetic alike: its product is an mm, kept every second time",
          "[ac][float8]") {
  // Note [One linear skeleton]: the four linear computes share one autograd Function, which
  // offers the output product to the op layer as "mm". A block records the same 7 mm calls and
  // keeps the same ops (wq, wv, attention, w1, w2) whatever its linears compute in.
  const std::vector<std::pair<std::string, std::function<void(model::Transformer&)>>> arithmetics = {
      {"high precision", [](model::Transformer&) {}},
      {"float8 rowwise",
       [](model::Transformer& m) {
         float8::Float8Options o;
         o.recipe_name = "rowwise";
         o.emulate = true;
         float8::convert_to_float8_training(m.linears(), o);
       }},
      {"mxfp8",  // attention's linears (64 columns); the 176-wide feed-forward stays high precision
       [](model::Transformer& m) {
         float8::MxOptions o;
         o.recipe_name = "mxfp8_emulated";
         float8::convert_to_mx_training(m.linears(), o);
       }},
      {"int8",
       [](model::Transformer& m) {
         float8::Int8Options o;
         o.emulate = true;
         float8::convert_to_int8_training(m.linears(), o);
       }},
  };
  for (const auto& [name, convert] : arithmetics) {
    INFO(name);
    model::Transformer m(tiny_args());
    m.materialize(c10::kCPU, at::kFloat);
    m.init_weights(1);
    convert(m);
    model::OpCheckpointStore store(parallel::selective_ac_save_list());
    record_first_block(m, store);
    int64_t mm_calls = 0;
    std::vector<std::string> kept;  // the amax scalars of the float8 casts aside
    for (const auto& e : store.entries()) {
      mm_calls += e.op == "mm";
      if (e.kept && e.op != "amax") kept.push_back(e.op);
    }
    CHECK(mm_calls == 7);
    CHECK(kept == std::vector<std::string>{"mm", "mm", "sdpa", "mm", "mm"});
  }
}

TEST_CASE("AC with int8 linears keeps gradients bit for bit", "[ac][float8]") {
  const auto args = tiny_args();
  auto to_int8 = [](model::Transformer& m) {
    float8::Int8Options o;
    o.emulate = true;
    float8::convert_to_int8_training(m.linears(), o);
  };
  const Grads reference = run_once(args, AcOptions{}, to_int8);
  for (const auto& [name, opts] : modes()) {
    INFO("mode " << name);
    require_bitwise_equal(reference, run_once(args, opts, to_int8));
  }
}

TEST_CASE("AC re-runs the wrappers inside it in the recompute, not those outside", "[ac]") {
  model::Transformer m(tiny_args());
  m.materialize(c10::kCPU, at::kFloat);
  m.init_weights(2);
  m.visit_params([](const std::string&, at::Tensor& p) { p.requires_grad_(true); });
  int inner_calls = 0, inner_calls_with_grad = 0, outer_calls = 0;
  for (model::TransformerBlock* b : m.blocks())
    m.wrap_block(b->layer_id, {"count", [&](const at::Tensor& h, const model::ForwardFn& run) {
                                 ++inner_calls;
                                 inner_calls_with_grad += at::GradMode::is_enabled();
                                 return run(h);
                               }});
  parallel::apply_ac(m, parallel::parse_ac_options("full", ""));
  // Added after AC: outside it, as FSDP's wrapper (See Note [FSDP wraps AC]).
  for (model::TransformerBlock* b : m.blocks())
    m.wrap_block(b->layer_id, {"outer", [&](const at::Tensor& h, const model::ForwardFn& run) {
                                 ++outer_calls;
                                 return run(h);
                               }});
  CHECK(m.describe()[1] == "layers.0-3: outer > ac(full) > count");
  at::Tensor logits = m.forward(at::randint(64, {1, 8}), m.rope_table());
  CHECK(inner_calls == 4);
  CHECK(inner_calls_with_grad == 0);  // the first forward runs without grad
  logits.sum().backward();
  CHECK(inner_calls == 8);            // the recompute re-runs the wrappers inside AC
  CHECK(inner_calls_with_grad == 4);
  CHECK(outer_calls == 4);            // the ones outside run once
}

TEST_CASE("AC options are validated", "[ac]") {
  CHECK(parallel::parse_ac_options("none", "whatever").mode == AcMode::kNone);
  CHECK(parallel::parse_ac_options("selective", "3").every_n == 3);
  CHECK_THROWS_WITH(parallel::parse_ac_options("selective", "0"), Catch::Contains("\"op\""));
  CHECK_THROWS_WITH(parallel::parse_ac_options("selective", "ops"), Catch::Contains("'ops'"));
  CHECK_THROWS_WITH(parallel::parse_ac_options("partial", "op"), Catch::Contains("none, full, selective"));
  const auto every2 = parallel::parse_ac_options("selective", "2");
  CHECK_FALSE(parallel::block_is_checkpointed(every2, 0));
  CHECK(parallel::block_is_checkpointed(every2, 1));
}

TEST_CASE("chunked CPU float8 casts equal the one-shot formulas bit for bit", "[ac][float8]") {
  // See Note [Chunked CPU casts] in float8/scaling.cpp: large CPU operands are cast in slices
  // so the float32 temporaries stay small; the bytes must not change.
  at::manual_seed(11);
  const at::Tensor x = at::randn({4, 300, 96}) * 37;  // 115200 elements > one slice
  const double m = 448.0;
  for (int64_t dim : {-1, 0, 1}) {
    INFO("axis " << dim);
    const at::Tensor a = float8::amax(x, float8::ScalingGranularity::Axiswise, dim);
    CHECK(at::equal(a, at::amax(at::abs(x), {dim}, true).to(at::kFloat)));
    const at::Tensor s = float8::scale_from_amax(a, at::kFloat8_e4m3fn, true);
    const at::Tensor got = float8::cast_to_float8(x, s, at::kFloat8_e4m3fn);
    const at::Tensor want = at::clamp(x * s, -m, m).to(at::kFloat8_e4m3fn);
    CHECK(at::equal(got.view(at::kByte), want.view(at::kByte)));
  }
  const at::Tensor t = float8::amax(x, float8::ScalingGranularity::Tensorwise, 0);
  CHECK(at::equal(t, at::amax(at::abs(x)).to(at::kFloat)));
}

TEST_CASE("MoE token counts: each training token counted once under every AC mode, never by validation",
          "[ac][moe]") {
  // Qwen3-MoE's routing on titan's small MoE flavor: 2 x 16 tokens, top 2, 4 layers. The counts
  // of one forward + backward are 2 x 16 x 2 per layer with or without AC (its recompute in
  // backward is uncounted), and the same per expert; a forward under UncountedForward adds none.
  model::ModelArgs args = model::model_flavor("qwen3", "debugmodel_moe_small");
  args.vocab_size = 64;
  args.max_seq_len = 16;
  std::vector<at::Tensor> reference;
  for (const char* mode : {"none", "full", "selective"}) {
    INFO("AC " << mode);
    model::Transformer m(args);
    m.materialize(c10::kCPU, at::kFloat);
    m.materialize_buffers(c10::kCPU);
    m.init_weights(7);
    m.visit_params([&](const std::string&, at::Tensor& p) { p.requires_grad_(true); });
    parallel::apply_ac(m, parallel::parse_ac_options(mode, "op"));
    at::manual_seed(3);
    const at::Tensor tokens = at::randint(args.vocab_size, {2, 16});
    torch::autograd::backward({m.forward(tokens, m.rope_table()).sum()});
    std::vector<at::Tensor> counts;
    for (model::TransformerBlock* block : m.blocks()) {
      CHECK(block->moe->tokens_per_expert.sum().item<double>() == 2 * 16 * 2);
      counts.push_back(block->moe->tokens_per_expert.clone());
    }
    if (reference.empty()) reference = counts;
    for (size_t i = 0; i < counts.size(); ++i) CHECK(at::equal(counts[i], reference[i]));
    {
      at::NoGradGuard no_grad;
      model::moe::UncountedForward uncounted;
      m.forward(tokens, m.rope_table());
    }
    for (size_t i = 0; i < counts.size(); ++i) CHECK(at::equal(m.blocks()[i]->moe->tokens_per_expert, counts[i]));
  }
}

TEST_CASE("per-op AC keeps attention's output for a v head size other than q/k's and an explicit scale", "[ac]") {
  // q/k head 48, v head 32, scale 0.7 / sqrt(48) (Note [Attention head sizes and scale] in
  // model/kernels/attention.h): float32 through LibTorch's flash kernel (v padded, the kept output
  // unpadded), bfloat16 through titan's kernel. The replay hands back what the record kept, and
  // the backward from it gives the gradients of no AC bit for bit.
  const double scale = 0.7 / std::sqrt(48.0);
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    INFO((dtype == at::kFloat ? "float32" : "bfloat16"));
    at::manual_seed(5);
    const at::Tensor q0 = at::randn({2, 4, 16, 48}).to(dtype), k0 = at::randn({2, 2, 16, 48}).to(dtype);
    const at::Tensor v0 = at::randn({2, 2, 16, 32}).to(dtype), g = at::randn({2, 4, 16, 32}).to(dtype);
    auto leaves = [&] {
      return std::vector<at::Tensor>{q0.clone().requires_grad_(true), k0.clone().requires_grad_(true),
                                     v0.clone().requires_grad_(true)};
    };
    const auto plain = leaves();
    const at::Tensor want = model::attention_op(plain[0], plain[1], plain[2], scale);
    const auto want_grads = torch::autograd::grad({want}, plain, {g});

    model::OpCheckpointStore store(parallel::selective_ac_save_list());
    {
      at::NoGradGuard no_grad;
      model::OpCheckpointScope record(&store, model::OpCheckpointPhase::kRecord);
      model::attention_op(q0, k0, v0, scale);
    }
    REQUIRE(store.kept_ops() == std::vector<std::string>{"sdpa"});
    const auto& kept = store.entries()[0].outputs;  // out and log-sum-exp
    REQUIRE(kept.size() == 2);
    CHECK(kept[0].sizes() == at::IntArrayRef({2, 4, 16, 32}));
    CHECK(kept[1].sizes() == at::IntArrayRef({2, 4, 16}));
    CHECK(at::equal(kept[0], want.detach()));
    const auto replayed = leaves();
    at::Tensor out;
    {
      model::OpCheckpointScope replay(&store, model::OpCheckpointPhase::kReplay);
      out = model::attention_op(replayed[0], replayed[1], replayed[2], scale);
    }
    CHECK(at::equal(out, want));
    const auto grads = torch::autograd::grad({out}, replayed, {g});
    for (size_t i = 0; i < grads.size(); ++i) CHECK(at::equal(grads[i], want_grads[i]));
  }
}
