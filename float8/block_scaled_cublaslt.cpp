// Compiled only when TITAN_CUDA=ON (see float8/CMakeLists.txt).
#include "float8/block_scaled_cublaslt.h"

#include <ATen/cuda/CUDAContextLight.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cublasLt.h>

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "float8/cublaslt_common.h"
#include "util/cuda_check.h"  // TITAN_CUDA_CHECK: every cuBLASLt call goes through it

namespace titan::float8 {

// Note [cuBLASLt block scale layouts]
// cuBLASLt is column-major. Row-major out[M, N] = a[M, K] @ b[N, K]^T is column-major
// out^T[N, M] = op(A) @ op(B) with A = b's data read as a K x N column-major matrix (ld K) and
// transposed, B = a's data read as K x M (ld K), not transposed: the "TN" form every float8
// kernel has (as in cublaslt_gemm.cpp). So cuBLASLt's A is titan's b and its B is titan's a,
// each with its own scale mode and scale pointer. For an operand X [R, K] (R = N for A, M for B;
// K the stored matrix's inner dimension, R its outer one) cuBLASLt reads its scales as:
//   VEC32_UE8M0     the [R, K / 32] E8M0 matrix zero-padded to [ceil(R / 128) * 128,
//                   ceil(K / 128) * 4] and stored as 128 x 4 tiles of 512 bytes, K tiles
//                   fastest, each tile interleaved (row r at (r % 32) * 16 + (r / 32) * 4):
//                   exactly swizzle_mx_scales(X.scale).
//   VEC128_32F      one float per (r, k block), outer-dimension-major with no padding: offset
//                   r + kb * R. titan stores [R, ceil(K / 128)] row-major, so: X.scale.t()
//                   .contiguous().
//   BLK128x128_32F  one float per (r block, k block), K-major with the k-block count padded to
//                   a multiple of 4 (16-byte columns): offset kb + rb * round_up(KB, 4). titan
//                   stores [ceil(R / 128), KB] row-major: pad each row to round_up(KB, 4) (the
//                   pad, 1.0, is never read).
// These are the buffers torch._scaled_mm passes to the same cuBLASLt calls (its 1 x 128 scale
// [M, KB] with strides (1, M); its 128 x 128 scale [round_up(KB, 4), NB] with strides
// (1, round_up(KB, 4))), which torchao's blockwise training prepares the same way.

namespace {

constexpr const char* kMxfp4Refusal = "MXFP4 has no cuBLASLt path in titan; it runs emulated";

cudaDataType_t out_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return CUDA_R_32F;
    case at::kBFloat16: return CUDA_R_16BF;
    case at::kHalf: return CUDA_R_16F;
    default:
      throw std::invalid_argument(std::string("cublaslt_block_scaled_mm: output dtype ") +
                                  c10::toString(t) + " unsupported (Float, BFloat16 or Half)");
  }
}

int64_t ceil_div(int64_t v, int64_t d) { return (v + d - 1) / d; }

std::string describe(const BlockScaledTensor& t) {
  std::ostringstream os;
  os << "[" << t.rows << ", " << t.cols << "] " << describe_layout(t.layout);
  return os.str();
}

std::string sm_name(const cudaDeviceProp& p) { return "sm" + std::to_string(p.major) + std::to_string(p.minor); }

