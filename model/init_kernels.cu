// model/init_kernels.cu — CUDA twin of the CPU init filler: one thread per element, the same
// init_philox.h code. Built with --fmad=false (model/CMakeLists.txt) so no multiply-add is
// contracted and every float64 operation rounds as on the CPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "model/init_kernels.cuh"
#include "model/init_philox.h"

namespace titan::model::kernels {
namespace {

__global__ void init_box_kernel(float* out, int64_t rows, int64_t cols, int64_t row0,
                                int64_t col0, int64_t full_cols, uint64_t seed, uint64_t key,
                                double std, double lo, double hi) {
  const int64_t n = rows * cols;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i - r * cols;
    const uint64_t index = static_cast<uint64_t>((row0 + r) * full_cols + col0 + c);
    out[i] = philox::init_value(seed, key, index, std, lo, hi);
  }
}

}  // namespace

void launch_init_box(float* out, int64_t rows, int64_t cols, int64_t row0, int64_t col0,
                     int64_t full_cols, uint64_t seed, uint64_t key, double std, double lo,
                     double hi, void* stream) {
  const int64_t n = rows * cols;
  if (n == 0) return;
  constexpr int kThreads = 256;
  // Grid-stride loop: at most 65536 blocks, each thread covering several elements beyond that.
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, 65536);
  init_box_kernel<<<static_cast<unsigned>(blocks), kThreads, 0,
                    static_cast<cudaStream_t>(stream)>>>(out, rows, cols, row0, col0, full_cols,
                                                         seed, key, std, lo, hi);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("init_box_kernel launch failed: ") +
                             cudaGetErrorString(err));
}

}  // namespace titan::model::kernels
