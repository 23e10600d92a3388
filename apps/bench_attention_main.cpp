// titan-bench-attention: causal attention forward and backward on the CPU, titan's bfloat16
// kernel (model/kernels/attention.h) against LibTorch's flash-attention kernel in the same run:
// bf16 (the peer it replaces) and float32 (what float32 runs keep). The shapes: the debug and
// 100M models at scripts/bench_train.sh's batch shapes, the debug model's heads at 1k and 2k
// tokens, and a Llama 3 8B head (128, grouped 4:1) at 512 to 2k tokens, around the key count
// above which the model keeps LibTorch's kernel (kCpuAttentionMaxKeys in
// model/kernels/attention.h); this benchmark calls both kernels directly at every shape.
// Operands come as the model hands them over ([B, S, heads, hd] transposed); each figure is the
// mean of --iters calls after one warm-up.
// --seq-sweep MAX: the model's own causal attention (model::attention_op, what a training step
// runs: titan's kernel or LibTorch's flash by Note [Where the CPU attention kernel runs]) on one
// Llama 3 8B key/value head and its 4 query heads (head_dim 128) at 512, 1k, ... MAX tokens, in
// bf16 and float32 (--device cuda: bf16, the flash kernel, up to 128k tokens and beyond): time
// per token and the rate in torchtitan's attention count (4 x heads x head_dim x seq per token
// forward, the whole square; backward twice that), what the layout planner's attention term
// divides by (planner/cluster.cpp measures it on the CPU at the lengths a layout gives).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_backward.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/repeat_interleave.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "apps/bench_common.h"
#include "model/activation_checkpoint_ops.h"
#include "model/kernels/attention.h"

namespace {

struct Shape {
  const char* name;
  int64_t batch, heads, kv_heads, seq, head_dim;
};

const std::vector<Shape> kShapes = {
    {"debugmodel", 4, 16, 16, 128, 16},       {"100M", 2, 12, 12, 256, 64},
    {"debugmodel, 1k", 1, 16, 16, 1024, 16},  {"debugmodel, 2k", 1, 16, 16, 2048, 16},
    {"head_dim 32, 512", 1, 16, 16, 512, 32}, {"head_dim 32, 2k", 1, 16, 16, 2048, 32},
    {"8B heads, 512", 1, 32, 8, 512, 128},    {"8B heads, 1k", 1, 32, 8, 1024, 128},
    {"8B heads, 2k", 1, 32, 8, 2048, 128},
};

at::Tensor operand(const Shape& s, int64_t heads, at::ScalarType dtype) {
  return at::randn({s.batch, s.seq, heads, s.head_dim}).to(dtype).transpose(1, 2);
}

struct Times {
  double forward_ms, backward_ms;
};

// LibTorch's flash kernel (k/v repeated to every query head, as SDPA's CPU path does).
Times time_flash(const Shape& s, at::ScalarType dtype, int iters) {
  const at::Tensor q = operand(s, s.heads, dtype), g = operand(s, s.heads, dtype);
  const at::Tensor k = operand(s, s.kv_heads, dtype).repeat_interleave(s.heads / s.kv_heads, 1);
  const at::Tensor v = operand(s, s.kv_heads, dtype).repeat_interleave(s.heads / s.kv_heads, 1);
  auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, true);
  const at::Tensor grad = g.contiguous();
  return {
      titan::bench::time_ms([&] { at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, true); }, iters, false),
      titan::bench::time_ms(
          [&] { at::_scaled_dot_product_flash_attention_for_cpu_backward(grad, q, k, v, out, lse, 0.0, true); }, iters,
          false)};
}

// `window` > 0: a sliding window of that many keys (gpt-oss's even blocks), else causal.
Times time_titan(const Shape& s, int iters, titan::model::kernels::AttentionProducts products, int64_t window = 0) {
  const at::Tensor q = operand(s, s.heads, at::kBFloat16), g = operand(s, s.heads, at::kBFloat16);
  const at::Tensor k = operand(s, s.kv_heads, at::kBFloat16), v = operand(s, s.kv_heads, at::kBFloat16);
  auto [out, lse] = titan::model::cpu_attention_forward(q, k, v, true, std::nullopt, window, 0, products);
  return {titan::bench::time_ms(
              [&] { titan::model::cpu_attention_forward(q, k, v, true, std::nullopt, window, 0, products); }, iters,
              false),
          titan::bench::time_ms(
              [&] {
                titan::model::cpu_attention_backward(g, q, k, v, out, lse, true, at::kBFloat16, std::nullopt, window,
                                                     0, products);
              },
              iters, false)};
}

