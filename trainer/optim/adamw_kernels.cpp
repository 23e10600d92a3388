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

// Elements per parallel task (a multiple of every vector width; elementwise, so any split gives
// the same bits).
constexpr int64_t kGrain = 16384;

void update_span(float* p, const c10::BFloat16* g16, float* m, float* v, c10::BFloat16* copy, int64_t n,
                 const AdamWStep& s, float* widened) {
  for (int64_t i = 0; i < n; ++i) widened[i] = static_cast<float>(g16[i]);  // exact: a shift
  // ATen's lerp for exp_avg.lerp_(grad, w): w < 0.5: m + w (g - m), else g + (w - 1) (g - m).
  const bool small = std::abs(s.beta1_weight) < 0.5f;
  const float coeff = small ? s.beta1_weight : s.beta1_weight - 1.f;
  const Vec vcoeff(coeff), vscale(s.grad_scale), vdecay(s.lr_decay), vgdecay(s.grad_decay), vb2(s.beta2),
      vb2w(s.beta2_weight), vbc2(s.bias_correction2_sqrt), veps(s.eps), vstep(s.neg_step_size);
  int64_t i = 0;
  for (; i + Vec::size() <= n; i += Vec::size()) {
    Vec pv = Vec::loadu(p + i), gv = Vec::loadu(widened + i);
    if (s.grad_scale != 1.f) gv = gv * vscale;
    if (s.grad_decay != 0.f) gv = gv + pv * vgdecay;
    if (s.lr_decay != 1.f) pv = pv * vdecay;
    Vec mv = Vec::loadu(m + i);
    mv = at::vec::fmadd(vcoeff, gv - mv, small ? mv : gv);
    const Vec vv = Vec::loadu(v + i) * vb2 + vb2w * gv * gv;
    mv.store(m + i);
    vv.store(v + i);
    const Vec denom = (vv.sqrt() / vbc2) + veps;
    pv = pv + vstep * mv / denom;
    pv.store(p + i);
    pv.store(widened + i);  // the copy's source, rounded below in one call
  }
  for (; i < n; ++i) {
    float pv = p[i], gv = widened[i];
    if (s.grad_scale != 1.f) gv = gv * s.grad_scale;
    if (s.grad_decay != 0.f) gv = gv + pv * s.grad_decay;
    if (s.lr_decay != 1.f) pv = pv * s.lr_decay;
    const float mv = std::fma(coeff, gv - m[i], small ? m[i] : gv);
    const float vv = v[i] * s.beta2 + s.beta2_weight * gv * gv;
    m[i] = mv;
    v[i] = vv;
    pv = pv + s.neg_step_size * mv / (std::sqrt(vv) / s.bias_correction2_sqrt + s.eps);
    p[i] = pv;
    widened[i] = pv;
  }
  at::vec::convert(widened, copy, n);
}

}  // namespace

bool adamw_cpu_kernel_available() { return util::cpu_has_avx2_kernels(); }

void adamw_bf16_grad_cpu(float* param, const c10::BFloat16* grad, float* exp_avg, float* exp_avg_sq,
                         c10::BFloat16* copy, int64_t n, const AdamWStep& s) {
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    constexpr int64_t kSpan = 1024;
    float widened[kSpan];
    for (int64_t i = begin; i < end; i += kSpan) {
      const int64_t len = std::min(kSpan, end - i);
      update_span(param + i, grad + i, exp_avg + i, exp_avg_sq + i, copy + i, len, s, widened);
    }
  });
}

}  // namespace titan::trainer::optim::kernels