// Data e4m3 [rows, cols] and scales of the layout's shape, both on one CUDA device.
void check_operand(const BlockScaledTensor& t, const char* name) {
  const BlockLayout& l = t.layout;
  const bool mx = l.e8m0_scales;
  const std::vector<int64_t> scale_shape =
      mx ? std::vector<int64_t>{t.rows, t.cols / 32}
         : std::vector<int64_t>{ceil_div(t.rows, l.block_rows), ceil_div(t.cols, 128)};
  const bool ok = t.data.defined() && t.scale.defined() && t.data.is_cuda() &&
                  t.scale.device() == t.data.device() && t.data.dim() == 2 &&
                  t.data.size(0) == t.rows && t.data.size(1) == t.cols &&
                  t.data.scalar_type() == at::kFloat8_e4m3fn &&
                  t.scale.scalar_type() == (mx ? at::kByte : at::kFloat) &&
                  t.scale.sizes() == at::IntArrayRef(scale_shape) &&
                  (mx ? l.block_rows == 1 && l.block_cols == 32 && t.cols % 32 == 0
                      : l.block_cols == 128 && (l.block_rows == 1 || l.block_rows == 128));
  if (!ok) {
    std::ostringstream os;
    os << "cublaslt_block_scaled_mm: operand " << name << " " << describe(t)
       << " is not a CUDA e4m3 operand with its scales (data "
       << (t.data.defined() ? t.data.sizes() : at::IntArrayRef{}) << " "
       << (t.data.defined() ? c10::toString(t.data.scalar_type()) : "undefined") << " on "
       << (t.data.defined() ? t.data.device() : at::Device(at::kCPU)) << ", scale "
       << (t.scale.defined() ? t.scale.sizes() : at::IntArrayRef{}) << ", expected scale shape "
       << at::IntArrayRef(scale_shape) << ")";
    throw std::invalid_argument(os.str());
  }
}

// The scale buffer in cuBLASLt's layout, Note [cuBLASLt block scale layouts].
at::Tensor cublas_scales(const BlockScaledTensor& t) {
  if (t.layout.e8m0_scales) return swizzle_mx_scales(t.scale).contiguous();
  if (t.layout.block_rows == 1) return t.scale.t().contiguous();
  const int64_t kb = t.scale.size(1), padded = ceil_div(kb, 4) * 4;
  return at::constant_pad_nd(t.scale, {0, padded - kb}, 1.0).contiguous();
}

#if CUBLAS_VERSION >= 120800
int32_t scale_mode(const BlockLayout& l) {
  if (l.e8m0_scales) return CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0;
#if CUBLAS_VERSION >= 120900
  return l.block_rows == 128 ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
                             : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
#else
  throw std::runtime_error("blockwise float8 GEMM needs cuBLAS >= 12.9 at build time; titan was "
                           "built with cuBLAS " + std::to_string(CUBLAS_VERSION));
#endif
}
#endif

}  // namespace

