// titan-bench-matmul: GEMM throughput of high precision vs float8 (tensorwise, rowwise) vs int8
// on the Llama 3 8B / 70B linear shapes (torchao's bench_matmul.py). Operands are quantized
// before timing: this measures the GEMM alone. On the CPU every float8 GEMM is the emulation
// (dequantize + fp32 mm), labelled "emulated", and --scale shrinks M, K, N so the table takes
// about a minute; on CUDA (TITAN_CUDA build) it times at::_scaled_mm / at::_int_mm.
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/cpu/Utils.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/randn.h>
#include <torch/cuda.h>

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "apps/bench_common.h"
#include "float8/gemm.h"
#include "float8/int8_linear.h"
#include "float8/scaling.h"

namespace {

using titan::float8::CastConfig;
using titan::float8::ScalingGranularity;

struct Shape {
  const char* model;
  const char* name;
  int64_t K, N;  // in_features, out_features
};

// Unsharded Llama 3 linears (dim, hidden, 8 kv heads x 128); the vocab projection is
// excluded, as filter_fqns excludes it from float8 by default.
const std::vector<Shape> kShapes = {
    {"8B", "wq/wo", 4096, 4096},   {"8B", "wk/wv", 4096, 1024},  {"8B", "w1/w3", 4096, 14336},
    {"8B", "w2", 14336, 4096},     {"70B", "wq/wo", 8192, 8192}, {"70B", "wk/wv", 8192, 1024},
    {"70B", "w1/w3", 8192, 28672}, {"70B", "w2", 28672, 8192},
};

using titan::bench::scaled;
using titan::bench::time_ms;

}  // namespace

int main(int argc, char** argv) {
  // Line-buffered even into a file: a crash keeps the rows already measured in the log.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  CLI::App app{"titan-bench-matmul: GEMM throughput, high precision vs float8 vs int8, on the "
               "Llama 3 8B/70B linear shapes"};
  std::string device_name = torch::cuda::is_available() ? "cuda" : "cpu";
  int64_t scale = 0;
  int64_t tokens = 8192;
  int iters = 0;
  app.add_option("--device", device_name, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--scale", scale, "divide M, K and N by this (0: 1 on CUDA, 4 on CPU)");
  app.add_option("--tokens", tokens, "M = tokens per GEMM (batch x sequence) before --scale");
  app.add_option("--iters", iters, "timed iterations per GEMM (0: 20 on CUDA, 3 on CPU)");
  CLI11_PARSE(app, argc, argv);

  const bool cuda = device_name == "cuda";
  if (scale <= 0) scale = cuda ? 1 : 4;
  if (iters <= 0) iters = cuda ? 20 : 3;
  const at::Device device = cuda ? at::Device(at::kCUDA) : at::Device(at::kCPU);
  const at::ScalarType hp = cuda ? at::kBFloat16 : at::kFloat;
  const char* f8_label = cuda ? "" : " (emulated)";
  std::printf("titan-bench-matmul: device %s, high precision %s, float8%s, scale 1/%lld, "
              "%d iters, %d threads\n",
              device_name.c_str(), c10::toString(hp), cuda ? " via _scaled_mm" : " emulated",
              static_cast<long long>(scale), iters, at::get_num_threads());
  std::printf("%-4s %-6s %6s %6s %6s | %9s %8s | %-22s | %-22s | %-22s\n", "model", "linear", "M",
              "K", "N", "hp ms", "TFLOP/s", (std::string("f8 tensorwise") + f8_label).c_str(),
              (std::string("f8 rowwise") + f8_label).c_str(),
              // Which exact int8 product Auto picks here (See Note [CPU int8 GEMM] in int8_linear.cpp).
              cuda || at::cpu::is_avx512_vnni_supported() ? "int8 (_int_mm)" : "int8 (float64 exact)");

  at::manual_seed(0);
  for (const Shape& s : kShapes) {
    const int64_t M = scaled(tokens, scale), K = scaled(s.K, scale), N = scaled(s.N, scale);
    at::Tensor A = at::randn({M, K}, at::TensorOptions().device(device).dtype(hp));
    at::Tensor W = at::randn({N, K}, at::TensorOptions().device(device).dtype(hp));
    const double flop = 2.0 * M * K * N;
    const double hp_ms = time_ms([&] { at::mm(A, W.t()); }, iters, cuda);

    auto f8_ms = [&](ScalingGranularity g) {
      const CastConfig cfg{g, at::kFloat8_e4m3fn};
      auto a8 = titan::float8::to_float8(A, cfg, -1, g == ScalingGranularity::Axiswise);
      auto w8 = titan::float8::transpose_2d(
          titan::float8::to_float8(W, cfg, -1, g == ScalingGranularity::Axiswise));
      return time_ms([&] {
        titan::float8::scaled_mm(a8, w8, hp, /*use_fast_accum=*/true,
                                 titan::float8::GemmBackend::Auto);
      }, iters, cuda);
    };
    const double tw = f8_ms(ScalingGranularity::Tensorwise);
    const double rw = f8_ms(ScalingGranularity::Axiswise);
    auto a_q = titan::float8::quantize_int8_rowwise(A);
    auto w_q = titan::float8::quantize_int8_rowwise(W);
    const double i8 = time_ms([&] {
      titan::float8::int8_scaled_mm(a_q, w_q, hp, titan::float8::Int8MmBackend::Auto);
    }, iters, cuda);

    auto cell = [&](double ms) {
      static char buf[64];
      std::snprintf(buf, sizeof(buf), "%8.2f ms %5.2fx", ms, hp_ms / ms);
      return std::string(buf);
    };
    std::printf("%-5s %-6s %6lld %6lld %6lld | %9.2f %8.2f | %-22s | %-22s | %-22s\n", s.model,
                s.name, static_cast<long long>(M), static_cast<long long>(K),
                static_cast<long long>(N), hp_ms, flop / hp_ms / 1e9, cell(tw).c_str(),
                cell(rw).c_str(), cell(i8).c_str());
  }
  std::printf("speedup = hp ms / variant ms (> 1: faster than high precision)%s\n",
              cuda ? "" : "; CPU float8 is an emulation and is expected to be slower");
  return 0;
}
