// float8/kernels/block_cast_kernels.cu — fused amax + scale + e4m3 cast per block for MXFP8
// (1 x 32, E8M0 scales) and blockwise float8 (1 x 128 and 128 x 128, float32 scales), along the
// last dimension or, without a transposed copy, along the first ("dim1").
// CPU reference: quantize_blocks() in float8/block_scaled.cpp; see tests/test_block_scaled_cuda.cpp.
//
// Bit-exactness: every float operation that the reference does in float32 is done here with the
// IEEE round-to-nearest intrinsics (__fdiv_rn, __fmul_rn, __ddiv_rn, __double2float_rn), so
// neither FMA contraction nor approximate division can change a bit; titan compiles CUDA without
// fast math, so float32 subnormals (scales of 2^-127, tiny inputs) are kept as on the CPU. One
// documented difference: a NaN element becomes e4m3 0x7F here (CUDA arithmetic makes NaNs
// positive, and the conversion instruction writes the canonical NaN) where the CPU may write its
// negative twin 0xFF; both are NaN and dequantize alike.
#include "float8/kernels/block_cast_kernels.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>
#include <type_traits>

#include "float8/kernels/cast_device.cuh"
#include "util/cuda_check.h"  // TITAN_CUDA_CHECK: every launch goes through it

namespace titan::float8::kernels {

namespace {

constexpr int kThreads = 256;      // 8 warps
constexpr int kWarps = kThreads / 32;
constexpr float kE4M3Max = 448.0f;
constexpr float kMinNormal = 1.17549435e-38f;  // 2^-126: torchao's floor for FLOOR's float scale
constexpr float kBlockwiseEps = 1e-12f;        // blockwise amax floor, applied in float32
constexpr int64_t kMaxGridY = 65535;

using device::dispatch_src;
using device::nan_max;
using device::to_float;

__device__ __forceinline__ float warp_max(float v) {
  for (int off = 16; off > 0; off /= 2) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// Block-wide nan_max over kThreads threads; every thread gets the result.
__device__ float block_max(float v) {
  __shared__ float partial[kWarps];
  v = warp_max(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < kWarps ? partial[lane] : 0.0f;
  return warp_max(v);
}

// clamp(v, -448, 448) keeping NaN (torch.clamp), then round-to-nearest-even e4m3 (the
// conversion saturates too, but the clamp comes first as in the reference).
__device__ __forceinline__ __nv_fp8_storage_t to_e4m3(float v) {
  v = v > kE4M3Max ? kE4M3Max : (v < -kE4M3Max ? -kE4M3Max : v);
  return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
}

// One block's scale from its amax; apply() scales an element before the cast, store() writes
// the scale. Every lane of a warp builds it from the same amax, so all agree without a broadcast.
template <BlockScaleMode M>
struct BlockQuant;

// torchao's to_mx FLOOR: the exponent bits of amax minus e4m3's largest exponent (8), clamped to
// [-127, 128], biased by 127 (255 for a NaN amax); the data is divided by the float32 whose bits
// are code << 23 (inf for 255), floored at 2^-126.
template <>
struct BlockQuant<BlockScaleMode::MxFloor> {
  uint8_t code;
  float divisor;
  __device__ explicit BlockQuant(float amax) {
    if (isnan(amax)) {
      code = 255;
    } else {
      int e = static_cast<int>((__float_as_uint(amax) >> 23) & 0xFFu) - 127 - 8;
      e = e < -127 ? -127 : (e > 128 ? 128 : e);
      code = static_cast<uint8_t>(e + 127);
    }
    divisor = fmaxf(__uint_as_float(static_cast<uint32_t>(code) << 23), kMinNormal);
  }
  __device__ float apply(float x) const { return __fdiv_rn(x, divisor); }
  __device__ void store(void* scales, int64_t i) const { static_cast<uint8_t*>(scales)[i] = code; }
};

// torchao's _to_mx_rceil: descale = amax / 448 in float32; code = clamp(ceil(log2(descale)),
// -127, 127) + 127 (255 NaN, 254 inf); multiplier 2^(127 - code), 1 for code 0, the NaN
// descale itself for 255 (so the whole block becomes NaN), 2^-127 for 254.
//
// log2 must round as the reference's float32 log2 does, because ceil() turns one ulp into a
// whole exponent: just above a power of two, log2(2^E * (1 + k 2^-23)) = E + ~1.44 k 2^-23 rounds
// to exactly E in float32 for small k once |E| >= 4, and ceil then gives E, not E + 1. torch's
// CPU log2 (Sleef on AVX2 and AVX512, std::log2 in the scalar tail) returns the correctly rounded
// float32 there, checked for every float32 within 200 ulps above each power of two, subnormals
// included. CUDA's log2f may be 1 ulp off, so this takes log2 in double (error ~2^-52 relative)
// and rounds that to float32: the correctly rounded result unless the exact value lies within
// ~2^-52 of a float32 rounding midpoint, which does not happen near powers of two (there the
// decision is whether 1.44 k 2^-23 exceeds half an ulp, a power of two, and k is a small
// integer). Away from powers of two both roundings give the same ceil.
template <>
struct BlockQuant<BlockScaleMode::MxRceil> {
  uint8_t code;
  float multiplier;
  __device__ explicit BlockQuant(float amax) {
    const float descale = __fdiv_rn(amax, kE4M3Max);
    if (isnan(descale)) {
      code = 255;
      multiplier = descale;
    } else if (isinf(descale)) {
      code = 254;
      multiplier = __uint_as_float(0x00400000u);  // 2^-127
    } else {
      const float l = __double2float_rn(log2(static_cast<double>(descale)));  // -inf for 0
      const float c = fminf(fmaxf(ceilf(l), -127.0f), 127.0f);
      code = static_cast<uint8_t>(static_cast<int>(c) + 127);
      if (code == 0) {
        multiplier = 1.0f;
      } else if (code == 254) {
        multiplier = __uint_as_float(0x00400000u);
      } else {
        multiplier = __uint_as_float(static_cast<uint32_t>(254 - code) << 23);  // 2^(127 - code)
      }
    }
  }
  __device__ float apply(float x) const { return __fmul_rn(x, multiplier); }
  __device__ void store(void* scales, int64_t i) const { static_cast<uint8_t*>(scales)[i] = code; }
};

// Blockwise (torchao's blockwise training kernels): s = float32(448 / double(max(amax, 1e-12f)))
// (the floor applied in float32, NaN kept), data = e4m3(clamp(x * s)), stored scale = 1 / s in
// float32.
template <>
struct BlockQuant<BlockScaleMode::Blockwise> {
  float s;
  float stored;
  __device__ explicit BlockQuant(float amax) {
    const float a = isnan(amax) ? amax : fmaxf(amax, kBlockwiseEps);
    s = __double2float_rn(__ddiv_rn(448.0, static_cast<double>(a)));
    stored = __fdiv_rn(1.0f, s);
  }
  __device__ float apply(float x) const { return __fmul_rn(x, s); }
  __device__ void store(void* scales, int64_t i) const { static_cast<float*>(scales)[i] = stored; }
};

// dim0: one warp per block of kCols elements of a row (lane l holds columns l, l + 32, ...: each
// load instruction of the warp reads 32 consecutive elements). The scale index of block b is b
// itself (row-major [rows, blocks per row]).
template <typename T, BlockScaleMode M, int kCols>
__global__ void block_cast_dim0_kernel(const T* __restrict__ x, int64_t rows, int64_t cols,
                                       __nv_fp8_storage_t* __restrict__ out, void* scales) {
  constexpr int kPerLane = kCols / 32;
  const int64_t per_row = (cols + kCols - 1) / kCols;
  const int64_t n_blocks = rows * per_row;
  const int lane = threadIdx.x % 32;
  const int64_t stride = int64_t(gridDim.x) * kWarps;
  // b is the same for every lane of a warp, so the shuffles below see full warps.
  for (int64_t b = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32; b < n_blocks; b += stride) {
    const int64_t r = b / per_row, c0 = (b % per_row) * kCols;
    const T* row = x + r * cols;
    float v[kPerLane];
    float m = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int64_t c = c0 + lane + 32 * i;
      v[i] = c < cols ? to_float(row[c]) : 0.0f;  // zeros never raise the amax
      m = nan_max(fabsf(v[i]), m);
    }
    const BlockQuant<M> q(warp_max(m));
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int64_t c = c0 + lane + 32 * i;
      if (c < cols) out[r * cols + c] = to_e4m3(q.apply(v[i]));
    }
    if (lane == 0) q.store(scales, b);
  }
}

// dim1: a thread block (32, 8) stages a kRows x 32 tile of x in shared memory (coalesced reads
// along the row; padded against bank conflicts), then each warp takes columns y, y + 8, ...: lane
// l holds rows l, l + 32, ... of its column, reduces the amax of the column's kRows values (one
// block of x^T) and writes them as 32-byte runs of out_t's row c. Row tiles on grid.x, column
// tiles on grid.y.
template <typename T, BlockScaleMode M, int kRows>
__global__ void block_cast_dim1_kernel(const T* __restrict__ x, int64_t rows, int64_t cols,
                                       __nv_fp8_storage_t* __restrict__ out_t, void* scales) {
  constexpr int kPerLane = kRows / 32;
  __shared__ float tile[kRows][33];
  const int64_t r0 = int64_t(blockIdx.x) * kRows, c0 = int64_t(blockIdx.y) * 32;
  const int lane = threadIdx.x;
  for (int j = threadIdx.y; j < kRows; j += blockDim.y) {
    const int64_t r = r0 + j, c = c0 + lane;
    tile[j][lane] = (r < rows && c < cols) ? to_float(x[r * cols + c]) : 0.0f;
  }
  __syncthreads();
  const int64_t row_tiles = (rows + kRows - 1) / kRows;
  for (int cc = threadIdx.y; cc < 32; cc += blockDim.y) {
    const int64_t c = c0 + cc;
    if (c >= cols) break;  // depends on threadIdx.y only: whole warps leave
    float m = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) m = nan_max(fabsf(tile[lane + 32 * i][cc]), m);
    const BlockQuant<M> q(warp_max(m));
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int64_t r = r0 + lane + 32 * i;
      if (r < rows) out_t[c * rows + r] = to_e4m3(q.apply(tile[lane + 32 * i][cc]));
    }
    if (lane == 0) q.store(scales, c * row_tiles + blockIdx.x);
  }
}

