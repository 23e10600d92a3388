// The high-precision linear's float32 CPU products through either library
// (training.cpu_float32_gemm; Note [float32 GEMMs on the CPU] in model/linear.h).
//
// Tolerance from float32 rounding (u = 2^-24): any order of summing the K products of a dot
// product, with or without fused multiply-adds, lies within gamma_K = K u / (1 - K u) times the
// sum of the products' magnitudes of the exact value (Higham, Accuracy and Stability of
// Numerical Algorithms, 3.1). Each element is checked against a float64 product with that bound
// built from its own terms; aten must also stay bit for bit at::mm (the default changes nothing).
#include <ATen/ops/abs.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/autograd.h>

#include <catch2/catch.hpp>

#include "model/linear.h"

namespace tmod = titan::model;

namespace {

// |got - a b^T| <= gamma_K |a| |b|^T elementwise, a [M, K], b [N, K] (float64 reference).
void check_product(const at::Tensor& got, const at::Tensor& a, const at::Tensor& b) {
  const double k = static_cast<double>(a.size(1)), u = std::ldexp(1.0, -24);
  const double gamma = k * u / (1 - k * u);
  const at::Tensor exact = at::mm(a.to(at::kDouble), b.to(at::kDouble).t());
  const at::Tensor bound = at::mm(a.abs().to(at::kDouble), b.abs().to(at::kDouble).t()).mul_(gamma);
  const at::Tensor excess = (got.to(at::kDouble) - exact).abs() - bound;
  CHECK(excess.max().item<double>() <= 0);
}

}  // namespace

TEST_CASE("float32 linears on the CPU: oneDNN's products are float32 products of x W^T, G W and G^T x; aten stays at::mm bit for bit",
          "[model][linear]") {
  // The pinned x86 wheel carries oneDNN: without its linear op, training.cpu_float32_gemm = onednn
  // would be refused at start-up, and this case says so.
  REQUIRE(tmod::onednn_linear_available());
  // Shapes of a small model's projections, an input with a batch dimension (flattened to 2-D by
  // the linear), K large enough that the order of the sums matters.
  const at::Tensor x0 = at::randn({3, 37, 96}, at::TensorOptions().dtype(at::kFloat));
  const at::Tensor w0 = at::randn({160, 96});
  const at::Tensor g = at::randn({3, 37, 160});
  for (const tmod::CpuFloat32Gemm gemm : {tmod::CpuFloat32Gemm::kAten, tmod::CpuFloat32Gemm::kOneDnn}) {
    INFO((gemm == tmod::CpuFloat32Gemm::kAten ? "aten" : "onednn"));
    const tmod::CpuFloat32GemmScope choice(gemm);
    const at::Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
    tmod::HighPrecisionLinearCompute compute;
    const at::Tensor y = compute.forward(tmod::LinearOperand(x), tmod::LinearOperand(w));
    REQUIRE(y.sizes() == at::IntArrayRef({3, 37, 160}));
    torch::autograd::backward({y}, {g});
    const at::Tensor x2d = x0.reshape({-1, 96}), g2d = g.reshape({-1, 160});
    if (gemm == tmod::CpuFloat32Gemm::kAten) {
      CHECK(at::equal(y.reshape({-1, 160}), at::mm(x2d, w0.t())));
      CHECK(at::equal(x.grad().reshape({-1, 96}), at::mm(g2d, w0)));
      CHECK(at::equal(w.grad(), at::mm(g2d.t(), x2d)));
    } else {
      check_product(y.detach().reshape({-1, 160}), x2d, w0);         // x W^T: K = 96
      check_product(x.grad().reshape({-1, 96}), g2d, w0.t());        // G W: K = 160
      check_product(w.grad(), g2d.t().contiguous(), x2d.t().contiguous());  // G^T x: K = 111 rows
    }
  }
  // The same products through a deferred weight gradient (the zero-bubble schedules' W action).
  const tmod::CpuFloat32GemmScope choice(tmod::CpuFloat32Gemm::kOneDnn);
  // An empty sum (K = 0: an MoE expert's weight gradient when no token chose it) is zeros, and
  // empty rows an empty product.
  CHECK(at::equal(tmod::times_transposed(at::randn({5, 0}), at::randn({7, 0})), at::zeros({5, 7})));
  CHECK(tmod::times_transposed(at::randn({0, 16}), at::randn({8, 16})).sizes() == at::IntArrayRef({0, 8}));
  const at::Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
  tmod::HighPrecisionLinearCompute compute;
  const at::Tensor y = compute.forward(tmod::LinearOperand(x), tmod::LinearOperand(w));
  tmod::DeferredWeightGrads later;
  {
    const tmod::DeferWeightGrads scope(later);
    torch::autograd::backward({y}, {g});
  }
  CHECK(!w.grad().defined());
  later.run();
  check_product(w.grad(), g.reshape({-1, 160}).t().contiguous(), x0.reshape({-1, 96}).t().contiguous());
}
