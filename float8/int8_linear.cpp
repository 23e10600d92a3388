#include "float8/int8_linear.h"

#include <ATen/cpu/Utils.h>
#include <ATen/ops/_int_mm.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/amax.h>
#include <ATen/ops/clamp.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/round.h>

#include <sstream>
#include <stdexcept>

#include "model/linear_autograd.h"

namespace titan::float8 {

namespace {

constexpr double kInt8Eps = 1e-12;
// 2^31 / 128^2: beyond this K the exact int32 accumulation could overflow.
constexpr int64_t kMaxInt8K = 131072;

}  // namespace

Int8Tensor quantize_int8_rowwise(const at::Tensor& t) {
  if (t.dim() != 2) {
    std::ostringstream os;
    os << "quantize_int8_rowwise: needs a 2-D tensor, got " << t.sizes();
    throw std::invalid_argument(os.str());
  }
  at::Tensor scale = at::amax(at::abs(t), {1}) / 127;  // [R] in t's dtype
  at::Tensor denom = at::clamp(scale.to(at::kFloat), kInt8Eps).unsqueeze(1);  // [R, 1]
  // at::round is round-half-to-even, as torch.round.
  at::Tensor q = at::clamp(at::round(t.to(at::kFloat) / denom), -128, 127).to(at::kChar);
  return {q, scale};
}

bool int_mm_supported(const at::Tensor& a, const at::Tensor& b) {
  // Note [CPU int8 GEMM]: at::_int_mm's CPU kernel is fast only with AVX512-VNNI; on an AVX2 CPU
  // (measured: AMD EPYC, 2 threads) it took 15-20x the time of the exact float64 product of the
  // same operands (512x256x2048: 240 ms vs 16 ms; 128x256x256: 7.9 ms vs 0.49 ms). Both give the
  // same int32 bits, so the choice is speed only.
  if (!a.is_cuda()) return a.device().is_cpu() && at::cpu::is_avx512_vnni_supported();
  return a.size(0) > 16 && a.size(1) % 8 == 0 && b.size(1) % 8 == 0;
}

at::Tensor int8_mm(const at::Tensor& a, const at::Tensor& b, Int8MmBackend backend) {
  if (a.dim() != 2 || b.dim() != 2 || a.size(1) != b.size(0) || a.scalar_type() != at::kChar ||
      b.scalar_type() != at::kChar) {
    std::ostringstream os;
    os << "int8_mm: needs int8 a [M, K] and b [K, N], got a " << a.sizes() << " "
       << a.scalar_type() << " and b " << b.sizes() << " " << b.scalar_type();
    throw std::invalid_argument(os.str());
  }
  if (a.size(1) > kMaxInt8K) {
    throw std::invalid_argument("int8_mm: K = " + std::to_string(a.size(1)) +
                                " exceeds 131072, where int32 accumulation of int8 products can "
                                "overflow; split the GEMM");
  }
  const bool use_int_mm = backend == Int8MmBackend::IntMm ||
                          (backend == Int8MmBackend::Auto && int_mm_supported(a, b));
  if (use_int_mm) return at::_int_mm(a, b);
  return at::mm(a.to(at::kDouble), b.to(at::kDouble)).to(at::kInt);
}

at::Tensor int8_scaled_mm(const Int8Tensor& a, const Int8Tensor& b_cols, at::ScalarType out_dtype,
                          Int8MmBackend backend) {
  at::Tensor acc = int8_mm(a.data, b_cols.data.t(), backend);  // [M, N] int32
  return (acc.to(at::kFloat) * a.scale.to(at::kFloat).unsqueeze(1) *
          b_cols.scale.to(at::kFloat).unsqueeze(0))
      .to(out_dtype);
}

namespace {

// The products through the linears' skeleton (Note [One linear skeleton] in
// model/linear_autograd.h), each GEMM in int8 unless its switch is off: the output GEMM (the
// quantization included) is the skeleton's "mm", kept by per-op selective AC as every linear's.
class Int8Arithmetic final : public titan::model::LinearArithmetic {
 public:
  explicit Int8Arithmetic(c10::intrusive_ptr<Int8LinearState> state) : state_(std::move(state)) {}

  at::Tensor output(const at::Tensor& input, const at::Tensor& weight) override {
    const at::Tensor x = input.reshape({-1, weight.size(1)});  // [M, K]
    // x per row, W^T per column = W per row.
    if (state_->gemms.output)
      return int8_scaled_mm(quantize_int8_rowwise(x), quantize_int8_rowwise(weight), input.scalar_type(),
                            state_->backend);
    return at::mm(x, weight.t().to(x.scalar_type()));  // [M, N]
  }

  Grads backward(const at::Tensor& G, const at::Tensor& input, const at::Tensor& weight, bool need_input,
                 bool need_weight) override {
    const Int8LinearState& s = *state_;
    const at::Tensor x = input.reshape({-1, weight.size(1)});  // [M, K]
    Grads g;
    if (need_input) {
      if (s.gemms.grad_input) {
        // G per row [M, N]; W per column: its columns quantized as rows of W^T [K, N].
        g.input = int8_scaled_mm(quantize_int8_rowwise(G), quantize_int8_rowwise(weight.t()), input.scalar_type(),
                                 s.backend);
      } else {
        g.input = at::mm(G, weight.to(G.scalar_type()));
      }
      g.input = g.input.to(input.scalar_type());
    }
    if (need_weight) {
      if (s.gemms.grad_weight) {
        // (x^T @ G)^T: x^T [K, M] per row (= x per column), G per column (rows of G^T [N, M]).
        g.weight = int8_scaled_mm(quantize_int8_rowwise(x.t()), quantize_int8_rowwise(G.t()), weight.scalar_type(),
                                  s.backend)
                       .t();  // [N, K]
      } else {
        g.weight = at::mm(G.t(), x).to(weight.scalar_type());
      }
    }
    return g;
  }

 private:
  c10::intrusive_ptr<Int8LinearState> state_;
};

}  // namespace

Int8LinearCompute::Int8LinearCompute(Int8GemmSwitches gemms, Int8MmBackend backend)
    : state_(c10::make_intrusive<Int8LinearState>()) {
  state_->gemms = gemms;
  state_->backend = backend;
}

at::Tensor Int8LinearCompute::forward(const titan::model::LinearOperand& input_op,
                                      const titan::model::LinearOperand& weight_op) {
  if (input_op.chunks)
    throw std::invalid_argument(describe() + ": an input arriving in sequence chunks needs a column-parallel compute");
  if (input_op.cast.defined() || weight_op.cast.defined())
    throw std::invalid_argument(describe() + " was handed a float8 operand; int8 quantizes its own");
  const at::Tensor& input = input_op.hp;
  const at::Tensor& weight = weight_op.hp;
  titan::model::check_linear_shapes(describe(), input, weight);
  return titan::model::apply_linear(input, weight, c10::make_intrusive<Int8Arithmetic>(state_));
}

std::string Int8LinearCompute::describe() const {
  const Int8GemmSwitches& g = state_->gemms;
  std::string parts;
  if (!(g.output && g.grad_input && g.grad_weight)) {
    if (g.output) parts += "output,";
    if (g.grad_input) parts += "grad_input,";
    if (g.grad_weight) parts += "grad_weight,";
    if (parts.empty()) parts = "none,";
  }
  if (state_->backend == Int8MmBackend::Emulated) parts += "emulated,";
  if (state_->backend == Int8MmBackend::IntMm) parts += "int_mm,";
  if (parts.empty()) return "int8";
  parts.pop_back();
  return "int8[" + parts + "]";
}

}  // namespace titan::float8