// 128 x 128 tiles: one thread block per tile, two passes over it (the amax must be complete
// before any element is scaled; the second pass mostly hits L2). Column tiles on grid.x, row
// tiles on grid.y. The transposed variant walks the tile column by column so that its writes
// (rows of x^T) are the coalesced ones; it is a once-per-step weight cast.
template <typename T, bool kTransposed>
__global__ void blockwise_tile_cast_kernel(const T* __restrict__ x, int64_t rows, int64_t cols,
                                           __nv_fp8_storage_t* __restrict__ out,
                                           float* __restrict__ scales) {
  constexpr int kTile = 128;
  const int64_t r0 = int64_t(blockIdx.y) * kTile, c0 = int64_t(blockIdx.x) * kTile;
  const int th = static_cast<int>(rows - r0 < kTile ? rows - r0 : kTile);
  const int tw = static_cast<int>(cols - c0 < kTile ? cols - c0 : kTile);
  // Element i of the walk: (i / tw, i % tw) row-first, (i % th, i / th) column-first.
  auto at = [&](int i, int64_t& r, int64_t& c) {
    if (kTransposed) {
      r = r0 + i % th;
      c = c0 + i / th;
    } else {
      r = r0 + i / tw;
      c = c0 + i % tw;
    }
  };
  float m = 0.0f;
  for (int i = threadIdx.x; i < th * tw; i += kThreads) {
    int64_t r, c;
    at(i, r, c);
    m = nan_max(fabsf(to_float(x[r * cols + c])), m);
  }
  const BlockQuant<BlockScaleMode::Blockwise> q(block_max(m));
  for (int i = threadIdx.x; i < th * tw; i += kThreads) {
    int64_t r, c;
    at(i, r, c);
    const __nv_fp8_storage_t v = to_e4m3(q.apply(to_float(x[r * cols + c])));
    if (kTransposed) {
      out[c * rows + r] = v;
    } else {
      out[r * cols + c] = v;
    }
  }
  if (threadIdx.x == 0) {
    const int64_t i = kTransposed ? int64_t(blockIdx.x) * gridDim.y + blockIdx.y
                                  : int64_t(blockIdx.y) * gridDim.x + blockIdx.x;
    q.store(scales, i);
  }
}


