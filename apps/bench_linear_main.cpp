// titan-bench-linear: forward + backward time of one linear, high precision vs Float8Linear
// (every recipe) vs Int8Linear, over a grid of (M, K, N) (torchao's bench_linear_float8.py);
// then the block-scaled recipes (MXFP8, MXFP4, blockwise float8) on the square shapes: time and
// each GEMM's SQNR against float64.
// The "faster?" column against the auto-filter prediction is the evidence behind
// float8.auto_filter_small_kn: on CUDA the small-K/N shapes the filter skips should read "no".
// On the CPU float8 is an emulation (labelled so) and --scale shrinks the shapes; the filter
// column always reports the UNSCALED (K, N).
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/randn.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>

#include <CLI/CLI.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "apps/bench_common.h"
#include "float8/block_scaled_linear.h"
#include "float8/convert.h"
#include "float8/float8_linear.h"
#include "float8/int8_linear.h"
#include "float8/recipe.h"
#include "model/linear.h"

namespace {

using titan::bench::scaled;
using titan::bench::time_ms;

// --trace DIR: one Kineto trace per linear (hp and each float8 recipe) of the last grid shape, two
// fwd+bwd iterations after the timed ones, as DIR/linear_<name>.json (scripts/bench/trace_summary.py
// reads them: where the float8 linears' time goes besides the GEMMs).
void trace_linear(const std::string& dir, const std::string& name, const std::function<void()>& iteration, bool cuda) {
  namespace kineto = torch::autograd::profiler;
  using torch::profiler::impl::ActivityType;
  const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO, false, false, false);
  std::set<ActivityType> acts{ActivityType::CPU};
  if (cuda) acts.insert(ActivityType::CUDA);
  kineto::prepareProfiler(config, acts);
  kineto::enableProfiler(config, acts);
  for (int i = 0; i < 2; ++i) {
    RECORD_USER_SCOPE("ProfilerStep#" + std::to_string(i + 1));
    iteration();
  }
  if (cuda) torch::cuda::synchronize();
  kineto::disableProfiler()->save(dir + "/linear_" + name + ".json");
}

double sqnr_db(const at::Tensor& ref, const at::Tensor& actual) {
  const at::Tensor r = ref.detach().to(at::kDouble).cpu(), a = actual.detach().to(at::kDouble).cpu();
  const double noise = (r - a).norm().item<double>();
  return noise == 0.0 ? INFINITY : 20.0 * std::log10(r.norm().item<double>() / noise);
}

// The block-scaled table: per recipe fwd+bwd ms and the SQNR (dB) of output / grad_input /
// grad_weight against float64 products of the same operands.
void block_scaled_table(const std::vector<int64_t>& dims, int64_t tokens, int64_t scale, int iters, bool cuda,
                        const at::TensorOptions& opts) {
  std::vector<std::string> recipes = titan::float8::mx_recipe_names();
  recipes.push_back(titan::float8::kBlockwiseRecipeName);
  std::printf("\nblock-scaled recipes: cell = fwd+bwd ms / SQNR dB of output, grad_input, grad_weight vs float64\n");
  std::printf("%5s %5s %5s | %8s", "M", "K", "N", "hp ms");
  for (const auto& r : recipes) std::printf(" | %-26s", r.c_str());
  std::printf("\n");
  std::map<std::string, std::string> not_available;  // recipe -> why (the cells hold its start)
  for (int64_t D0 : dims) {
    const int64_t M = scaled(tokens, scale), K = scaled(D0, scale), N = K;
    at::Tensor x = at::randn({M, K}, opts).requires_grad_(true);
    at::Tensor w = (at::randn({N, K}, opts) * 0.05).detach().requires_grad_(true);
    at::Tensor g = at::randn({M, N}, opts) * 1e-3;
    const at::Tensor xd = x.detach().to(at::kDouble), wd = w.detach().to(at::kDouble), gd = g.to(at::kDouble);
    const at::Tensor out64 = xd.mm(wd.t()), gi64 = gd.mm(wd), gw64 = gd.t().mm(xd);
    auto step = [&](titan::model::LinearCompute& c) {
      return time_ms([&] {
        x.mutable_grad().reset();
        w.mutable_grad().reset();
        c.forward(x, w).backward(g);
      }, iters, cuda);
    };
    titan::model::HighPrecisionLinearCompute hp;
    std::printf("%5lld %5lld %5lld | %8.2f", static_cast<long long>(M), static_cast<long long>(K),
                static_cast<long long>(N), step(hp));
    for (const auto& r : recipes) {
      char cell[96];
      try {
        titan::float8::BlockScaledLinearCompute c(titan::float8::block_scaled_recipe_from_name(r));
        const double ms = step(c);
        x.mutable_grad().reset();
        w.mutable_grad().reset();
        const at::Tensor y = c.forward(x, w);
        y.backward(g);
        std::snprintf(cell, sizeof(cell), "%7.2f %4.1f %4.1f %4.1f", ms, sqnr_db(out64, y), sqnr_db(gi64, x.grad()),
                      sqnr_db(gw64, w.grad()));
      } catch (const std::exception& e) {
        // e.g. MXFP8's hardware GEMM on a pre-Blackwell GPU: say so in the cell, in full below.
        std::snprintf(cell, sizeof(cell), "n/a: %.21s", e.what());
        not_available.emplace(r, e.what());
      }
      std::printf(" | %-26s", cell);
    }
    std::printf("\n");
  }
  // One line per recipe this machine could not run: "n/a <recipe>: <why>"
  // (scripts/bench/gpu_parsers.py reads them).
  for (const auto& [recipe, why] : not_available) std::printf("n/a %s: %s\n", recipe.c_str(), why.c_str());
  if (!cuda) std::printf("CPU block-scaled GEMMs are emulations (dequantize + float32 GEMM): the times measure the casts.\n");
}

}  // namespace

