// float8/cublaslt_common.h — what titan's cuBLASLt GEMMs share (CUDA build only): the RAII
// holder of their descriptors and the "first heuristic algorithm, then run" step, so the
// tensorwise float8 GEMM (cublaslt_gemm.cpp) and the block-scaled one (block_scaled_cublaslt.cpp)
// differ only in how they describe their operands and scales.
#pragma once

#include <c10/core/Device.h>
#include <cublasLt.h>

#include <string>

namespace titan::float8::detail {

// RAII for the descriptors so a failed call does not leak them.
struct LtDescriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  LtDescriptors() = default;
  LtDescriptors(const LtDescriptors&) = delete;
  LtDescriptors& operator=(const LtDescriptors&) = delete;
  ~LtDescriptors() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// With d.op, d.a, d.b, d.c described: limits the workspace to LibTorch's cuBLASLt workspace,
// takes cuBLASLt's first heuristic algorithm (none: std::runtime_error(no_algorithm)) and runs
// out = 1 * op(A) op(B) + 0 on `device`'s current stream, A's data at `a`, B's at `b`. Every
// call is checked with `hint` in its error.
void lt_matmul(LtDescriptors& d, const void* a, const void* b, void* out, c10::Device device,
               const std::string& hint, const std::string& no_algorithm);

}  // namespace titan::float8::detail