template <typename F>
void dispatch_mode(BlockScaleMode mode, F&& f) {
  switch (mode) {
    case BlockScaleMode::MxFloor: f(std::integral_constant<BlockScaleMode, BlockScaleMode::MxFloor>{}); return;
    case BlockScaleMode::MxRceil: f(std::integral_constant<BlockScaleMode, BlockScaleMode::MxRceil>{}); return;
    case BlockScaleMode::Blockwise:
      f(std::integral_constant<BlockScaleMode, BlockScaleMode::Blockwise>{});
      return;
  }
  throw std::invalid_argument("block cast kernels: unknown scale mode");
}

std::string shape(int64_t rows, int64_t cols) {
  return "[" + std::to_string(rows) + ", " + std::to_string(cols) + "]";
}

}  // namespace

void launch_block_cast_dim0(const void* x, SrcType src, int64_t rows, int64_t cols,
                            BlockScaleMode mode, void* data_out, void* scale_out, void* stream) {
  const bool mx = mode != BlockScaleMode::Blockwise;
  if (mx && cols % 32 != 0) {
    throw std::invalid_argument("MXFP8 dim0 cast: x " + shape(rows, cols) +
                                " needs a column count that is a multiple of 32");
  }
  if (rows == 0 || cols == 0) return;
  const int64_t block = mx ? 32 : 128;
  const int64_t n_blocks = rows * ((cols + block - 1) / block);
  const int64_t grid = (n_blocks + kWarps - 1) / kWarps;
  const unsigned g = static_cast<unsigned>(grid < 65536 ? grid : 65536);  // grid-stride beyond
  auto s = static_cast<cudaStream_t>(stream);
  dispatch_src(src, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    dispatch_mode(mode, [&](auto m) {
      constexpr BlockScaleMode M = decltype(m)::value;
      constexpr int kCols = M == BlockScaleMode::Blockwise ? 128 : 32;
      block_cast_dim0_kernel<T, M, kCols><<<g, kThreads, 0, s>>>(
          static_cast<const T*>(x), rows, cols, static_cast<__nv_fp8_storage_t*>(data_out),
          scale_out);
    });
  });
  TITAN_CUDA_CHECK(cudaGetLastError(), "block_cast_dim0_kernel launch, x " << shape(rows, cols));
}

