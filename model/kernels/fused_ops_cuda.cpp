// at::Tensor wrappers of the fused CUDA kernels (model/kernels/fused_ops_cuda.h).
#include "model/kernels/fused_ops_cuda.h"

#include <cstdlib>
#include <stdexcept>
#include <string>

#ifdef TITAN_WITH_CUDA
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "model/kernels/fused_ops_kernels.cuh"
#endif

namespace titan::model {

bool fused_ops_cuda_requested() {
  static const bool requested = [] {
    const char* env = std::getenv("TITAN_FUSED_OPS_CUDA");
    return env == nullptr || std::string(env) != "0";
  }();
  return requested;
}

#ifdef TITAN_WITH_CUDA

bool fused_ops_cuda_enabled() { return fused_ops_cuda_requested(); }

namespace cuda_ops {
namespace {
void* stream_of(const at::Tensor& t) { return c10::cuda::getCurrentCUDAStream(t.device().index()).stream(); }
kernels::Elem elem_of(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 ? kernels::Elem::kBFloat16 : kernels::Elem::kFloat32;
}
}  // namespace

void rms_norm_forward(const at::Tensor& x, const at::Tensor& w, double eps, at::Tensor& y, at::Tensor& rstd) {
  c10::cuda::CUDAGuard guard(x.device());
  kernels::launch_rms_norm_forward(elem_of(x), x.data_ptr(), w.data_ptr(), rstd.numel(), w.numel(),
                                   static_cast<float>(eps), y.data_ptr(), rstd.data_ptr<float>(), stream_of(x));
}

void rms_norm_backward(const at::Tensor& g, const at::Tensor& x, const at::Tensor& w,
                       const at::Tensor& rstd, at::Tensor& gx, at::Tensor& gw) {
  c10::cuda::CUDAGuard guard(x.device());
  const int64_t rows = rstd.numel(), dim = w.numel();
  const int64_t blocks = (rows + kernels::kRmsNormGradWeightBlockRows - 1) / kernels::kRmsNormGradWeightBlockRows;
  at::Tensor partial = at::empty({std::max<int64_t>(blocks, 1), dim}, x.options().dtype(at::kFloat));
  kernels::launch_rms_norm_backward(elem_of(x), g.data_ptr(), x.data_ptr(), w.data_ptr(), rstd.data_ptr<float>(),
                                    rows, dim, gx.data_ptr(), partial.data_ptr<float>(), gw.data_ptr(),
                                    stream_of(x));
}

void rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool inverse, at::Tensor& y) {
  c10::cuda::CUDAGuard guard(x.device());
  kernels::launch_rotary(elem_of(x), x.data_ptr(), cos.data_ptr<float>(), sin.data_ptr<float>(), x.size(0),
                         x.size(1), x.size(2), x.size(3) / 2, inverse, y.data_ptr(), stream_of(x));
}

void swiglu_forward(const at::Tensor& gate, const at::Tensor& up, at::Tensor& y) {
  c10::cuda::CUDAGuard guard(gate.device());
  kernels::launch_swiglu_forward(elem_of(gate), gate.data_ptr(), up.data_ptr(), gate.numel(), y.data_ptr(),
                                 stream_of(gate));
}

void swiglu_backward(const at::Tensor& dy, const at::Tensor& gate, const at::Tensor& up,
                     at::Tensor& dgate, at::Tensor& dup) {
  c10::cuda::CUDAGuard guard(gate.device());
  kernels::launch_swiglu_backward(elem_of(gate), dy.data_ptr(), gate.data_ptr(), up.data_ptr(), gate.numel(),
                                  dgate.data_ptr(), dup.data_ptr(), stream_of(gate));
}
}  // namespace cuda_ops

#else

bool fused_ops_cuda_enabled() { return false; }

namespace cuda_ops {
namespace {
[[noreturn]] void no_cuda(const char* what) {
  throw std::runtime_error(std::string(what) +
                           ": titan_model was built without CUDA (configure with -DTITAN_CUDA=ON)");
}
}  // namespace
void rms_norm_forward(const at::Tensor&, const at::Tensor&, double, at::Tensor&, at::Tensor&) {
  no_cuda("fused rms_norm_forward");
}
void rms_norm_backward(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                       at::Tensor&, at::Tensor&) {
  no_cuda("fused rms_norm_backward");
}
void rotary(const at::Tensor&, const at::Tensor&, const at::Tensor&, bool, at::Tensor&) { no_cuda("fused rotary"); }
void swiglu_forward(const at::Tensor&, const at::Tensor&, at::Tensor&) { no_cuda("fused swiglu_forward"); }
void swiglu_backward(const at::Tensor&, const at::Tensor&, const at::Tensor&, at::Tensor&, at::Tensor&) {
  no_cuda("fused swiglu_backward");
}
}  // namespace cuda_ops

#endif

}  // namespace titan::model
