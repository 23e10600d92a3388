#include "float8/gemm.h"

#include <ATen/ops/_scaled_mm.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/ones.h>

#include <sstream>
#include <stdexcept>

#include "float8/kernels/fused_cast.h"
#include "util/cpu_features.h"

#ifdef TITAN_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#include <c10/cuda/CUDAStream.h>

#include "float8/cublaslt_gemm.h"
#include "float8/kernels/gemm_epilogue.cuh"
#endif

#include <c10/util/StringUtil.h>

namespace titan::float8 {

namespace {

void check_operands(const Float8Tensor& a, const Float8Tensor& b) {
  check_float8_tensor(a, "scaled_mm operand a");
  check_float8_tensor(b, "scaled_mm operand b");
  if (a.data.dim() != 2 || b.data.dim() != 2 || a.data.size(1) != b.data.size(0)) {
    throw std::invalid_argument("scaled_mm: needs a [M, K] and b [K, N], got a " +
                                c10::str(a.data.sizes()) + " and b " + c10::str(b.data.sizes()) +
                                " (flatten inputs with reshape_to_2d first)");
  }
  // Axiswise scales must be constant along K or the scale cannot be pulled out of the sum.
  if (!a.is_tensorwise() && a.scale.size(1) != 1) {
    throw std::invalid_argument("scaled_mm: a's scale " + c10::str(a.scale.sizes()) +
                                " varies along the contraction dim; expected () or (" +
                                std::to_string(a.data.size(0)) + ", 1)");
  }
  if (!b.is_tensorwise() && b.scale.size(0) != 1) {
    throw std::invalid_argument("scaled_mm: b's scale " + c10::str(b.scale.sizes()) +
                                " varies along the contraction dim; expected () or (1, " +
                                std::to_string(b.data.size(1)) + ")");
  }
}

#ifdef TITAN_WITH_CUDA
int64_t round_up_16(int64_t v) { return (v + 15) / 16 * 16; }

// at::_scaled_mm with its layout rules met: A row-major, B column-major, K and N padded to
// multiples of 16 with zeros (exact: zeros add nothing to the sums), mixed tensorwise/axiswise
// scales expanded to axiswise (as torchao does), float32 contiguous inverse scales.
at::Tensor scaled_mm_cuda(const Float8Tensor& a, const Float8Tensor& b, at::ScalarType out_dtype,
                          bool use_fast_accum, bool use_cublaslt) {
  if (a.data.scalar_type() == at::kFloat8_e5m2 && b.data.scalar_type() == at::kFloat8_e5m2) {
    throw std::invalid_argument(
        "scaled_mm: e5m2 x e5m2 is not supported by the float8 GEMM hardware; use e4m3 for at "
        "least one operand");
  }
  const int64_t M = a.data.size(0), K = a.data.size(1), N = b.data.size(1);
  const int64_t Kp = round_up_16(K), Np = round_up_16(N);
  at::Tensor A = a.data.contiguous();                // [M, K] row-major
  at::Tensor Bt = b.data.t().contiguous();           // [N, K] row-major == B column-major
  if (Kp != K) {
    A = at::constant_pad_nd(A, {0, Kp - K});
    Bt = at::constant_pad_nd(Bt, {0, Kp - K});
  }
  if (Np != N) Bt = at::constant_pad_nd(Bt, {0, 0, 0, Np - N});
  at::Tensor inv_a = a.scale.reciprocal().to(at::kFloat);  // () or (M, 1)
  at::Tensor inv_b = b.scale.reciprocal().to(at::kFloat);  // () or (1, N)
  const bool rowwise = !a.is_tensorwise() || !b.is_tensorwise();
  if (rowwise) {
    // _scaled_mm has no mixed granularity kernel: repeat the tensorwise scale along its axis.
    if (a.is_tensorwise()) inv_a = inv_a.reshape({1, 1}).expand({M, 1});
    if (b.is_tensorwise()) inv_b = inv_b.reshape({1, 1}).expand({1, N});
    inv_a = inv_a.contiguous();
    inv_b = inv_b.contiguous();
    if (Np != N) inv_b = at::constant_pad_nd(inv_b, {0, Np - N}, 1.0);
  }
  at::Tensor B = Bt.t();  // [Kp, Np] column-major
  at::Tensor out;
  if (rowwise && !use_fast_accum) {
    // torchao's choice: the rowwise kernel is slow without fast accumulation, so run the
    // tensorwise kernel with unit scales in float32 and apply outer(1/sA, 1/sB) afterwards.
    at::Tensor one = at::ones({}, inv_a.options());
    out = outer_scale(at::_scaled_mm(A, B, one, one, {}, {}, at::kFloat, false), inv_a, inv_b, out_dtype);
  } else if (rowwise) {
    // Rowwise kernels only produce bf16 on most stacks, yet a float32 output must work (a
    // single-GPU run with float32 parameters): produce bf16, then cast.
    out = at::_scaled_mm(A, B, inv_a, inv_b, {}, {}, at::kBFloat16, true).to(out_dtype);
  } else if (use_cublaslt) {
    out = cublaslt_scaled_mm_tensorwise(A, B, inv_a, inv_b, out_dtype, use_fast_accum);
  } else {
    out = at::_scaled_mm(A, B, inv_a, inv_b, {}, {}, out_dtype, use_fast_accum);
  }
  return Np != N ? out.narrow(1, 0, N) : out;
}
#endif

}  // namespace

const char* gemm_backend_name(GemmBackend backend) {
  switch (backend) {
    case GemmBackend::Auto: return "auto";
    case GemmBackend::Emulated: return "emulated";
    case GemmBackend::ScaledMm: return "scaled_mm";
    case GemmBackend::CublasLt: return "cublaslt";
  }
  return "?";
}

int cuda_compute_capability(const c10::Device& device) {
#ifdef TITAN_WITH_CUDA
  if (!device.is_cuda()) return 0;
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, device.has_index() ? device.index() : 0) != cudaSuccess) {
    cudaGetLastError();  // consume it: the next CUDA call must not report it
    return 0;
  }
  return p.major * 10 + p.minor;
