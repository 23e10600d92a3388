// titan-bench-optimizer: one AdamW step over a parameter of N elements, the way a bf16 run takes
// it in titan (the float32 master updated from its bf16 compute copy's gradient, the copy
// rewritten in the same pass: trainer/optim/adamw_kernels.h) against what eager PyTorch and
// torchtitan run (ATen's fused AdamW, `torch.optim.AdamW(fused=True)`, over a float32 gradient),
// in the same process, alternating call by call. Both move 28 bytes per element: titan reads the
// master, two moments and a 2-byte gradient and writes them back with a 2-byte copy; ATen reads
// and writes master and moments and reads a 4-byte gradient. The median of the calls (this
// machine's memory bandwidth moves from one call to the next).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/randn.h>
#include <torch/cuda.h>

#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "apps/bench_common.h"
#include "trainer/optim/optimizer.h"

namespace {

using titan::trainer::optim::AdamW;

using titan::bench::call_ms;
using titan::bench::median;

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  CLI::App app{"titan-bench-optimizer: titan's AdamW over a bf16 compute copy vs ATen's fused AdamW"};
  std::string device_name = torch::cuda::is_available() ? "cuda" : "cpu";
  int64_t elements = 100'000'000;  // bench_train.sh's 100M model
  int iters = 15;
  int threads = 0;
  app.add_option("--device", device_name, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--elements", elements, "parameter elements (default 10^8)")->check(CLI::PositiveNumber);
  app.add_option("--iters", iters, "timed calls of each (median reported)")->check(CLI::Range(1, 10000));
  app.add_option("--threads", threads, "intra-op threads on the CPU (default: LibTorch's)")->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);
  const bool cuda = device_name == "cuda";
  if (cuda && !torch::cuda::is_available()) {
    std::fprintf(stderr, "titan-bench-optimizer: --device cuda, but no CUDA device is available\n");
    return 1;
  }
  if (threads > 0) at::set_num_threads(threads);
  const auto opts = at::TensorOptions().device(cuda ? at::kCUDA : at::kCPU);

  // titan: master + bf16 compute copy whose gradient the step reads.
  at::Tensor master = at::randn({elements}, opts);
  at::Tensor copy = master.to(at::kBFloat16).requires_grad_(true);
  const at::Tensor grad16 = (at::randn({elements}, opts) * 1e-2).to(at::kBFloat16);
  AdamW titan_adamw({master}, {}, {copy});
  // The peer: a float32 parameter and gradient through ATen's fused kernel.
  at::Tensor param = master.clone().requires_grad_(true);
  const at::Tensor grad32 = grad16.to(at::kFloat);
  AdamW aten_adamw({param}, {});

  auto titan_step = [&] {
    copy.mutable_grad() = grad16;
    titan_adamw.step(1e-4, 0.5);  // a clipped step: the gradient scaled in the same pass
  };
  auto aten_step = [&] {
    param.mutable_grad() = grad32;
    aten_adamw.step(1e-4);
  };
  titan_step();  // warm-up: the moments' first touch
  aten_step();
  std::vector<double> titan_ms, aten_ms;
  for (int i = 0; i < iters; ++i) {
    titan_ms.push_back(call_ms(titan_step, cuda));
    aten_ms.push_back(call_ms(aten_step, cuda));
  }
  const double t = median(titan_ms), a = median(aten_ms);
  const double gb = 28.0 * static_cast<double>(elements) / 1e9;  // per call, both
  std::printf("device %s, %lld elements, %s, %d calls each, alternating; median ms\n\n", device_name.c_str(),
              static_cast<long long>(elements),
              cuda ? "CUDA" : ("intra-op threads " + std::to_string(at::get_num_threads())).c_str(), iters);
  std::printf("| step | ms | GB/s (28 B per element) | vs ATen fused |\n|---|---|---|---|\n");
  std::printf("| titan AdamW over a bf16 compute copy | %.2f | %.1f | %.2fx |\n", t, gb / t * 1e3, a / t);
  std::printf("| ATen fused AdamW, float32 gradient | %.2f | %.1f | 1.00x |\n", a, gb / a * 1e3);
  return 0;
}
