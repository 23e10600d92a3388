// trainer/optim/adamw_kernels.cpp — see adamw_kernels.h. An AVX2 kernel file (Note [AVX2 kernel
// files] in CMakeLists.txt: -ffp-contract=off, so every product and sum rounds as written).
#include "trainer/optim/adamw_kernels.h"

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>

#include "util/cpu_features.h"

namespace titan::trainer::optim::kernels {
namespace {

using Vec = at::vec::Vectorized<float>;
using VecBF16 = at::vec::Vectorized<c10::BFloat16>;  // twice Vec's lanes

// Elements per parallel task (a multiple of every vector width; elementwise, so any split gives
// the same bits).
constexpr int64_t kGrain = 16384;

// The step's scalars, broadcast once.
struct Coefficients {
  explicit Coefficients(const AdamWStep& s)
      : small(std::abs(s.beta1_weight) < 0.5f),
        coeff(small ? s.beta1_weight : s.beta1_weight - 1.f),
        vcoeff(coeff), vscale(s.grad_scale), vdecay(s.lr_decay), vgdecay(s.grad_decay), vb2(s.beta2),
        vb2w(s.beta2_weight), vbc2(s.bias_correction2_sqrt), veps(s.eps), vstep(s.neg_step_size) {}
  // ATen's lerp for exp_avg.lerp_(grad, w): w < 0.5: m + w (g - m), else g + (w - 1) (g - m).
  bool small;
  float coeff;
  Vec vcoeff, vscale, vdecay, vgdecay, vb2, vb2w, vbc2, veps, vstep;
};

// One vector of the update: m and v stored, the new parameter returned.
inline Vec update_vector(Vec pv, Vec gv, float* m, float* v, const AdamWStep& s, const Coefficients& c) {
  if (s.grad_scale != 1.f) gv = gv * c.vscale;
  if (s.grad_decay != 0.f) gv = gv + pv * c.vgdecay;
  if (s.lr_decay != 1.f) pv = pv * c.vdecay;
  Vec mv = Vec::loadu(m);
  mv = at::vec::fmadd(c.vcoeff, gv - mv, c.small ? mv : gv);
  const Vec vv = Vec::loadu(v) * c.vb2 + c.vb2w * gv * gv;
  mv.store(m);
  vv.store(v);
  const Vec denom = (vv.sqrt() / c.vbc2) + c.veps;
  return pv + c.vstep * mv / denom;
}

// The same for one element (the tail).
inline float update_scalar(float pv, float gv, float* m, float* v, const AdamWStep& s, const Coefficients& c) {
  if (s.grad_scale != 1.f) gv = gv * s.grad_scale;
  if (s.grad_decay != 0.f) gv = gv + pv * s.grad_decay;
  if (s.lr_decay != 1.f) pv = pv * s.lr_decay;
  const float mv = std::fma(c.coeff, gv - *m, c.small ? *m : gv);
  const float vv = *v * s.beta2 + s.beta2_weight * gv * gv;
  *m = mv;
  *v = vv;
  return pv + s.neg_step_size * mv / (std::sqrt(vv) / s.bias_correction2_sqrt + s.eps);
}

// Elements [begin, end): the gradient widened and the copy rounded in registers, one pass over
// each array (an intermediate float32 buffer per span cost ~20% here: 85-93 against 69-75 ms
// median for 10^8 elements on 2 threads, the same bits).
void update_range(float* p, const c10::BFloat16* g16, float* m, float* v, c10::BFloat16* copy, int64_t begin,
                  int64_t end, const AdamWStep& s, const Coefficients& c) {
  constexpr int64_t kLanes = Vec::size();
  int64_t i = begin;
  for (; i + VecBF16::size() <= end; i += VecBF16::size()) {
    const auto [g0, g1] = at::vec::convert_bfloat16_float(VecBF16::loadu(g16 + i));  // exact: a shift
    const Vec p0 = update_vector(Vec::loadu(p + i), g0, m + i, v + i, s, c);
    const Vec p1 = update_vector(Vec::loadu(p + i + kLanes), g1, m + i + kLanes, v + i + kLanes, s, c);
    p0.store(p + i);
    p1.store(p + i + kLanes);
    at::vec::convert_float_bfloat16(p0, p1).store(copy + i);  // round to nearest even
  }
  for (; i < end; ++i) {
    p[i] = update_scalar(p[i], static_cast<float>(g16[i]), m + i, v + i, s, c);
    copy[i] = c10::BFloat16(p[i]);
  }
}

}  // namespace

bool adamw_cpu_kernel_available() { return util::cpu_has_avx2_kernels(); }

void adamw_bf16_grad_cpu(float* param, const c10::BFloat16* grad, float* exp_avg, float* exp_avg_sq,
                         c10::BFloat16* copy, int64_t n, const AdamWStep& s) {
  const Coefficients c(s);
  at::parallel_for(0, n, kGrain,
                   [&](int64_t begin, int64_t end) { update_range(param, grad, exp_avg, exp_avg_sq, copy, begin, end, s, c); });
}

}  // namespace titan::trainer::optim::kernels