// See --seq-sweep above.
void seq_sweep(int64_t max_seq, int iters, bool cuda) {
  std::printf("model attention (model::attention_op), 4 query heads on 1 key/value head, head_dim 128, causal; "
              "rate in torchtitan's count (the whole square, backward 2x forward)\n\n");
  std::printf("| dtype | S | forward ms | backward ms | backward / forward | us per token (fwd + bwd) | "
              "GFLOP/s (torchtitan's count) |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|\n");
  const std::vector<at::ScalarType> dtypes =
      cuda ? std::vector<at::ScalarType>{at::kBFloat16} : std::vector<at::ScalarType>{at::kBFloat16, at::kFloat};
  for (at::ScalarType dtype : dtypes) {
    for (int64_t seq = 512; seq <= max_seq; seq *= 2) {
      const Shape s{"sweep", 1, 4, 1, seq, 128};
      auto on_device = [&](int64_t heads) {
        at::Tensor t = operand(s, heads, dtype);
        if (cuda) t = t.to(at::kCUDA);
        return t.requires_grad_(true);
      };
      const at::Tensor q = on_device(4), k = on_device(1), v = on_device(1);
      const int n = !cuda && seq >= 4096 ? std::max(1, iters / 4) : iters;
      // The forward as training runs it (its graph recorded, what the backward reads kept).
      const double fwd = titan::bench::time_ms([&] { titan::model::attention_op(q, k, v); }, n, cuda);
      const double both = titan::bench::time_ms([&] {
        const at::Tensor out = titan::model::attention_op(q, k, v);
        out.backward(at::ones_like(out));
      }, n, cuda);
      const double bwd = both - fwd;
      const double flops = 3.0 * 4.0 * 4.0 * 128.0 * static_cast<double>(seq) * static_cast<double>(seq);
      std::printf("| %s | %ld | %.2f | %.2f | %.2f | %.2f | %.1f |\n", dtype == at::kFloat ? "float32" : "bf16",
                  static_cast<long>(seq), fwd, bwd, bwd / fwd, 1e3 * both / static_cast<double>(seq),
                  flops / (both * 1e-3) / 1e9);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  CLI::App app{"titan-bench-attention: titan's bf16 CPU attention kernel vs LibTorch's flash kernel"};
  int threads = 0, iters = 10;
  int64_t window = 0;
  app.add_option("--threads", threads, "intra-op threads (0: LibTorch's default)");
  app.add_option("--window", window,
                 "also time a sliding window of this many keys (gpt-oss: 128) against the causal square "
                 "of titan's kernel and of LibTorch's flash kernel, which has no window")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--iters", iters, "timed calls per figure")->check(CLI::PositiveNumber);
  int64_t sweep = 0;
  std::string device = "cpu";
  app.add_option("--device", device, "cpu, or cuda (only with --seq-sweep)")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--seq-sweep", sweep,
                 "only the sequence sweep: the model's attention on an 8B head group at 512 .. this many tokens")
      ->check(CLI::Range(int64_t{512}, int64_t{1} << 20));
  CLI11_PARSE(app, argc, argv);
  if (threads > 0) at::set_num_threads(threads);
  if (device == "cuda" && sweep == 0) {
    std::fprintf(stderr, "titan-bench-attention: --device cuda times only the --seq-sweep\n");
    return 2;
  }
  if (sweep > 0) {
    if (device == "cuda" && !torch::cuda::is_available()) {
      std::fprintf(stderr, "titan-bench-attention: --device cuda: no CUDA device here\n");
      return 77;  // skipped (scripts/gpu_check.sh's convention)
    }
    seq_sweep(sweep, iters, device == "cuda");
    return 0;
  }
  if (!titan::model::cpu_attention_kernel_applies(at::kBFloat16, 1, 1, 1)) {
    std::fprintf(stderr,
                 "titan-bench-attention: titan's CPU attention kernel is off here (no AVX2/FMA, or "
                 "TITAN_FUSED_OPS=0)\n");
    return 1;
  }
  using titan::model::kernels::AttentionProducts;
  const bool dots = titan::model::kernels::cpu_has_bf16_dot_products();
  std::printf("threads: %d, causal, ms per call (forward / backward); titan's products: float32 FMAs%s\n\n",
              at::get_num_threads(), dots ? " and bf16 dot products (AVX512-BF16)" : " (no AVX512-BF16 here)");
  std::printf(
      "| shape | B x H (KV) x S x hd | titan, fp32 FMAs | titan, bf16 dots | flash bf16 | flash fp32 | "
      "titan (default) vs flash bf16 |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  // One untimed pass over the first shape: the thread pool and the allocator's first blocks
  // would otherwise land on whichever kernel runs first.
  time_titan(kShapes[0], iters, AttentionProducts::kFloat32);
  time_flash(kShapes[0], at::kBFloat16, iters);
  for (const Shape& s : kShapes) {
    const Times fma = time_titan(s, iters, AttentionProducts::kFloat32);
    const Times dot = dots ? time_titan(s, iters, AttentionProducts::kBf16Dot) : Times{0, 0};
    const Times bf16 = time_flash(s, at::kBFloat16, iters), fp32 = time_flash(s, at::kFloat, iters);
    const bool dot_default =
        titan::model::kernels::default_attention_products(s.head_dim, s.head_dim) == AttentionProducts::kBf16Dot;
    const Times& mine = dot_default ? dot : fma;  // what the model runs at this head_dim
    char dot_cell[64] = "-";
    if (dots) std::snprintf(dot_cell, sizeof dot_cell, "%.3f / %.3f", dot.forward_ms, dot.backward_ms);
    std::printf("| %s | %ld x %ld (%ld) x %ld x %ld | %.3f / %.3f | %s | %.3f / %.3f | %.3f / %.3f | %.2fx |\n", s.name,
                static_cast<long>(s.batch), static_cast<long>(s.heads), static_cast<long>(s.kv_heads),
                static_cast<long>(s.seq), static_cast<long>(s.head_dim), fma.forward_ms, fma.backward_ms, dot_cell,
                bf16.forward_ms, bf16.backward_ms, fp32.forward_ms, fp32.backward_ms,
                (bf16.forward_ms + bf16.backward_ms) / (mine.forward_ms + mine.backward_ms));
  }
  if (window > 0) {
    // The windowed kernel visits only the keys each query tile sees: ~window / (S / 2) of the
    // causal square's work at S >> window. LibTorch's CPU flash kernel takes no window, so a run
    // without titan's kernel computes the square (or a dense masked softmax).
    std::printf("\nsliding window of %ld keys, titan's default products, ms per call (forward / backward)\n\n",
                static_cast<long>(window));
    std::printf("| shape | S | titan, window | titan, causal | flash bf16, causal | window vs flash causal |\n");
    std::printf("|---|---|---|---|---|---|\n");
    for (const Shape& s : kShapes) {
      if (s.seq <= window) continue;  // the window masks nothing: the causal rows above
      const AttentionProducts p = dots ? titan::model::kernels::default_attention_products(s.head_dim, s.head_dim)
                                       : AttentionProducts::kFloat32;
      const Times w = time_titan(s, iters, p, window), c = time_titan(s, iters, p);
      const Times bf16 = time_flash(s, at::kBFloat16, iters);
      std::printf("| %s | %ld | %.3f / %.3f | %.3f / %.3f | %.3f / %.3f | %.2fx |\n", s.name,
                  static_cast<long>(s.seq), w.forward_ms, w.backward_ms, c.forward_ms, c.backward_ms, bf16.forward_ms,
                  bf16.backward_ms, (bf16.forward_ms + bf16.backward_ms) / (w.forward_ms + w.backward_ms));
    }
  }
  return 0;
}
