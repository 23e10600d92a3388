// The fused RMSNorm / RoPE / SwiGLU kernels (model/kernels/fused_ops.h) against the ATen
// composites they replace, forward and backward, on the CPU and (CUDA build, with a GPU) CUDA.
//
// Tolerances come from float32 rounding (u = 2^-24, the unit roundoff):
// - a sum of n products computed in another order differs by at most ~2 n u sum|terms| (each
//   order's error is <= (n - 1) u sum|terms|); the bounds below are built from the terms
//   themselves (`bound` tensors), not from a guessed constant;
// - RoPE evaluates the same products and sums as the composite: bit-identical;
// - SwiGLU's sigmoid comes from another exp implementation (each <= 2 ulp): the forward is a
//   handful of roundings, <= 16 u relative.
#include <ATen/Parallel.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/rms_norm.h>
#include <ATen/ops/rsqrt.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros_like.h>
#include <torch/csrc/autograd/autograd.h>

#include <catch2/catch.hpp>
#include <cmath>

#include "model/init_fill.h"
#include "model/kernels/fused_ops.h"
#include "model/kernels/fused_ops_cuda.h"
#include "model/transformer.h"

using namespace titan::model;

namespace {

constexpr double kU = 1.0 / (1 << 24);  // float32 unit roundoff

// Every |actual - expected| <= bound (elementwise); prints the worst excess on failure.
void check_within(const at::Tensor& actual, const at::Tensor& expected, const at::Tensor& bound) {
  at::Tensor excess = (actual - expected).abs() - bound;
  INFO("max |diff| - bound = " << excess.max().item<double>() << " (max |diff| "
                               << (actual - expected).abs().max().item<double>() << ")");
  CHECK(excess.max().item<double>() <= 0.0);
}

at::Tensor leaf(at::Tensor t) { return t.detach().requires_grad_(true); }

// The composite RoPE (the model's float32 path before the fused kernel).
at::Tensor rotary_composite(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t s = x.size(1);
  at::Tensor c = cos.slice(0, 0, s).unsqueeze(0).unsqueeze(2), sn = sin.slice(0, 0, s).unsqueeze(0).unsqueeze(2);
  at::Tensor pairs = x.unflatten(-1, {-1, 2});
  at::Tensor even = pairs.select(-1, 0), odd = pairs.select(-1, 1);
  return at::stack({even * c - odd * sn, even * sn + odd * c}, -1).flatten(-2);
}

struct Grads {
  at::Tensor out, gx, gw;
};

Grads rms_norm_run(bool fused, const at::Tensor& x0, const at::Tensor& w0, const at::Tensor& g) {
  at::Tensor x = leaf(x0), w = leaf(w0);
  at::Tensor y = fused ? fused_rms_norm(x, w, 1e-5) : at::rms_norm(x, {w.size(0)}, w, 1e-5);
  torch::autograd::backward({y}, {g});
  return {y.detach(), x.grad(), w.grad()};
}

void check_rms_norm(c10::Device device) {
  // dim 67 and 111 rows: vector bodies and scalar tails, several weight-gradient blocks.
  const int64_t rows = 111, dim = 67;
  auto opt = at::TensorOptions().device(device);
  at::Tensor x = at::randn({3, 37, dim}, opt), w = at::rand({dim}, opt) + 0.5, g = at::randn({3, 37, dim}, opt);
  Grads f = rms_norm_run(true, x, w, g), c = rms_norm_run(false, x, w, g);
  // y = x * rstd * w: rstd's sum of dim squares (positive terms) in another order, relative
  // <= 2 dim u, halved by the square root, plus the 3 roundings of rsqrt and the two products.
  check_within(f.out, c.out, c.out.abs() * ((dim + 4) * kU));
  // gx = rstd g w - x rstd^3 sum(g w x)/dim: the sum of dim signed terms in another order,
  // <= 2 dim u sum|g w x| per row, times |x| rstd^3 / dim; the rest are a few roundings of the
  // two terms (and rstd's own relative error, dim u, on each).
  at::Tensor xr = x.reshape({rows, dim}), gr = g.reshape({rows, dim});
  at::Tensor rstd = at::rsqrt(xr.pow(2).mean(-1, true) + 1e-5);
  at::Tensor term1 = (gr * w).abs() * rstd, sum_abs = (gr * w * xr).abs().sum(-1, true);
  at::Tensor term2 = xr.abs() * rstd.pow(3) * sum_abs / dim;
  at::Tensor gx_bound = term2 * (2 * dim * kU) + (term1 + term2) * ((2 * dim + 8) * kU);
  check_within(f.gx.reshape({rows, dim}), c.gx.reshape({rows, dim}), gx_bound);
  // gw = sum over rows of g * xhat: 2 rows u sum|g xhat| plus xhat's own error (dim + 4) u.
  at::Tensor gxhat = (gr * xr * rstd).abs().sum(0);
  check_within(f.gw, c.gw, gxhat * ((2 * rows + dim + 4) * kU));
}

void check_rotary(c10::Device device) {
  auto opt = at::TensorOptions().device(device);
  // head_dim 36: 18 pairs = 2 vectors of 8 + a scalar tail. Table longer than the sequence.
  RotaryTable table = make_rotary_table(36, 40, 10000.0, device);
  at::Tensor x0 = at::randn({2, 19, 3, 36}, opt), g = at::randn({2, 19, 3, 36}, opt);
  at::Tensor xf = leaf(x0), xc = leaf(x0);
  at::Tensor yf = fused_rotary(xf, table.cos, table.sin), yc = rotary_composite(xc, table.cos, table.sin);
  // The same float32 products and sums in the same order: equal bit for bit.
  CHECK(at::equal(yf, yc));
  torch::autograd::backward({yf}, {g});
  torch::autograd::backward({yc}, {g});
  // Backward: the inverse rotation, the same two products and one sum per element as autograd's
  // backward of the composite (sums of two terms are exact in either order): bit for bit.
  CHECK(at::equal(xf.grad(), xc.grad()));
}

void check_swiglu(c10::Device device) {
  auto opt = at::TensorOptions().device(device);
  at::Tensor gate0 = at::randn({5, 7, 29}, opt) * 3, up0 = at::randn({5, 7, 29}, opt), dy = at::randn({5, 7, 29}, opt);
  at::Tensor gf = leaf(gate0), uf = leaf(up0), gc = leaf(gate0), uc = leaf(up0);
  at::Tensor yf = fused_swiglu(gf, uf), yc = at::silu(gc) * uc;
  // silu = g / (1 + exp(-g)) then * up: exp (each side <= 2 ulp) and 3 roundings each side.
  check_within(yf, yc, yc.abs() * (16 * kU));
  torch::autograd::backward({yf}, {dy});
  torch::autograd::backward({yc}, {dy});
  // dgate = dy up s (1 + g (1 - s)): 1 + g(1 - s) cancels near g = -1.28, so the bound is
  // relative to its terms' magnitudes (1 + |g| (1 - s)), not to the result.
  at::Tensor s = at::sigmoid(gate0);
  at::Tensor dgate_terms = (dy * up0 * s).abs() * (1 + gate0.abs() * (1 - s));
  check_within(gf.grad(), gc.grad(), dgate_terms * (32 * kU));
  check_within(uf.grad(), uc.grad(), (dy * gate0 * s).abs() * (16 * kU));
}

// A bf16 kernel widens each row (span) to float32 exactly, runs the float32 row code and rounds
// each output once to nearest even: forward and backward outputs must equal the float32
// kernel's on the same device, rounded, bit for bit. Shapes with vector bodies, scalar tails,
// several RMSNorm weight-gradient blocks and several SwiGLU spans (1024 elements).
void check_bf16_is_rounded_float32(c10::Device device) {
  at::manual_seed(11);
  const auto opt = at::TensorOptions().device(device);
  auto bf16 = [](const at::Tensor& t) { return t.to(at::kBFloat16); };
  auto fp32 = [](const at::Tensor& t) { return t.to(at::kFloat); };
  // bf16 unit roundoff 2^-8: the fused form rounds once; a bf16 composite rounds an intermediate
  // too (rms_norm: x * rstd, then * w; silu, then * up): <= 3 roundings, bound 2^-6 relative
  // (no cancellation in these forwards).
  const double kBf16Composite = 1.0 / 64;
  {
    const int64_t dim = 67;
    const at::Tensor x = bf16(at::randn({3, 37, dim}, opt)), w = bf16(at::rand({dim}, opt) + 0.5);
    const at::Tensor g = bf16(at::randn({3, 37, dim}, opt));
    const Grads h = rms_norm_run(true, x, w, g), f = rms_norm_run(true, fp32(x), fp32(w), fp32(g));
    REQUIRE(h.out.scalar_type() == at::kBFloat16);
    CHECK(at::equal(h.out, bf16(f.out)));
    CHECK(at::equal(h.gx, bf16(f.gx)));
    CHECK(at::equal(h.gw, bf16(f.gw)));
    const at::Tensor c = at::rms_norm(x, {dim}, w, 1e-5);
    check_within(fp32(h.out), fp32(c), fp32(c).abs() * kBf16Composite);
  }
  {
    RotaryTable table = make_rotary_table(36, 40, 10000.0, device);
    const at::Tensor x0 = bf16(at::randn({2, 19, 3, 36}, opt)), g = bf16(at::randn({2, 19, 3, 36}, opt));
    at::Tensor xh = leaf(x0), xf = leaf(fp32(x0));
    const at::Tensor yh = fused_rotary(xh, table.cos, table.sin), yf = fused_rotary(xf, table.cos, table.sin);
    torch::autograd::backward({yh}, {g});
    torch::autograd::backward({yf}, {fp32(g)});
    CHECK(at::equal(yh, bf16(yf)));
    CHECK(at::equal(xh.grad(), bf16(xf.grad())));
    // The model's composite for bf16 rotates in float32 and rounds once: the same bits.
    CHECK(at::equal(yh, bf16(rotary_composite(fp32(x0), table.cos, table.sin))));
  }
  {
    const at::Tensor gate0 = bf16(at::randn({5, 7, 61}, opt) * 3), up0 = bf16(at::randn({5, 7, 61}, opt));
    const at::Tensor dy = bf16(at::randn({5, 7, 61}, opt));
    at::Tensor gh = leaf(gate0), uh = leaf(up0), gf = leaf(fp32(gate0)), uf = leaf(fp32(up0));
    const at::Tensor yh = fused_swiglu(gh, uh), yf = fused_swiglu(gf, uf);
    torch::autograd::backward({yh}, {dy});
    torch::autograd::backward({yf}, {fp32(dy)});
    CHECK(at::equal(yh, bf16(yf)));
    CHECK(at::equal(gh.grad(), bf16(gf.grad())));
    CHECK(at::equal(uh.grad(), bf16(uf.grad())));
    const at::Tensor c = at::silu(gate0) * up0;
    check_within(fp32(yh), fp32(c), fp32(c).abs() * kBf16Composite);
  }
}

}  // namespace

