// float8/kernels/cast_kernels.cu — fused amax + scale + cast and cast + transpose kernels.
// CPU references: scaling.cpp (to_float8, cast_to_float8); see fused_cast.h and the tests.
#include "float8/kernels/cast_kernels.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "float8/kernels/cast_device.cuh"
#include "util/cuda_check.h"  // TITAN_CUDA_CHECK: every CUDA call and launch goes through it

namespace titan::float8::kernels {

namespace {

constexpr int kBlock = 256;
constexpr int kTile = 32;
constexpr double kEps = 1e-12;  // same as scaling.h

using device::dispatch_src;
using device::nan_max;
using device::to_float;

// Non-negative floats (and +NaN) order like their int bit patterns.
__device__ __forceinline__ void atomic_max_nonneg(float* addr, float v) {
  atomicMax(reinterpret_cast<int*>(addr), __float_as_int(v));
}

// Block-wide nan_max; every thread gets the result. blockDim.x a multiple of 32, <= 1024.
__device__ float block_max(float v) {
  __shared__ float warp_max[32];
  for (int off = 16; off > 0; off /= 2) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, off));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_max[warp] = v;
  __syncthreads();
  const int n_warps = blockDim.x / 32;
  v = lane < n_warps ? warp_max[lane] : 0.0f;
  for (int off = 16; off > 0; off /= 2) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// scaling.h scale_from_amax: float64 division, float32 result, optional pow2 rounding.
__device__ __forceinline__ float scale_from_amax(float amax, double fp8_max, bool round_pow2) {
  const double a = isnan(amax) ? static_cast<double>(amax) : fmax(static_cast<double>(amax), kEps);
  float s = static_cast<float>(fp8_max / a);
  if (round_pow2) s = exp2f(floorf(log2f(s)));
  return s;
}

// scaling.h cast_to_float8: float32 multiply, explicit NaN-preserving clamp, RNE conversion.
__device__ __forceinline__ __nv_fp8_storage_t cast_one(float x, float scale, Fp8Type dst) {
  const float m = dst == Fp8Type::E4M3 ? 448.0f : 57344.0f;
  float v = x * scale;
  v = v > m ? m : (v < -m ? -m : v);
  return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, dst == Fp8Type::E4M3 ? __NV_E4M3 : __NV_E5M2);
}

template <typename T>
__global__ void tensorwise_amax_kernel(const T* __restrict__ x, int64_t n, float* amax_out) {
  float m = 0.0f;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    m = nan_max(fabsf(to_float(x[i])), m);
  }
  m = block_max(m);
  if (threadIdx.x == 0) atomic_max_nonneg(amax_out, m);
}

// 16-byte loads (8 bf16 / fp16 or 4 float32 elements per thread and iteration): the scalar loop
// above reached about a quarter of the memory bandwidth on an H200 (110 us for a 64 MiB tensor).
// x must be 16-byte aligned; the tail after the last whole vector is read one element at a time.
template <typename T>
__global__ void tensorwise_amax_vec_kernel(const T* __restrict__ x, int64_t n, float* amax_out) {
  constexpr int kVec = 16 / sizeof(T);
  const int64_t n_vec = n / kVec, stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  float m = 0.0f;
  for (int64_t i = first; i < n_vec; i += stride) {
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(x) + i);
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int k = 0; k < kVec; ++k) m = nan_max(fabsf(to_float(e[k])), m);
  }
  for (int64_t i = n_vec * kVec + first; i < n; i += stride) m = nan_max(fabsf(to_float(x[i])), m);
  m = block_max(m);
  if (threadIdx.x == 0) atomic_max_nonneg(amax_out, m);
}

// Block (32, 8): 32 consecutive columns (coalesced), rows strided over threadIdx.y and grid.y.
template <typename T>
__global__ void colwise_amax_kernel(const T* __restrict__ x, int64_t rows, int64_t cols,
                                    float* amax_out) {
  const int64_t c = blockIdx.x * int64_t(kTile) + threadIdx.x;
  if (c >= cols) return;
  float m = 0.0f;
  for (int64_t r = blockIdx.y * int64_t(blockDim.y) + threadIdx.y; r < rows;
       r += int64_t(gridDim.y) * blockDim.y) {
    m = nan_max(fabsf(to_float(x[r * cols + c])), m);
  }
  atomic_max_nonneg(amax_out + c, m);
}

