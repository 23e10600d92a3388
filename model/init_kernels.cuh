// model/init_kernels.cuh — launcher of the CUDA twin of the counter-based init (CUDA build only).
// Raw-pointer API so init_kernels.cu compiles with nvcc without the LibTorch headers.
#pragma once

#include <cstdint>

namespace titan::model::kernels {

// out[r * cols + c] (float32, contiguous on the device) = philox::init_value(seed, key,
// (row0 + r) * full_cols + col0 + c, std, lo, hi) for r < rows, c < cols.
void launch_init_box(float* out, int64_t rows, int64_t cols, int64_t row0, int64_t col0,
                     int64_t full_cols, uint64_t seed, uint64_t key, double std, double lo,
                     double hi, void* stream);

}  // namespace titan::model::kernels
