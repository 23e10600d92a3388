// float8/gemm.h — the scaled float8 GEMM behind every float8 linear, with its back ends.
//
//   out[M, N] = (a.data / a.scale) @ (b.data / b.scale)          (docs/float8.md "Recipes")
// a: [M, K] scale 0-dim or (M, 1); b: [K, N] scale 0-dim or (1, N). Every scale is constant
// along the contraction dimension K, so out[i,j] = (1/sA[i]) (1/sB[j]) sum_k A8[i,k] B8[k,j].
// The back ends differ only in how that product is evaluated:
//   Emulated  any device: mm of the dequantized float32 operands, then out_dtype (exactly the
//             torchao's emulation, so CPU results are bit-comparable).
//   ScaledMm  CUDA at::_scaled_mm (CUDA build only).
//   CublasLt  cuBLASLt directly with tensorwise scale pointers (CUDA build only; axiswise
//             operands fall back to ScaledMm).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "float8/scaling.h"

namespace titan::float8 {

enum class GemmBackend { Auto, Emulated, ScaledMm, CublasLt };

const char* gemm_backend_name(GemmBackend backend);

// True when this titan_float8 was compiled with TITAN_WITH_CUDA (the _scaled_mm and cuBLASLt
// back ends exist).
bool float8_cuda_compiled();

// The CUDA device's compute capability as major * 10 + minor (90 for sm90); 0 for a non-CUDA
// device, in a CPU-only build, or when the device cannot be read.
int cuda_compute_capability(const c10::Device& device);

// Auto -> Emulated for non-CUDA tensors, ScaledMm for CUDA tensors. `emulate` forces Emulated.
// Throws std::invalid_argument for a CUDA back end on a non-CUDA device or in a CPU-only build.
GemmBackend resolve_gemm_backend(GemmBackend requested, bool emulate, const c10::Device& device);

// The scaled GEMM (see the file comment). Validates ranks, K agreement and the scale shapes.
at::Tensor scaled_mm(const Float8Tensor& a, const Float8Tensor& b, at::ScalarType out_dtype,
                     bool use_fast_accum, GemmBackend backend);

// (x * row_scale) * col_scale in float32, converted to `dtype`: the rescale after a rowwise GEMM
// run with unit scales. x float32 [M, N]; row_scale [M, 1], col_scale [1, N] float32. On CUDA one
// kernel for bf16 / float32 outputs (float8/kernels/gemm_epilogue.cuh), bit for bit the composite
// it replaces; otherwise that composite.
at::Tensor outer_scale(const at::Tensor& x, const at::Tensor& row_scale, const at::Tensor& col_scale,
                       at::ScalarType dtype);

// The Emulated back end on its own: at::mm(a.data.float() / sA, b.data.float() / sB).
at::Tensor scaled_mm_emulated(const Float8Tensor& a, const Float8Tensor& b,
                              at::ScalarType out_dtype);

}  // namespace titan::float8