// The same per-column amax with 16-byte loads: a warp reads 512 contiguous bytes of a row (8
// bf16 columns per thread), each thread about 32 rows. cols a multiple of the vector width, x
// 16-byte aligned. The kernel above read 2 bytes per thread access (1.1 TB/s on an H200).
template <typename T>
__global__ void colwise_amax_vec_kernel(const T* __restrict__ x, int64_t rows, int64_t cols, float* amax_out) {
  constexpr int kVec = 16 / sizeof(T);
  const int64_t c = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) * kVec;
  if (c >= cols) return;
  float m[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k) m[k] = 0.0f;
  for (int64_t r = blockIdx.y * int64_t(blockDim.y) + threadIdx.y; r < rows; r += int64_t(gridDim.y) * blockDim.y) {
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(x + r * cols + c));
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int k = 0; k < kVec; ++k) m[k] = nan_max(fabsf(to_float(e[k])), m[k]);
  }
#pragma unroll
  for (int k = 0; k < kVec; ++k) atomic_max_nonneg(amax_out + c + k, m[k]);
}

__global__ void scale_from_amax_kernel(const float* __restrict__ amax, int64_t count,
                                       double fp8_max, bool round_pow2, float* scale_out) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < count) scale_out[i] = scale_from_amax(amax[i], fp8_max, round_pow2);
}

template <typename T>
__global__ void cast_kernel(const T* __restrict__ x, int64_t rows, int64_t cols, ScaleRef scale,
                            Fp8Type dst, __nv_fp8_storage_t* __restrict__ out) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    out[i] = cast_one(to_float(x[i]), scale.ptr[r * scale.row_stride + c * scale.col_stride], dst);
  }
}

// One scale for the whole tensor (tensorwise): 16-byte loads, kVec-byte stores, no index
// arithmetic per element; the same cast_one per element as cast_kernel, so the same bits.
// x 16-byte and out kVec-byte aligned.
template <typename T>
__global__ void cast_one_scale_vec_kernel(const T* __restrict__ x, int64_t n, const float* __restrict__ scale_ptr,
                                          Fp8Type dst, __nv_fp8_storage_t* __restrict__ out) {
  constexpr int kVec = 16 / sizeof(T);
  struct alignas(kVec) Bytes {
    __nv_fp8_storage_t b[kVec];
  };
  const float scale = *scale_ptr;
  const int64_t n_vec = n / kVec, stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  for (int64_t i = first; i < n_vec; i += stride) {
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(x) + i);
    const T* e = reinterpret_cast<const T*>(&raw);
    Bytes o;
#pragma unroll
    for (int k = 0; k < kVec; ++k) o.b[k] = cast_one(to_float(e[k]), scale, dst);
    reinterpret_cast<Bytes*>(out)[i] = o;
  }
  for (int64_t i = n_vec * kVec + first; i < n; i += stride) out[i] = cast_one(to_float(x[i]), scale, dst);
}

template <typename T>
__global__ void rowwise_amax_scale_cast_kernel(const T* __restrict__ x, int64_t cols,
                                               double fp8_max, bool round_pow2, Fp8Type dst,
                                               __nv_fp8_storage_t* __restrict__ out,
                                               float* __restrict__ scale_out) {
  const T* row = x + blockIdx.x * cols;
  __nv_fp8_storage_t* out_row = out + blockIdx.x * cols;
  float m = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) m = nan_max(fabsf(to_float(row[c])), m);
  const float s = scale_from_amax(block_max(m), fp8_max, round_pow2);
  if (threadIdx.x == 0) scale_out[blockIdx.x] = s;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) out_row[c] = cast_one(to_float(row[c]), s, dst);
}