TEST_CASE("fused RMSNorm forward and backward match at::rms_norm", "[model][fused]") {
  REQUIRE(fused_ops_enabled());
  check_rms_norm(at::kCPU);
}

TEST_CASE("fused RoPE forward and backward equal the composite bit for bit", "[model][fused]") {
  check_rotary(at::kCPU);
}

TEST_CASE("fused SwiGLU forward and backward match silu(gate) * up", "[model][fused]") {
  check_swiglu(at::kCPU);
}

TEST_CASE("titan's CPU kernels give the same bits on 1 and 2 intra-op threads", "[model][fused]") {
  // Note [OpenMP in titan's kernels]: the kernels' at::parallel_for loops split work into
  // fixed-size blocks (rows; weight-gradient blocks summed in block order; init elements), so the
  // thread count changes who computes a block, never what is summed with what. Shapes well above
  // the grain (32 Ki elements) so that two threads do split them.
  at::manual_seed(3);
  auto run = [](int threads) {
    at::set_num_threads(threads);
    at::manual_seed(4);
    const int64_t rows = 2048, dim = 256;
    at::Tensor x = at::randn({rows, dim}), w = at::rand({dim}) + 0.5, g = at::randn({rows, dim});
    Grads norm = rms_norm_run(true, x, w, g);
    at::Tensor gate = leaf(at::randn({rows, dim})), up = leaf(at::randn({rows, dim}));
    at::Tensor y = fused_swiglu(gate, up);
    torch::autograd::backward({y}, {g});
    RotaryTable table = make_rotary_table(64, 512, 10000.0, at::kCPU);
    at::Tensor q = leaf(at::randn({2, 512, 4, 64}));
    at::Tensor r = fused_rotary(q, table.cos, table.sin);
    torch::autograd::backward({r}, {at::randn({2, 512, 4, 64})});
    at::Tensor init = at::empty({rows, dim});
    InitSpec spec;
    spec.std = 0.02;
    spec.lo = -0.06;
    spec.hi = 0.06;
    fill_init_box(init, spec, 7, "layers.0.attention.wq.weight", {4 * rows, dim}, {rows, 0});
    return std::vector<at::Tensor>{norm.out, norm.gx, norm.gw, y.detach(), gate.grad(), up.grad(),
                                   r.detach(), q.grad(), init};
  };
  const int before = at::get_num_threads();
  const std::vector<at::Tensor> one = run(1), two = run(2);
  at::set_num_threads(before);
  REQUIRE(one.size() == two.size());
  for (size_t i = 0; i < one.size(); ++i) {
    INFO("output " << i);
    CHECK(at::equal(one[i], two[i]));
  }
}

