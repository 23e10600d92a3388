// Compiled only when TITAN_CUDA=ON (see float8/CMakeLists.txt).
#include "float8/cublaslt_gemm.h"

#include <ATen/cuda/CUDAContextLight.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAStream.h>
#include <cublasLt.h>

#include <sstream>
#include <stdexcept>
#include <string>

#include "float8/cublaslt_common.h"
#include "util/cuda_check.h"  // TITAN_CUDA_CHECK: every cuBLASLt call goes through it

namespace titan::float8 {

namespace {

cudaDataType_t cuda_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat8_e4m3fn: return CUDA_R_8F_E4M3;
    case at::kFloat8_e5m2: return CUDA_R_8F_E5M2;
    case at::kFloat: return CUDA_R_32F;
    case at::kBFloat16: return CUDA_R_16BF;
    case at::kHalf: return CUDA_R_16F;
    default:
      throw std::invalid_argument(std::string("cuBLASLt float8 GEMM: unsupported dtype ") +
                                  c10::toString(t) +
                                  " (operands: Float8_e4m3fn/e5m2; output: Float/BFloat16/Half)");
  }
}

}  // namespace

namespace detail {

void lt_matmul(LtDescriptors& d, const void* a, const void* b, void* out, c10::Device device,
               const std::string& hint, const std::string& no_algorithm) {
  const size_t workspace_size = at::cuda::getCUDABlasLtWorkspaceSize();
  void* workspace = at::cuda::getCUDABlasLtWorkspace();
  TITAN_CUDA_CHECK(cublasLtMatmulPreferenceCreate(&d.pref), hint);
  TITAN_CUDA_CHECK(
      cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                           &workspace_size, sizeof(workspace_size)), hint);
  cublasLtHandle_t handle = at::cuda::getCurrentCUDABlasLtHandle();
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  TITAN_CUDA_CHECK(cublasLtMatmulAlgoGetHeuristic(handle, d.op, d.a, d.b, d.c, d.c, d.pref, 1,
                                                  &heuristic, &found), hint);
  if (found == 0) throw std::runtime_error(no_algorithm);
  const float alpha = 1.0f, beta = 0.0f;
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
  TITAN_CUDA_CHECK(cublasLtMatmul(handle, d.op, &alpha, a, d.a, b, d.b, &beta, out, d.c, out, d.c,
                                  &heuristic.algo, workspace, workspace_size, stream), hint);
}

}  // namespace detail

at::Tensor cublaslt_scaled_mm_tensorwise(const at::Tensor& a, const at::Tensor& b,
                                         const at::Tensor& inv_scale_a,
                                         const at::Tensor& inv_scale_b, at::ScalarType out_dtype,
                                         bool use_fast_accum) {
  const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
  if (!a.is_cuda() || !b.is_cuda() || b.size(0) != K || K % 16 != 0 || N % 16 != 0 ||
      !a.is_contiguous() || !b.t().is_contiguous() || inv_scale_a.numel() != 1 ||
      inv_scale_b.numel() != 1) {
    std::ostringstream os;
    os << "cublaslt_scaled_mm_tensorwise: needs CUDA a [M, K] row-major and b [K, N] "
          "column-major with K, N multiples of 16 and 1-element scales; got a "
       << a.sizes() << " b " << b.sizes() << " (b column-major: " << b.t().is_contiguous()
       << ") scales " << inv_scale_a.numel() << ", " << inv_scale_b.numel()
       << ". Caller must pad (scaled_mm does).";
    throw std::invalid_argument(os.str());
  }
  at::Tensor out = at::empty({M, N}, a.options().dtype(out_dtype));
  at::Tensor sa = inv_scale_a.to(at::kFloat).contiguous();
  at::Tensor sb = inv_scale_b.to(at::kFloat).contiguous();

  // Row-major out[M, N] = a @ b is column-major out^T[N, M] = b^T @ a^T. cuBLASLt's FP8 kernels
  // want the "TN" form: its A is our b stored [K x N] column-major, transposed; its B is our a
  // stored [K x M] column-major, not transposed. So cuBLASLt's A scale is ours for b.
  detail::LtDescriptors d;
  const char* hint = "check dtypes (e5m2 x e5m2 is unsupported), 16-alignment and the GPU (sm_89+)";
  TITAN_CUDA_CHECK(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), hint);
  cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
  TITAN_CUDA_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &transa,
                                                  sizeof(transa)), hint);
  TITAN_CUDA_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &transb,
                                                  sizeof(transb)), hint);
  const void* a_scale_ptr = sb.data_ptr();
  const void* b_scale_ptr = sa.data_ptr();
  TITAN_CUDA_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                  &a_scale_ptr, sizeof(a_scale_ptr)), hint);
  TITAN_CUDA_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                  &b_scale_ptr, sizeof(b_scale_ptr)), hint);
  const int8_t fast_accum = use_fast_accum ? 1 : 0;
  TITAN_CUDA_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM,
                                                  &fast_accum, sizeof(fast_accum)), hint);
  TITAN_CUDA_CHECK(
      cublasLtMatrixLayoutCreate(&d.a, cuda_type(b.scalar_type()), K, N, K), hint);
  TITAN_CUDA_CHECK(
      cublasLtMatrixLayoutCreate(&d.b, cuda_type(a.scalar_type()), K, M, K), hint);
  TITAN_CUDA_CHECK(cublasLtMatrixLayoutCreate(&d.c, cuda_type(out_dtype), N, M, N), hint);

  std::ostringstream os;
  os << "cublaslt_scaled_mm_tensorwise: no cuBLASLt algorithm for M=" << M << " K=" << K
     << " N=" << N << " a " << a.scalar_type() << " b " << b.scalar_type() << " out "
     << out_dtype << ". HINT: use the scaled_mm back end";
  // cuBLASLt's A is titan's b, its B titan's a (column-major "TN" form).
  detail::lt_matmul(d, b.data_ptr(), a.data_ptr(), out.data_ptr(), a.device(), hint, os.str());
  return out;
}

}  // namespace titan::float8