at::Tensor cublaslt_block_scaled_mm(const BlockScaledTensor& a, const BlockScaledTensor& b,
                                    at::ScalarType out_dtype) {
  if (a.layout.element == BlockElement::E2M1 || b.layout.element == BlockElement::E2M1)
    throw std::invalid_argument(kMxfp4Refusal);
  if (a.layout.e8m0_scales != b.layout.e8m0_scales || a.cols != b.cols) {
    throw std::invalid_argument("cublaslt_block_scaled_mm: operands " + describe(a) + " and " +
                                describe(b) +
                                " do not agree (one format, and the same K: out = A[M, K] @ "
                                "B[N, K]^T)");
  }
  check_operand(a, "a");
  check_operand(b, "b");
  if (a.data.device() != b.data.device()) {
    throw std::invalid_argument("cublaslt_block_scaled_mm: operands on different devices");
  }
  const bool mx = a.layout.e8m0_scales;
  if (!mx && a.layout.block_rows == 128 && b.layout.block_rows == 128) {
    throw std::invalid_argument("cublaslt_block_scaled_mm: cuBLASLt has no 128x128 x 128x128 "
                                "block scaling; quantize one operand with 1 x 128 tiles");
  }
  const int64_t M = a.rows, N = b.rows, K = a.cols;
  if (K % 16 != 0 || N % 16 != 0) {
    std::ostringstream os;
    os << "cublaslt_block_scaled_mm: K = " << K << " and N = " << N
       << " must be multiples of 16 (cuBLASLt float8 alignment); operands " << describe(a)
       << ", " << describe(b);
    throw std::invalid_argument(os.str());
  }
  const cudaDataType_t d_type = out_type(out_dtype);

  c10::cuda::CUDAGuard guard(a.data.device());
  const cudaDeviceProp& prop = *at::cuda::getDeviceProperties(a.data.device().index());
  const size_t lt_version = cublasLtGetVersion();
  if (mx && prop.major < 10)
    throw std::runtime_error("MXFP8 GEMM needs a Blackwell (sm100+) GPU; this is " + sm_name(prop));
  if (mx && lt_version < 120800) {
    throw std::runtime_error("MXFP8 GEMM needs cuBLASLt >= 12.8 at run time; the loaded one is " +
                             std::to_string(lt_version));
  }
  if (!mx && prop.major < 9) {
    throw std::runtime_error("blockwise float8 GEMM needs a Hopper (sm90+) GPU; this is " +
                             sm_name(prop));
  }
  if (!mx && lt_version < 120900) {
    throw std::runtime_error("blockwise float8 GEMM needs cuBLASLt >= 12.9 at run time; the "
                             "loaded one is " + std::to_string(lt_version));
  }

#if CUBLAS_VERSION < 120800
  (void)d_type;
  throw std::runtime_error(std::string(mx ? "MXFP8" : "blockwise float8") +
                           " GEMM needs cuBLAS >= 12.8 (12.9 for blockwise) at build time; titan "
                           "was built with cuBLAS " + std::to_string(CUBLAS_VERSION));
#else
  const int32_t a_mode = scale_mode(b.layout), b_mode = scale_mode(a.layout);  // swapped: Note
  at::Tensor out = at::empty({M, N}, a.data.options().dtype(out_dtype));
  if (M == 0 || N == 0) return out;
  if (K == 0) return out.zero_();
  const at::Tensor a_data = a.data.contiguous(), b_data = b.data.contiguous();
  // Temporaries on the current stream: the caching allocator keeps them until the GEMM ran.
  const at::Tensor a_scale = cublas_scales(a), b_scale = cublas_scales(b);

  detail::LtDescriptors d;
  std::ostringstream hint_os;
  hint_os << describe(a) << " x " << describe(b) << " -> " << c10::toString(out_dtype) << " on "
          << sm_name(prop) << " (cuBLASLt " << lt_version << ")";
  const std::string hint = hint_os.str();
  TITAN_CUDA_CHECK(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), hint);
  const cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
  TITAN_CUDA_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &transa,
                                                  sizeof(transa)), hint);
  TITAN_CUDA_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &transb,
                                                  sizeof(transb)), hint);
  TITAN_CUDA_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode,
                                                  sizeof(a_mode)), hint);
  TITAN_CUDA_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode,
                                                  sizeof(b_mode)), hint);
  const void* a_scale_ptr = b_scale.data_ptr();  // cuBLASLt's A is titan's b
  const void* b_scale_ptr = a_scale.data_ptr();
  TITAN_CUDA_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                  &a_scale_ptr, sizeof(a_scale_ptr)), hint);
  TITAN_CUDA_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                  &b_scale_ptr, sizeof(b_scale_ptr)), hint);
  TITAN_CUDA_CHECK(cublasLtMatrixLayoutCreate(&d.a, CUDA_R_8F_E4M3, K, N, K), hint);
  TITAN_CUDA_CHECK(cublasLtMatrixLayoutCreate(&d.b, CUDA_R_8F_E4M3, K, M, K), hint);
  TITAN_CUDA_CHECK(cublasLtMatrixLayoutCreate(&d.c, d_type, N, M, N), hint);

  const std::string no_algorithm =
      "cublaslt_block_scaled_mm: no cuBLASLt algorithm for M=" + std::to_string(M) +
        " N=" + std::to_string(N) + " K=" + std::to_string(K) + ", " + hint +
        (mx ? ". HINT: use the emulated back end"
            : ". HINT: cuBLAS documents the VEC128 / BLK128x128 scale modes for Hopper (sm90); "
              "elsewhere use the emulated back end");
  // cuBLASLt's A is titan's b, its B titan's a (Note [cuBLASLt block scale layouts]).
  detail::lt_matmul(d, b_data.data_ptr(), a_data.data_ptr(), out.data_ptr(), a.data.device(), hint, no_algorithm);
  return out;
#endif
}

}  // namespace titan::float8