TEST_CASE("bfloat16 fused kernels are the float32 kernels on the upcast inputs, rounded; the bf16 composites agree "
          "within bf16 rounding",
          "[model][fused]") {
  // One intra-op chunk on the CPU: the test is of the arithmetic, not of the split.
  const int before = at::get_num_threads();
  at::set_num_threads(1);
  check_bf16_is_rounded_float32(at::kCPU);
  at::set_num_threads(before);
}

TEST_CASE("the sum of squares of a bf16 tensor matches float64 and does not depend on the thread count",
          "[model][fused]") {
  // float32 sums of at most 4096 positive terms per block (relative error <= 4096 u = 2.4e-4),
  // blocks added in float64 in order: the bound 4096 u relative; 1 and 2 threads: equal bits.
  at::manual_seed(8);
  const at::Tensor x = (at::randn({3, 70001}) * 5).to(at::kBFloat16);  // 52 blocks and a tail
  const double want = x.to(at::kDouble).pow(2).sum().item<double>();
  const int before = at::get_num_threads();
  at::set_num_threads(1);
  const double one = sum_of_squares(x);
  at::set_num_threads(2);
  const double two = sum_of_squares(x);
  at::set_num_threads(before);
  CHECK(std::abs(one - want) <= want * 4096 * kU);
  CHECK(one == two);
}