void launch_block_cast_dim1(const void* x, SrcType src, int64_t rows, int64_t cols,
                            BlockScaleMode mode, void* data_out, void* scale_out, void* stream) {
  const bool mx = mode != BlockScaleMode::Blockwise;
  if (mx && rows % 32 != 0) {
    throw std::invalid_argument("MXFP8 dim1 cast: x " + shape(rows, cols) +
                                " needs a row count that is a multiple of 32");
  }
  if (rows == 0 || cols == 0) return;
  const int64_t block = mx ? 32 : 128;
  const int64_t col_tiles = (cols + 31) / 32, row_tiles = (rows + block - 1) / block;
  if (col_tiles > kMaxGridY || row_tiles > 2147483647LL) {
    throw std::invalid_argument("block dim1 cast: x " + shape(rows, cols) +
                                " exceeds the grid (at most 65535 * 32 columns); split it");
  }
  const dim3 grid(static_cast<unsigned>(row_tiles), static_cast<unsigned>(col_tiles));
  const dim3 threads(32, kWarps);
  auto s = static_cast<cudaStream_t>(stream);
  dispatch_src(src, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    dispatch_mode(mode, [&](auto m) {
      constexpr BlockScaleMode M = decltype(m)::value;
      constexpr int kRows = M == BlockScaleMode::Blockwise ? 128 : 32;
      block_cast_dim1_kernel<T, M, kRows><<<grid, threads, 0, s>>>(
          static_cast<const T*>(x), rows, cols, static_cast<__nv_fp8_storage_t*>(data_out),
          scale_out);
    });
  });
  TITAN_CUDA_CHECK(cudaGetLastError(), "block_cast_dim1_kernel launch, x " << shape(rows, cols));
}

void launch_blockwise_tile_cast(const void* x, SrcType src, int64_t rows, int64_t cols,
                                bool transposed, void* data_out, float* scale_out, void* stream) {
  if (rows == 0 || cols == 0) return;
  const int64_t row_tiles = (rows + 127) / 128, col_tiles = (cols + 127) / 128;
  if (row_tiles > kMaxGridY || col_tiles > 2147483647LL) {
    throw std::invalid_argument("blockwise 128x128 cast: x " + shape(rows, cols) +
                                " exceeds the grid (at most 65535 * 128 rows); split it");
  }
  const dim3 grid(static_cast<unsigned>(col_tiles), static_cast<unsigned>(row_tiles));
  auto s = static_cast<cudaStream_t>(stream);
  dispatch_src(src, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    auto* out = static_cast<__nv_fp8_storage_t*>(data_out);
    if (transposed) {
      blockwise_tile_cast_kernel<T, true><<<grid, kThreads, 0, s>>>(static_cast<const T*>(x), rows,
                                                                    cols, out, scale_out);
    } else {
      blockwise_tile_cast_kernel<T, false><<<grid, kThreads, 0, s>>>(static_cast<const T*>(x), rows,
                                                                     cols, out, scale_out);
    }
  });
  TITAN_CUDA_CHECK(cudaGetLastError(),
                   "blockwise_tile_cast_kernel launch, x " << shape(rows, cols));
}

}  // namespace titan::float8::kernels
