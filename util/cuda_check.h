// util/cuda_check.h — TITAN_CUDA_CHECK(call, hint): the one check for CUDA runtime and
// cuBLAS / cuBLASLt status codes (CUDA build only: it includes the CUDA toolkit's headers).
//
// A failed call throws std::runtime_error reading
//   float8/cublaslt_gemm.cpp:126: cublasLtMatmul(...) failed: cuBLAS CUBLAS_STATUS_NOT_SUPPORTED:
//   the functionality requested is not supported (15). HINT: <hint>
// i.e. file:line, the call as written, the library's name and message for the status, its
// number, and the caller's hint (anything that can be streamed with <<). No LibTorch here, so
// nvcc-compiled kernel launchers can use it too.
#pragma once

#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include <sstream>
#include <stdexcept>
#include <string>

namespace titan::util::cuda_check_detail {

inline bool succeeded(cudaError_t status) { return status == cudaSuccess; }
inline bool succeeded(cublasStatus_t status) { return status == CUBLAS_STATUS_SUCCESS; }

inline std::string describe(cudaError_t status) {
  return std::string("CUDA ") + cudaGetErrorName(status) + ": " + cudaGetErrorString(status);
}
inline std::string describe(cublasStatus_t status) {
  return std::string("cuBLAS ") + cublasGetStatusName(status) + ": " + cublasGetStatusString(status);
}

}  // namespace titan::util::cuda_check_detail

#define TITAN_CUDA_CHECK(call, hint)                                                            \
  do {                                                                                          \
    const auto titan_status_ = (call);                                                          \
    if (!::titan::util::cuda_check_detail::succeeded(titan_status_)) {                          \
      std::ostringstream titan_message_;                                                        \
      titan_message_ << __FILE__ << ":" << __LINE__ << ": " << #call << " failed: "             \
                     << ::titan::util::cuda_check_detail::describe(titan_status_) << " ("       \
                     << static_cast<int>(titan_status_) << "). HINT: " << hint;                 \
      throw std::runtime_error(titan_message_.str());                                           \
    }                                                                                           \
  } while (0)
