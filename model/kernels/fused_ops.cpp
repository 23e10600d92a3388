// Autograd Functions over the fused kernels (model/kernels/fused_ops.h) and the choice between
// them and the ATen composite.
#include "model/kernels/fused_ops.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/rms_norm.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/stack.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstdlib>
#include <string>
#include <type_traits>

#include "model/kernels/fused_ops_cuda.h"
#include "util/cpu_features.h"

namespace titan::model {

bool fused_ops_enabled() {
  static const bool enabled = [] {
    const char* env = std::getenv("TITAN_FUSED_OPS");
    return env == nullptr || std::string(env) != "0";
  }();
  return enabled;
}

bool fused_ops_run_on(bool cuda) {
  return fused_ops_enabled() && (cuda ? fused_ops_cuda_requested() : util::cpu_has_avx2_kernels());
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Where the fused kernels run: float32 or bfloat16, on the CPU or CUDA (Note [Fused ops on CUDA] in
// model/kernels/fused_ops_cuda.h).
enum class Path { kComposite, kCpu, kCuda };

// `tensors`: the operands that share the compute dtype (float32 or bfloat16);
// `tables`: float32 operands whatever the dtype (RoPE's angles).
Path path_for(std::initializer_list<at::Tensor> tensors, std::initializer_list<at::Tensor> tables = {}) {
  if (!fused_ops_enabled()) return Path::kComposite;
  const at::Tensor& first = *tensors.begin();
  const bool cuda = first.is_cuda();
  if (cuda && !fused_ops_cuda_enabled()) return Path::kComposite;
  if (!cuda && (!first.device().is_cpu() || !util::cpu_has_avx2_kernels())) return Path::kComposite;
  const at::ScalarType dtype = first.scalar_type();
  if (dtype != at::kFloat && dtype != at::kBFloat16) return Path::kComposite;
  for (const at::Tensor& t : tensors)
    if (t.scalar_type() != dtype || t.device() != first.device()) return Path::kComposite;
  for (const at::Tensor& t : tables)
    if (t.scalar_type() != at::kFloat || t.device() != first.device()) return Path::kComposite;
  return cuda ? Path::kCuda : Path::kCpu;
}

// A CPU tensor's data as the kernels' element type (float32 or bfloat16).
template <typename T>
T* data(const at::Tensor& t) {
  return t.data_ptr<T>();
}

// Calls fn with a null pointer of the kernels' element type for `t`'s dtype.
template <typename Fn>
void by_dtype(const at::Tensor& t, const Fn& fn) {
  if (t.scalar_type() == at::kBFloat16)
    fn(static_cast<at::BFloat16*>(nullptr));
  else
    fn(static_cast<float*>(nullptr));
}

// ---------------------------------------------------------------- RMSNorm

struct RMSNormFunction : public torch::autograd::Function<RMSNormFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& w_in, double eps) {
    const at::Tensor x = x_in.contiguous(), w = w_in.contiguous();
    const int64_t dim = w.numel(), rows = x.numel() / dim;
    at::Tensor y = at::empty_like(x);
    at::Tensor rstd = at::empty({rows}, x.options().dtype(at::kFloat));  // [rows]: all the backward adds to x
    if (x.is_cuda()) {
      cuda_ops::rms_norm_forward(x, w, eps, y, rstd);
    } else {
      by_dtype(x, [&](auto* type) {
        using T = std::remove_pointer_t<decltype(type)>;
        kernels::rms_norm_forward_cpu(data<T>(x), data<T>(w), rows, dim, static_cast<float>(eps), data<T>(y),
                                      rstd.data_ptr<float>());
      });
    }
    ctx->save_for_backward({x, w, rstd});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto s = ctx->get_saved_variables();
    const at::Tensor &x = s[0], &w = s[1], &rstd = s[2];
    const at::Tensor g = grads[0].contiguous().to(x.scalar_type());
    const int64_t dim = w.numel(), rows = x.numel() / dim;
    at::Tensor gx = at::empty_like(x), gw = at::empty_like(w);
    if (x.is_cuda()) {
      cuda_ops::rms_norm_backward(g, x, w, rstd, gx, gw);
    } else {
      by_dtype(x, [&](auto* type) {
        using T = std::remove_pointer_t<decltype(type)>;
        kernels::rms_norm_backward_cpu(data<T>(g), data<T>(x), data<T>(w), rstd.data_ptr<float>(), rows, dim,
                                       data<T>(gx), data<T>(gw));
      });
    }
    return {gx, gw, at::Tensor()};
  }
};

// ---------------------------------------------------------------- RoPE

struct RotaryFunction : public torch::autograd::Function<RotaryFunction> {
  // cos/sin: [S, hd/2] contiguous rows of the table (constants: no gradient).
  static at::Tensor rotate(const at::Tensor& x_in, const at::Tensor& cos, const at::Tensor& sin, bool inverse) {
    const at::Tensor x = x_in.contiguous();  // [B, S, H, hd]
    at::Tensor y = at::empty_like(x);
    if (x.is_cuda()) {
      cuda_ops::rotary(x, cos, sin, inverse, y);
    } else {
      by_dtype(x, [&](auto* type) {
        using T = std::remove_pointer_t<decltype(type)>;
        kernels::rotary_cpu(data<T>(x), cos.data_ptr<float>(), sin.data_ptr<float>(), x.size(0), x.size(1),
                            x.size(2), x.size(3) / 2, inverse, data<T>(y));
      });
    }
    return y;
  }
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    ctx->save_for_backward({cos, sin});
    return rotate(x, cos, sin, /*inverse=*/false);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto s = ctx->get_saved_variables();
    return {rotate(grads[0], s[0], s[1], /*inverse=*/true), at::Tensor(), at::Tensor()};
  }
};