int main(int argc, char** argv) {
  // Line-buffered even into a file: a crash keeps the rows already measured in the log.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  CLI::App app{"titan-bench-linear: fwd+bwd of Linear vs Float8Linear (each recipe) vs "
               "Int8Linear by (M, K, N)"};
  std::string device_name = torch::cuda::is_available() ? "cuda" : "cpu";
  int64_t scale = 0, tokens = 4096;
  int iters = 0;
  std::vector<int64_t> dims = {1024, 2048, 4096, 8192};
  app.add_option("--device", device_name, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--scale", scale, "divide M, K and N by this (0: 1 on CUDA, 4 on CPU)");
  app.add_option("--tokens", tokens, "M before --scale");
  app.add_option("--dims", dims, "K and N values of the grid (before --scale)");
  app.add_option("--iters", iters, "timed iterations (0: 10 on CUDA, 2 on CPU)");
  bool skip_block_scaled = false;
  app.add_flag("--skip-block-scaled", skip_block_scaled, "only the float8 / int8 table");
  std::string trace_dir;
  app.add_option("--trace", trace_dir, "write Kineto traces of the last shape's linears into this folder")
      ->check(CLI::ExistingDirectory);
  CLI11_PARSE(app, argc, argv);

  const bool cuda = device_name == "cuda";
  if (scale <= 0) scale = cuda ? 1 : 4;
  if (iters <= 0) iters = cuda ? 10 : 2;
  const at::TensorOptions opts =
      at::TensorOptions().device(cuda ? at::kCUDA : at::kCPU).dtype(cuda ? at::kBFloat16 : at::kFloat);
  const std::vector<std::string> recipes = titan::float8::recipe_names();
  std::printf("titan-bench-linear: device %s, float8 %s, scale 1/%lld, %d iters, %d threads\n",
              device_name.c_str(), cuda ? "_scaled_mm" : "EMULATED", static_cast<long long>(scale),
              iters, at::get_num_threads());
  std::printf("cell = fwd+bwd ms / faster than hp? / auto_filter_small_kn decision (unscaled K, N)\n");
  std::printf("%5s %5s %5s | %8s", "M", "K", "N", "hp ms");
  for (const auto& r : recipes) std::printf(" | %-22s", r.c_str());
  std::printf(" | %-14s\n", "int8");

  at::manual_seed(0);
  for (int64_t K0 : dims) {
    for (int64_t N0 : dims) {
      const int64_t M = scaled(tokens, scale), K = scaled(K0, scale), N = scaled(N0, scale);
      at::Tensor x = at::randn({M, K}, opts).requires_grad_(true);
      at::Tensor w = at::randn({N, K}, opts).requires_grad_(true);
      at::Tensor g = at::randn({M, N}, opts);
      auto step = [&](titan::model::LinearCompute& c, const std::function<void()>& after) {
        return time_ms([&] {
          x.mutable_grad().reset();
          w.mutable_grad().reset();
          c.forward(x, w).backward(g);
          if (after) after();
        }, iters, cuda);
      };
      const bool last_shape = K0 == dims.back() && N0 == dims.back();
      auto trace = [&](const std::string& name, titan::model::LinearCompute& c) {
        if (trace_dir.empty() || !last_shape) return;
        trace_linear(trace_dir, name, [&] {
          x.mutable_grad().reset();
          w.mutable_grad().reset();
          c.forward(x, w).backward(g);
        }, cuda);
      };
      titan::model::HighPrecisionLinearCompute hp;
      const double hp_ms = step(hp, {});
      trace("hp", hp);
      std::printf("%5lld %5lld %5lld | %8.2f", static_cast<long long>(M),
                  static_cast<long long>(K), static_cast<long long>(N), hp_ms);
      for (const auto& r : recipes) {
        titan::float8::Float8LinearCompute c(titan::float8::recipe_from_name(r));
        std::function<void()> after;
        if (c.recipe().delayed) after = [&] { titan::float8::sync_amax_history({&c}); };
        const double ms = step(c, after);
        if (!c.recipe().delayed) trace(r, c);
        const bool skip = !titan::float8::auto_filter_skip_reason(r, K0, N0).empty();
        char cell[64];
        std::snprintf(cell, sizeof(cell), "%8.2f %-3s %s", ms, ms < hp_ms ? "yes" : "no",
                      skip ? "skip" : "convert");
        std::printf(" | %-22s", cell);
      }
      titan::float8::Int8LinearCompute i8;
      const double i8_ms = step(i8, {});
      std::printf(" | %8.2f %-3s\n", i8_ms, i8_ms < hp_ms ? "yes" : "no");
    }
  }
  if (!cuda) std::printf("CPU float8 is an emulation: 'no' everywhere is expected; run on CUDA to "
                         "check the auto filter thresholds.\n");
  if (!skip_block_scaled) block_scaled_table(dims, tokens, scale, iters, cuda, opts);
  return 0;
}
