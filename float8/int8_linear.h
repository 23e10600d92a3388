// float8/int8_linear.h — INT8 mixed-precision training (torchao's int8_mixed_precision).
//
// Weights stay in high precision; each GEMM quantizes its operands on the fly to int8 with one
// scale per row of the left operand and one per column of the right operand (constant along
// the contraction dim), accumulates in int32 and rescales:
//   row scale = amax(|T|, dim=1) / 127                      (in T's dtype)
//   q         = clip(round_half_even(float(T) / max(float(scale), 1e-12)), -128, 127)  int8
//   out[m,n]  = float(acc[m,n]) * row_scale[m] * col_scale[n]
// output = x @ W^T (x per row, W per row); grad_input = G @ W (G per row, W per column);
// grad_weight = (x^T @ G)^T (x per column, G per column). Each GEMM can be switched back to
// high precision. (docs/float8.md, "INT8 mixed precision".)
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <string>

#include "model/linear.h"

namespace titan::float8 {

struct Int8Tensor {
  at::Tensor data;   // [R, C] int8
  at::Tensor scale;  // [R] in the source tensor's dtype: one scale per row
};

// Row-wise int8 quantization of a 2-D tensor (see the file comment for the formula).
Int8Tensor quantize_int8_rowwise(const at::Tensor& t);

enum class Int8MmBackend { Auto, IntMm, Emulated };

// Whether Auto uses at::_int_mm for these operands: on the CPU only with AVX512-VNNI (else the
// float64 emulation is many times faster, See Note [CPU int8 GEMM]); CUDA needs M > 16 and K, N
// multiples of 8.
bool int_mm_supported(const at::Tensor& a, const at::Tensor& b);

// Exact int32 product acc[M, N] = a [M, K] int8 @ b [K, N] int8. Auto uses at::_int_mm where
// supported and the emulation otherwise. The emulation multiplies in float64, which is exact:
// every product is an integer of magnitude <= 2^14 and every partial sum stays below 2^53.
// K is limited to 131072 so the exact result fits int32 (as it must for _int_mm too).
at::Tensor int8_mm(const at::Tensor& a, const at::Tensor& b, Int8MmBackend backend);

// out[M, N] = float(a.data @ b_cols.data^T) * a.scale[m] * b_cols.scale[n] in out_dtype.
// a: rows quantized [M, K]; b_cols: the right operand's columns quantized as rows [N, K].
at::Tensor int8_scaled_mm(const Int8Tensor& a, const Int8Tensor& b_cols, at::ScalarType out_dtype,
                          Int8MmBackend backend);

struct Int8GemmSwitches {
  bool output = true;       // output = x @ W^T in int8
  bool grad_input = true;   // grad_input = G @ W in int8
  bool grad_weight = true;  // grad_weight = (x^T @ G)^T in int8
};

class Int8LinearState : public torch::CustomClassHolder {
 public:
  Int8GemmSwitches gemms;
  Int8MmBackend backend = Int8MmBackend::Auto;
};

class Int8LinearCompute final : public titan::model::LinearCompute {
 public:
  explicit Int8LinearCompute(Int8GemmSwitches gemms = {},
                             Int8MmBackend backend = Int8MmBackend::Auto);

  // input [..., K], weight [N, K] -> [..., N] in input's dtype.
  at::Tensor forward(const titan::model::LinearOperand& input,
                     const titan::model::LinearOperand& weight) override;
  std::string describe() const override;  // "int8", "int8[output,grad_input]", "int8[emulated]"

  const Int8GemmSwitches& gemms() const { return state_->gemms; }

 private:
  c10::intrusive_ptr<Int8LinearState> state_;
};

}  // namespace titan::float8