#else
  (void)device;
  return 0;
#endif
}

bool float8_cuda_compiled() {
#ifdef TITAN_WITH_CUDA
  return true;
#else
  return false;
#endif
}

GemmBackend resolve_gemm_backend(GemmBackend requested, bool emulate, const c10::Device& device) {
  if (emulate || requested == GemmBackend::Emulated) return GemmBackend::Emulated;
  if (requested == GemmBackend::Auto) {
    if (!device.is_cuda()) return GemmBackend::Emulated;
    requested = GemmBackend::ScaledMm;
  }
  if (!device.is_cuda()) {
    throw std::invalid_argument(std::string("float8 GEMM back end '") +
                                gemm_backend_name(requested) + "' needs CUDA tensors, got device " +
                                device.str() + "; use emulate=true (or back end auto) on CPU");
  }
  if (!float8_cuda_compiled()) {
    throw std::invalid_argument(std::string("float8 GEMM back end '") +
                                gemm_backend_name(requested) +
                                "' is not compiled in: rebuild with -DTITAN_CUDA=ON, or emulate");
  }
  return requested;
}

// Note [Emulated GEMM in tiles]: the emulation of docs/float8.md,
// mm(A.float() / sA, B.float() / sB), computed tile by tile of the output so that the float32
// copies of the operands exist one tile at a time (kEmulatedTileBytes each, but never fewer than
// kEmulatedMinTileRows rows or columns: a 64-column product runs at a fraction of BLAS's speed, and
// the 100M model's 512 KiB tiles made 2,117 products a step, 256-row tiles 1,305).
// Whole-operand copies were a cost the CPU had and the GPU has not: a [tokens, hidden] float32
// transient in backward, +2.5% of the debug model's per-op-AC peak (docs/performance.md). Every
// output element is still one float32 dot product over all of K from the same dequantized
// values; only BLAS's blocking of that sum may differ from the untiled product (the same float32
// reduction error bound; tested).
//
// Note [Dequantize each operand once]: tiling both operands dequantized one of them once per
// tile of the other (the 100M model's w1 forward dequantized x twelve times). Now the smaller
// operand is dequantized whole, once, and the larger one tile by tile, each tile once; the
// transient is the smaller operand in float32 plus one tile (never the [tokens, hidden] one when
// a weight is smaller). On the CPU the dequantization is one pass (float8 byte -> float32 by
// table, divided by the scale: the same values as to(float32) then div_).
namespace {
constexpr int64_t kEmulatedTileBytes = int64_t{512} << 10;
constexpr int64_t kEmulatedMinTileRows = 256;

// The slice [start, start + length) of `scale` along `dim` when the scale varies along it.
at::Tensor scale_slice(const at::Tensor& scale, int64_t dim, int64_t full, int64_t start, int64_t length) {
  if (scale.dim() == 0 || scale.size(dim) != full || full == 1) return scale;
  return scale.narrow(dim, start, length);
}
}  // namespace