// The same with 16-byte loads and 8-byte (bf16 / half) or 4-byte (float) stores, for cols a
// multiple of the vector width and x, out 16-byte aligned; the row is read twice (amax, then cast),
// the second time mostly from L2. The kernel above moves 2 bytes per load (1.8 TB/s on an H200).
template <typename T>
__global__ void rowwise_amax_scale_cast_vec_kernel(const T* __restrict__ x, int64_t cols, double fp8_max,
                                                   bool round_pow2, Fp8Type dst,
                                                   __nv_fp8_storage_t* __restrict__ out,
                                                   float* __restrict__ scale_out) {
  constexpr int kVec = 16 / sizeof(T);
  const uint4* row = reinterpret_cast<const uint4*>(x + blockIdx.x * cols);
  __nv_fp8_storage_t* out_row = out + blockIdx.x * cols;
  const int64_t n_vec = cols / kVec;
  float m = 0.0f;
  for (int64_t i = threadIdx.x; i < n_vec; i += blockDim.x) {
    const uint4 raw = row[i];
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int k = 0; k < kVec; ++k) m = nan_max(fabsf(to_float(e[k])), m);
  }
  const float s = scale_from_amax(block_max(m), fp8_max, round_pow2);
  if (threadIdx.x == 0) scale_out[blockIdx.x] = s;
  for (int64_t i = threadIdx.x; i < n_vec; i += blockDim.x) {
    const uint4 raw = row[i];
    const T* e = reinterpret_cast<const T*>(&raw);
    alignas(8) __nv_fp8_storage_t q[kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k) q[k] = cast_one(to_float(e[k]), s, dst);
    if constexpr (kVec == 8) {
      *reinterpret_cast<uint2*>(out_row + i * kVec) = *reinterpret_cast<const uint2*>(q);
    } else {
      *reinterpret_cast<uint32_t*>(out_row + i * kVec) = *reinterpret_cast<const uint32_t*>(q);
    }
  }
}

// 32x32 tiles through shared memory (padded against bank conflicts): reads and writes are
// both coalesced.
template <typename T>
__global__ void cast_transpose_kernel(const T* __restrict__ x, int64_t rows, int64_t cols,
                                      ScaleRef scale, Fp8Type dst,
                                      __nv_fp8_storage_t* __restrict__ out_t) {
  __shared__ __nv_fp8_storage_t tile[kTile][kTile + 1];
  const int64_t c0 = blockIdx.x * int64_t(kTile), r0 = blockIdx.y * int64_t(kTile);
  for (int j = threadIdx.y; j < kTile; j += blockDim.y) {
    const int64_t r = r0 + j, c = c0 + threadIdx.x;
    if (r < rows && c < cols) {
      tile[j][threadIdx.x] = cast_one(to_float(x[r * cols + c]),
                                      scale.ptr[r * scale.row_stride + c * scale.col_stride], dst);
    }
  }
  __syncthreads();
  for (int j = threadIdx.y; j < kTile; j += blockDim.y) {
    const int64_t c = c0 + j, r = r0 + threadIdx.x;
    if (r < rows && c < cols) out_t[c * rows + r] = tile[threadIdx.x][j];
  }
}

// The same cast + transpose over 64 x 64 tiles with 16-byte accesses both ways, for rows and
// cols multiples of 64 and 16-byte aligned x and out_t: each thread reads 16 bytes of a row,
// casts them into the shared tile, and writes 16 bytes of a transposed row (64 output rows of 64
// bytes per tile). The 32 x 32 kernel above moves 1-2 bytes per thread access: 0.8 TB/s on an
// H200 for 8192 x 8192 bf16, against about 3.5 for the row casts. Same cast_one per element.
constexpr int kVecTile = 64;
template <typename T>
__global__ void __launch_bounds__(256) cast_transpose_vec_kernel(const T* __restrict__ x, int64_t rows, int64_t cols,
                                                                ScaleRef scale, Fp8Type dst,
                                                                __nv_fp8_storage_t* __restrict__ out_t) {
  constexpr int kIn = 16 / sizeof(T);                // elements per 16-byte load
  constexpr int kThreadsPerRow = kVecTile / kIn;     // 8 (bf16 / half) or 16 (float)
  constexpr int kRowsPerPass = 256 / kThreadsPerRow;
  __shared__ __nv_fp8_storage_t tile[kVecTile][kVecTile + 4];
  const int64_t c0 = blockIdx.x * int64_t{kVecTile}, r0 = blockIdx.y * int64_t{kVecTile};
  const int tc = (threadIdx.x % kThreadsPerRow) * kIn;
  for (int rr = threadIdx.x / kThreadsPerRow; rr < kVecTile; rr += kRowsPerPass) {
    const int64_t r = r0 + rr;
    const uint4 raw = *reinterpret_cast<const uint4*>(x + r * cols + c0 + tc);
    const T* v = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int k = 0; k < kIn; ++k) {
      const int64_t c = c0 + tc + k;
      tile[rr][tc + k] = cast_one(to_float(v[k]), scale.ptr[r * scale.row_stride + c * scale.col_stride], dst);
    }
  }
  __syncthreads();
  const int oc = threadIdx.x / 4, part = (threadIdx.x % 4) * 16;  // output row, its 16-byte quarter
  uint4 packed;
  auto* bytes = reinterpret_cast<__nv_fp8_storage_t*>(&packed);