TEST_CASE("fused ops leave other dtypes to the composite and reject bad shapes", "[model][fused]") {
  // float64 (the finite-difference tests' dtype) takes the composite: exactly at::rms_norm.
  at::Tensor x = at::randn({4, 8}, at::kDouble), w = at::rand({8}, at::kDouble);
  CHECK(at::equal(fused_rms_norm(x, w, 1e-5), at::rms_norm(x, {8}, w, 1e-5)));
  CHECK_THROWS_WITH(fused_rms_norm(at::randn({4, 8}), at::rand({7}), 1e-5),
                    Catch::Contains("does not match the last dim"));
  RotaryTable table = make_rotary_table(8, 4, 10000.0, at::kCPU);
  CHECK_THROWS_WITH(fused_rotary(at::randn({1, 5, 2, 8}), table.cos, table.sin),
                    Catch::Contains("does not cover"));
  CHECK_THROWS_WITH(fused_swiglu(at::randn({2, 3}), at::randn({3, 2})), Catch::Contains("differ in shape"));
}

#ifdef TITAN_WITH_CUDA
TEST_CASE("CUDA fused ops match the composites", "[model][fused][cuda]") {
  REQUIRE(fused_ops_cuda_enabled());  // the default (Note [Fused ops on CUDA])
  check_rms_norm(at::kCUDA);
  check_rotary(at::kCUDA);
  check_swiglu(at::kCUDA);
  check_bf16_is_rounded_float32(at::kCUDA);
}
#endif
