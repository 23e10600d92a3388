// apps/bench_experts_main.cpp — titan-bench-experts: one MoE layer's routed experts (the SwiGLU's
// three grouped GEMMs, forward + backward) in high precision against each expert recipe
// (quantize.grouped_mm.*: float8 rowwise, blockwise, MXFP8 rceil and floor), at the expert shapes
// of Qwen3-30B-A3B and DeepSeek-V3 as one rank of EP 8 holds them: its local experts and the rows
// routed to them from a batch of --tokens tokens per rank.
//
// Rows per local expert = tokens x top_k / num_experts on average (every rank sends each expert
// its share); the groups are uneven (a fixed draw between half and one and a half of the mean, and
// one empty group), as routing makes them. On the CPU every recipe is an emulation and --scale
// shrinks the shapes; on CUDA the high-precision row is LibTorch's grouped GEMM in bf16.
#include <ATen/Parallel.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <torch/cuda.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "apps/bench_common.h"
#include "float8/grouped_experts.h"
#include "model/moe/moe.h"

using titan::bench::scaled;
using titan::bench::time_ms;

namespace {

struct ExpertShape {
  const char* name;
  int64_t dim, hidden, experts, top_k;
};

// torchtitan's flavors: qwen3 30B-A3B (dim 2048, moe_inter_dim 768, 128 experts, top 8) and
// deepseek_v3 671B (dim 7168, moe_inter_dim 2048, 256 experts, top 8).
const ExpertShape kShapes[] = {{"Qwen3-30B-A3B", 2048, 768, 128, 8}, {"DeepSeek-V3", 7168, 2048, 256, 8}};

double sqnr_db(const at::Tensor& ref, const at::Tensor& actual) {
  const at::Tensor r = ref.to(at::kDouble), a = actual.to(at::kDouble);
  return 20.0 * std::log10(r.norm().item<double>() / (r - a).norm().item<double>());
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  CLI::App app{"titan-bench-experts: an MoE layer's experts, fwd+bwd, high precision vs each expert recipe"};
  std::string device_name = torch::cuda::is_available() ? "cuda" : "cpu";
  int64_t scale = 0, tokens = 8192, ep = 8;
  int iters = 0;
  app.add_option("--device", device_name, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--scale", scale, "divide dim, hidden and the rows by this (0: 1 on CUDA, 8 on CPU)");
  app.add_option("--tokens", tokens, "tokens per rank before --scale (each routed to top_k experts)");
  app.add_option("--ep", ep, "expert-parallel degree: this rank holds num_experts / ep experts");
  app.add_option("--iters", iters, "timed iterations (0: 10 on CUDA, 2 on CPU)");
  CLI11_PARSE(app, argc, argv);
  const bool cuda = device_name == "cuda";
  if (scale <= 0) scale = cuda ? 1 : 8;
  if (iters <= 0) iters = cuda ? 10 : 2;
  const at::TensorOptions opts =
      at::TensorOptions().device(cuda ? at::kCUDA : at::kCPU).dtype(cuda ? at::kBFloat16 : at::kFloat);
  std::printf("titan-bench-experts: device %s (%s), %s, scale 1/%lld, EP %lld, %lld tokens per rank, %d iters, %d threads\n",
              device_name.c_str(), cuda ? "bf16" : "float32", cuda ? "scaled GEMMs per expert" : "every recipe EMULATED",
              static_cast<long long>(scale), static_cast<long long>(ep), static_cast<long long>(tokens), iters,
              at::get_num_threads());
  std::printf("cell = fwd+bwd ms / speed-up over high precision / output SQNR vs high precision (dB)\n");
  const std::vector<titan::float8::ExpertRecipe> recipes = {
      {"float8", "rowwise", false}, {"float8", "blockwise", false}, {"mx", "mxfp8_rceil", false}, {"mx", "mxfp8_floor", false}};
  std::printf("%-14s %5s %5s %6s %9s | %8s", "shape", "D", "H", "local", "rows", "hp ms");
  for (const auto& r : recipes) std::printf(" | %-21s", r.name.c_str());
  std::printf("\n");
  for (const ExpertShape& s : kShapes) {
    const int64_t D = scaled(s.dim, scale), H = scaled(s.hidden, scale), local = s.experts / ep;
    const int64_t mean_rows = std::max<int64_t>(1, tokens / scale * s.top_k / s.experts);
    // Uneven groups: a fixed draw in [mean/2, 3 mean/2], the second expert empty.
    at::manual_seed(1);
    const at::Tensor draw = at::randint(mean_rows / 2, mean_rows * 3 / 2 + 1, {local}, at::kLong);
    std::vector<int64_t> counts(draw.data_ptr<int64_t>(), draw.data_ptr<int64_t>() + local);
    if (local > 1) counts[1] = 0;
    int64_t rows = 0;
    for (int64_t c : counts) rows += c;
    at::Tensor x = at::randn({rows, D}, opts).requires_grad_(true);
    at::Tensor w1 = (at::randn({local, H, D}, opts) * 0.02).requires_grad_(true);
    at::Tensor w3 = (at::randn({local, H, D}, opts) * 0.02).requires_grad_(true);
    at::Tensor w2 = (at::randn({local, D, H}, opts) * 0.02).requires_grad_(true);
    const at::Tensor g = at::randn({rows, D}, opts);
    at::Tensor out;
    auto step = [&](const titan::model::moe::ExpertComputes& c) {
      return time_ms([&] {
        for (at::Tensor* t : {&x, &w1, &w2, &w3}) t->mutable_grad().reset();
        out = titan::model::moe::grouped_experts(x, w1, w2, w3, counts, c);
        out.backward(g);
      }, iters, cuda);
    };
    const double hp_ms = step({});
    const at::Tensor hp_out = out.detach().clone();
    std::printf("%-14s %5lld %5lld %6lld %9lld | %8.2f", s.name, static_cast<long long>(D), static_cast<long long>(H),
                static_cast<long long>(local), static_cast<long long>(rows), hp_ms);
    for (titan::float8::ExpertRecipe r : recipes) {
      r.emulate = !cuda;
      char cell[64];
      try {
        const double ms = step(titan::float8::expert_computes(r));
        std::snprintf(cell, sizeof(cell), "%8.2f %5.2fx %5.1f", ms, hp_ms / ms, sqnr_db(hp_out, out.detach()));
      } catch (const std::exception& e) {
        std::snprintf(cell, sizeof(cell), "n/a (%.14s)", e.what());
      }
      std::printf(" | %-21s", cell);
    }
    std::printf("\n");
  }
  if (!cuda) std::printf("CPU recipes are emulations (dequantized GEMMs): slower than high precision is expected; on CUDA "
                         "the same table measures the hardware GEMMs.\n");
  return 0;
}