#pragma unroll
  for (int k = 0; k < 16; ++k) bytes[k] = tile[part + k][oc];
  *reinterpret_cast<uint4*>(out_t + (c0 + oc) * rows + r0 + part) = packed;
}

int grid_for(int64_t n) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  return static_cast<int>(blocks < 65536 ? (blocks > 0 ? blocks : 1) : 65536);
}

// Grid of the vectorized grid-stride kernels: enough blocks to fill any GPU (132 SMs x 8
// resident blocks of 256 threads on an H100), no more (each block of the amax ends in one atomic).
int vec_grid_for(int64_t n, int vec) {
  const int64_t blocks = (n / vec + kBlock - 1) / kBlock;
  return static_cast<int>(blocks < 2048 ? (blocks > 0 ? blocks : 1) : 2048);
}

bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }


}  // namespace

void launch_tensorwise_amax(const void* x, SrcType src, int64_t n, float* amax_out,
                            void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  TITAN_CUDA_CHECK(cudaMemsetAsync(amax_out, 0, sizeof(float), s), "amax_out must be device memory");
  if (n == 0) return;
  dispatch_src(src, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    if (aligned(x, 16))
      tensorwise_amax_vec_kernel<T><<<vec_grid_for(n, 16 / sizeof(T)), kBlock, 0, s>>>(static_cast<const T*>(x), n,
                                                                                      amax_out);
    else
      tensorwise_amax_kernel<T><<<grid_for(n), kBlock, 0, s>>>(static_cast<const T*>(x), n, amax_out);
  });
  TITAN_CUDA_CHECK(cudaGetLastError(), "tensorwise_amax_kernel launch");
}

void launch_colwise_amax(const void* x, SrcType src, int64_t rows, int64_t cols, float* amax_out,
                         void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  TITAN_CUDA_CHECK(cudaMemsetAsync(amax_out, 0, sizeof(float) * cols, s),
                   "amax_out must hold cols floats of device memory");
  if (rows == 0 || cols == 0) return;
  const dim3 block(kTile, 8);
  const int64_t row_blocks = (rows + 8 * 16 - 1) / (8 * 16);  // ~16 rows per thread
  const dim3 grid(static_cast<unsigned>((cols + kTile - 1) / kTile),
                  static_cast<unsigned>(row_blocks < 65535 ? row_blocks : 65535));
  dispatch_src(src, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    constexpr int kVec = 16 / sizeof(T);
    if (cols % kVec == 0 && aligned(x, 16)) {
      const int64_t vec_row_blocks = (rows + 8 * 32 - 1) / (8 * 32);  // ~32 rows per thread
      const dim3 vec_grid(static_cast<unsigned>((cols / kVec + kTile - 1) / kTile),
                          static_cast<unsigned>(vec_row_blocks < 65535 ? vec_row_blocks : 65535));
      colwise_amax_vec_kernel<T><<<vec_grid, block, 0, s>>>(static_cast<const T*>(x), rows, cols, amax_out);
    } else {
      colwise_amax_kernel<T><<<grid, block, 0, s>>>(static_cast<const T*>(x), rows, cols, amax_out);
    }
  });
  TITAN_CUDA_CHECK(cudaGetLastError(), "colwise_amax_kernel launch");
}