// ---------------------------------------------------------------- SwiGLU

struct SwiGLUFunction : public torch::autograd::Function<SwiGLUFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate_in, const at::Tensor& up_in) {
    const at::Tensor gate = gate_in.contiguous(), up = up_in.contiguous();
    at::Tensor y = at::empty_like(gate);
    if (gate.is_cuda()) {
      cuda_ops::swiglu_forward(gate, up, y);
    } else {
      by_dtype(gate, [&](auto* type) {
        using T = std::remove_pointer_t<decltype(type)>;
        kernels::swiglu_forward_cpu(data<T>(gate), data<T>(up), gate.numel(), data<T>(y));
      });
    }
    ctx->save_for_backward({gate, up});  // silu(gate) is recomputed, not saved
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto s = ctx->get_saved_variables();
    const at::Tensor &gate = s[0], &up = s[1];
    const at::Tensor dy = grads[0].contiguous().to(gate.scalar_type());
    at::Tensor dgate = at::empty_like(gate), dup = at::empty_like(up);
    if (gate.is_cuda()) {
      cuda_ops::swiglu_backward(dy, gate, up, dgate, dup);
    } else {
      by_dtype(gate, [&](auto* type) {
        using T = std::remove_pointer_t<decltype(type)>;
        kernels::swiglu_backward_cpu(data<T>(dy), data<T>(gate), data<T>(up), gate.numel(), data<T>(dgate),
                                     data<T>(dup));
      });
    }
    return {dgate, dup};
  }
};

}  // namespace

double sum_of_squares(const at::Tensor& x) {
  if (x.is_cpu() && x.scalar_type() == at::kBFloat16 && util::cpu_has_avx2_kernels()) {
    const at::Tensor c = x.contiguous();
    return kernels::sum_of_squares_cpu(c.data_ptr<at::BFloat16>(), c.numel());
  }
  return x.to(at::kDouble).pow(2).sum().item<double>();
}

at::Tensor fused_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(weight.dim() == 1 && x.dim() >= 1 && x.size(-1) == weight.size(0),
              "rms_norm: weight ", weight.sizes(), " does not match the last dim of x ", x.sizes());
  if (path_for({x, weight}) == Path::kComposite || x.numel() == 0)
    return at::rms_norm(x, {weight.size(0)}, weight, eps);
  return RMSNormFunction::apply(x, weight, eps);
}

at::Tensor fused_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(x.dim() == 4 && x.size(-1) % 2 == 0, "rotary: x must be [B, S, H, even head_dim], got ",
              x.sizes());
  const int64_t seq = x.size(1), half = x.size(3) / 2;
  TORCH_CHECK(cos.dim() == 2 && cos.size(1) == half && seq <= cos.size(0) && sin.sizes() == cos.sizes(),
              "rotary: table ", cos.sizes(), " does not cover x ", x.sizes());
  at::Tensor c = cos.slice(0, 0, seq), s = sin.slice(0, 0, seq);
  if (path_for({x}, {cos, sin}) != Path::kComposite && x.numel() > 0)
    return RotaryFunction::apply(x, c.contiguous(), s.contiguous());
  // Rotate in at least float32 (bf16 activations are upcast, float64 stays float64).
  const at::ScalarType compute = at::promote_types(x.scalar_type(), at::kFloat);
  c = c.unsqueeze(0).unsqueeze(2).to(compute);  // [1, S, 1, hd/2] broadcasts over batch, heads
  s = s.unsqueeze(0).unsqueeze(2).to(compute);
  at::Tensor pairs = x.to(compute).unflatten(-1, {-1, 2});  // [B, S, H, hd/2, 2]
  at::Tensor even = pairs.select(-1, 0), odd = pairs.select(-1, 1);
  at::Tensor rotated = at::stack({even * c - odd * s, even * s + odd * c}, -1);
  return rotated.flatten(-2).to(x.scalar_type());
}

at::Tensor fused_swiglu(const at::Tensor& gate, const at::Tensor& up) {
  TORCH_CHECK(gate.sizes() == up.sizes(), "swiglu: gate ", gate.sizes(), " and up ", up.sizes(),
              " differ in shape");
  if (path_for({gate, up}) == Path::kComposite || gate.numel() == 0) return at::silu(gate) * up;
  return SwiGLUFunction::apply(gate, up);
}

}  // namespace titan::model