at::Tensor scaled_mm_emulated(const Float8Tensor& a, const Float8Tensor& b,
                              at::ScalarType out_dtype) {
  const int64_t M = a.data.size(0), K = a.data.size(1), N = b.data.size(1);
  // See Note [Dequantize each operand once]: one pass per element on the CPU.
  const bool cpu = a.data.device().is_cpu() && b.data.device().is_cpu() && titan::util::cpu_has_avx2_kernels();
  auto dequant = [cpu](const at::Tensor& data, const at::Tensor& scale) {
    return cpu ? dequantize_to_float_cpu(data, scale) : data.to(at::kFloat).div_(scale);
  };
  const int64_t rows = std::max<int64_t>(kEmulatedMinTileRows, kEmulatedTileBytes / (4 * std::max<int64_t>(K, 1)));
  if (rows >= M && rows >= N) return at::mm(dequant(a.data, a.scale), dequant(b.data, b.scale)).to(out_dtype);
  at::Tensor out = at::empty({M, N}, a.data.options().dtype(out_dtype));
  // A float32 tile product is written in place: BLAS takes the strided tile of `out` as its C
  // (leading dimension N), so a column tile needs no copy.
  auto product_into = [out_dtype](at::Tensor tile, const at::Tensor& x, const at::Tensor& y) {
    if (out_dtype == at::kFloat) at::mm_out(tile, x, y);
    else tile.copy_(at::mm(x, y));
  };
  if (M * K <= K * N) {  // a is the smaller operand: whole; b in column tiles
    const at::Tensor a32 = dequant(a.data, a.scale);  // [M, K]
    for (int64_t j = 0; j < N; j += rows) {
      const int64_t nj = std::min(rows, N - j);
      at::Tensor b32 = dequant(b.data.narrow(1, j, nj), scale_slice(b.scale, 1, N, j, nj));
      product_into(out.narrow(1, j, nj), a32, b32);
    }
    return out;
  }
  const at::Tensor b32 = dequant(b.data, b.scale);  // [K, N]: whole; a in row tiles
  for (int64_t i = 0; i < M; i += rows) {
    const int64_t ni = std::min(rows, M - i);
    at::Tensor a32 = dequant(a.data.narrow(0, i, ni), scale_slice(a.scale, 0, M, i, ni));
    product_into(out.narrow(0, i, ni), a32, b32);
  }
  return out;
}

at::Tensor outer_scale(const at::Tensor& x, const at::Tensor& row_scale, const at::Tensor& col_scale,
                       at::ScalarType dtype) {
#ifdef TITAN_WITH_CUDA
  const bool fused = x.is_cuda() && x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous() &&
                     (dtype == at::kBFloat16 || dtype == at::kFloat) && row_scale.scalar_type() == at::kFloat &&
                     col_scale.scalar_type() == at::kFloat && row_scale.is_contiguous() && col_scale.is_contiguous() &&
                     row_scale.numel() == x.size(0) && col_scale.numel() == x.size(1) &&
                     row_scale.device() == x.device() && col_scale.device() == x.device();
  if (fused) {
    const c10::cuda::CUDAGuard guard(x.device());
    at::Tensor out = dtype == at::kFloat ? x : at::empty(x.sizes(), x.options().dtype(dtype));
    kernels::launch_outer_scale(x.data_ptr<float>(), x.size(0), x.size(1), row_scale.data_ptr<float>(),
                                col_scale.data_ptr<float>(),
                                dtype == at::kFloat ? kernels::EpilogueOut::Float32 : kernels::EpilogueOut::BFloat16,
                                out.data_ptr(), c10::cuda::getCurrentCUDAStream(x.device().index()).stream());
    return out;
  }
#endif
  return (x * row_scale * col_scale).to(dtype);
}

at::Tensor scaled_mm(const Float8Tensor& a, const Float8Tensor& b, at::ScalarType out_dtype,
                     bool use_fast_accum, GemmBackend backend) {
  check_operands(a, b);
  backend = resolve_gemm_backend(backend, /*emulate=*/false, a.data.device());
  if (backend == GemmBackend::Emulated) return scaled_mm_emulated(a, b, out_dtype);
#ifdef TITAN_WITH_CUDA
  return scaled_mm_cuda(a, b, out_dtype, use_fast_accum, backend == GemmBackend::CublasLt);
#else
  throw std::logic_error("scaled_mm: CUDA back end selected in a CPU-only build");
#endif
}

}  // namespace titan::float8