void launch_scale_from_amax(const float* amax, int64_t count, double fp8_max, bool round_pow2,
                            float* scale_out, void* stream) {
  if (count == 0) return;
  scale_from_amax_kernel<<<grid_for(count), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(
      amax, count, fp8_max, round_pow2, scale_out);
  TITAN_CUDA_CHECK(cudaGetLastError(), "scale_from_amax_kernel launch");
}

void launch_cast(const void* x, SrcType src, int64_t rows, int64_t cols, ScaleRef scale,
                 Fp8Type dst, void* out, void* stream) {
  if (rows * cols == 0) return;
  dispatch_src(src, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    constexpr int kVec = 16 / sizeof(T);
    if (scale.row_stride == 0 && scale.col_stride == 0 && aligned(x, 16) && aligned(out, kVec))
      cast_one_scale_vec_kernel<T><<<vec_grid_for(rows * cols, kVec), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(
          static_cast<const T*>(x), rows * cols, scale.ptr, dst, static_cast<__nv_fp8_storage_t*>(out));
    else
      cast_kernel<T><<<grid_for(rows * cols), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(
          static_cast<const T*>(x), rows, cols, scale, dst, static_cast<__nv_fp8_storage_t*>(out));
  });
  TITAN_CUDA_CHECK(cudaGetLastError(), "cast_kernel launch");
}

void launch_rowwise_amax_scale_cast(const void* x, SrcType src, int64_t rows, int64_t cols,
                                    double fp8_max, bool round_pow2, Fp8Type dst, void* out,
                                    float* scale_out, void* stream) {
  if (rows == 0) return;
  if (rows > 2147483647LL) throw std::invalid_argument("rowwise cast: more than 2^31-1 rows");
  dispatch_src(src, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    constexpr int kVec = 16 / sizeof(T);
    if (cols % kVec == 0 && aligned(x, 16) && aligned(out, 16))
      rowwise_amax_scale_cast_vec_kernel<T>
          <<<static_cast<unsigned>(rows), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(
              static_cast<const T*>(x), cols, fp8_max, round_pow2, dst,
              static_cast<__nv_fp8_storage_t*>(out), scale_out);
    else
      rowwise_amax_scale_cast_kernel<T>
          <<<static_cast<unsigned>(rows), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(
              static_cast<const T*>(x), cols, fp8_max, round_pow2, dst,
              static_cast<__nv_fp8_storage_t*>(out), scale_out);
  });
  TITAN_CUDA_CHECK(cudaGetLastError(), "rowwise_amax_scale_cast_kernel launch");
}

void launch_cast_transpose(const void* x, SrcType src, int64_t rows, int64_t cols,
                           ScaleRef scale, Fp8Type dst, void* out_t, void* stream) {
  if (rows * cols == 0) return;
  const int64_t row_tiles = (rows + kTile - 1) / kTile;
  if (row_tiles > 65535) {
    throw std::invalid_argument("cast_transpose: rows = " + std::to_string(rows) +
                                " exceeds 65535 * 32; split the tensor");
  }
  const bool vec = rows % kVecTile == 0 && cols % kVecTile == 0 && aligned(x, 16) && aligned(out_t, 16);
  const dim3 block(kTile, 8);
  const dim3 grid(static_cast<unsigned>((cols + kTile - 1) / kTile),
                  static_cast<unsigned>(row_tiles));
  const dim3 vec_grid(static_cast<unsigned>(cols / kVecTile), static_cast<unsigned>(rows / kVecTile));
  dispatch_src(src, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    if (vec)
      cast_transpose_vec_kernel<T><<<vec_grid, 256, 0, static_cast<cudaStream_t>(stream)>>>(
          static_cast<const T*>(x), rows, cols, scale, dst, static_cast<__nv_fp8_storage_t*>(out_t));
    else
      cast_transpose_kernel<T><<<grid, block, 0, static_cast<cudaStream_t>(stream)>>>(
          static_cast<const T*>(x), rows, cols, scale, dst,
          static_cast<__nv_fp8_storage_t*>(out_t));
  });
  TITAN_CUDA_CHECK(cudaGetLastError(), "cast_transpose_kernel launch");
}

}  // namespace titan::float8::kernels
