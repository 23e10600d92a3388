// The CPU kernels of model/kernels/fused_ops.h: at::vec::Vectorized loops split over the intra-op
// threads with at::parallel_for. Every formula is the one the ATen composite evaluates, in the
// same order where that is possible (RoPE: the same products and sums, bit for bit).
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "model/kernels/fused_ops.h"

namespace titan::model::kernels {
namespace {

using Vec = at::vec::Vectorized<float>;

// Elements per parallel task: ATen's at::internal::GRAIN_SIZE (ATen/TensorIterator.h).
constexpr int64_t kGrainSize = 32768;

// Rows per parallel task: about kGrainSize elements each, so small tensors run
// on the calling thread (the pool's hand-off costs more than the work).
int64_t grain_rows(int64_t row_elems) {
  return std::max<int64_t>(1, kGrainSize / std::max<int64_t>(1, row_elems));
}

float sum_of_products(const float* a, const float* b, int64_t n) {
  Vec acc(0.f);
  int64_t i = 0;
  for (; i + Vec::size() <= n; i += Vec::size()) acc = acc + Vec::loadu(a + i) * Vec::loadu(b + i);
  float s = at::vec::vec_reduce_all<float>([](Vec& x, Vec& y) { return x + y; }, acc);
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Rows of the RMSNorm weight-gradient reduction per partial sum. Fixed (not per thread), so the
// summation order, and therefore gw, is the same whatever the thread count (bitwise determinism
// across runs with different training.num_threads).
constexpr int64_t kGradWeightBlockRows = 32;

}  // namespace

void rms_norm_forward_cpu(const float* x, const float* w, int64_t rows, int64_t dim, float eps,
                          float* y, float* rstd) {
  at::parallel_for(0, rows, grain_rows(dim), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x + r * dim;
      float* yr = y + r * dim;
      // as ATen: rsqrt(mean(x^2) + eps), then (x * rstd) * w
      const float inv = 1.f / std::sqrt(sum_of_products(xr, xr, dim) / static_cast<float>(dim) + eps);
      rstd[r] = inv;
      const Vec vinv(inv);
      int64_t d = 0;
      for (; d + Vec::size() <= dim; d += Vec::size())
        ((Vec::loadu(xr + d) * vinv) * Vec::loadu(w + d)).store(yr + d);
      for (; d < dim; ++d) yr[d] = (xr[d] * inv) * w[d];
    }
  });
}

void rms_norm_backward_cpu(const float* g, const float* x, const float* w, const float* rstd,
                           int64_t rows, int64_t dim, float* gx, float* gw) {
  const int64_t blocks = (rows + kGradWeightBlockRows - 1) / kGradWeightBlockRows;
  std::vector<float> partial(static_cast<size_t>(std::max<int64_t>(blocks, 1) * dim), 0.f);
  at::parallel_for(0, blocks, std::max<int64_t>(1, grain_rows(dim * kGradWeightBlockRows)),
                   [&](int64_t b0, int64_t b1) {
    std::vector<float> gw_row(static_cast<size_t>(dim));
    for (int64_t b = b0; b < b1; ++b) {
      float* acc = partial.data() + b * dim;
      for (int64_t r = b * kGradWeightBlockRows; r < std::min(rows, (b + 1) * kGradWeightBlockRows); ++r) {
        const float* gr = g + r * dim;
        const float* xr = x + r * dim;
        float* gxr = gx + r * dim;
        const float inv = rstd[r];
        // gw_row = g * w (the gradient reaching xhat)
        int64_t d = 0;
        for (; d + Vec::size() <= dim; d += Vec::size())
          (Vec::loadu(gr + d) * Vec::loadu(w + d)).store(gw_row.data() + d);
        for (; d < dim; ++d) gw_row[d] = gr[d] * w[d];
        // gx = inv * g*w - x * inv^3 * sum(g*w*x) / D   (d xhat/dx of xhat = x * rstd(x))
        const float c = inv * inv * inv * sum_of_products(gw_row.data(), xr, dim) / static_cast<float>(dim);
        const Vec vinv(inv), vc(c);
        d = 0;
        for (; d + Vec::size() <= dim; d += Vec::size()) {
          const Vec xv = Vec::loadu(xr + d);
          (vinv * Vec::loadu(gw_row.data() + d) - xv * vc).store(gxr + d);
          (Vec::loadu(acc + d) + Vec::loadu(gr + d) * (xv * vinv)).store(acc + d);
        }
        for (; d < dim; ++d) {
          gxr[d] = inv * gw_row[d] - xr[d] * c;
          acc[d] += gr[d] * (xr[d] * inv);
        }
      }
    }
  });
  // Blocks summed in block order: deterministic (see kGradWeightBlockRows).
  std::fill(gw, gw + dim, 0.f);
  for (int64_t b = 0; b < blocks; ++b) {
    const float* acc = partial.data() + b * dim;
    for (int64_t d = 0; d < dim; ++d) gw[d] += acc[d];
  }
}

void rotary_cpu(const float* x, const float* cos, const float* sin, int64_t outer, int64_t seq,
                int64_t inner, int64_t half, bool inverse, float* y) {
  const int64_t rows = outer * seq * inner;  // one row = one head's [2 * half] vector
  at::parallel_for(0, rows, grain_rows(2 * half), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t s = (r / inner) % seq;
      const float* xr = x + r * 2 * half;
      float* yr = y + r * 2 * half;
      const float* c = cos + s * half;
      const float* sn = sin + s * half;
      int64_t i = 0;
      for (; i + Vec::size() <= half; i += Vec::size()) {
        // x holds (even, odd) pairs interleaved: two loads give Vec::size() pairs.
        auto [even, odd] = at::vec::deinterleave2(Vec::loadu(xr + 2 * i), Vec::loadu(xr + 2 * i + Vec::size()));
        const Vec cv = Vec::loadu(c + i), sv = Vec::loadu(sn + i);
        // forward as the composite: (e*cos - o*sin, e*sin + o*cos); inverse: its transpose,
        // (e*cos + o*sin, o*cos - e*sin), as autograd's backward of the composite sums it.
        const Vec ye = inverse ? even * cv + odd * sv : even * cv - odd * sv;
        const Vec yo = inverse ? odd * cv - even * sv : even * sv + odd * cv;
        auto [lo, hi] = at::vec::interleave2(ye, yo);
        lo.store(yr + 2 * i);
        hi.store(yr + 2 * i + Vec::size());
      }
      for (; i < half; ++i) {
        const float e = xr[2 * i], o = xr[2 * i + 1];
        yr[2 * i] = inverse ? e * c[i] + o * sn[i] : e * c[i] - o * sn[i];
        yr[2 * i + 1] = inverse ? o * c[i] - e * sn[i] : e * sn[i] + o * c[i];
      }
    }
  });
}

void swiglu_forward_cpu(const float* gate, const float* up, int64_t n, float* y) {
  at::parallel_for(0, n, kGrainSize, [&](int64_t begin, int64_t end) {
    const Vec one(1.f);
    int64_t i = begin;
    for (; i + Vec::size() <= end; i += Vec::size()) {
      const Vec g = Vec::loadu(gate + i);
      ((g / (one + g.neg().exp())) * Vec::loadu(up + i)).store(y + i);  // ATen's silu: x / (1 + e^-x)
    }
    for (; i < end; ++i) y[i] = (gate[i] / (1.f + std::exp(-gate[i]))) * up[i];
  });
}

void swiglu_backward_cpu(const float* dy, const float* gate, const float* up, int64_t n,
                         float* dgate, float* dup) {
  at::parallel_for(0, n, kGrainSize, [&](int64_t begin, int64_t end) {
    const Vec one(1.f);
    int64_t i = begin;
    for (; i + Vec::size() <= end; i += Vec::size()) {
      const Vec g = Vec::loadu(gate + i), d = Vec::loadu(dy + i);
      const Vec e = one + g.neg().exp();
      const Vec sig = one / e;
      // d silu(g) / dg = sig * (1 + g * (1 - sig)), as ATen's silu_backward
      ((d * Vec::loadu(up + i)) * (sig * (one + g * (one - sig)))).store(dgate + i);
      (d * (g / e)).store(dup + i);
    }
    for (; i < end; ++i) {
      const float g = gate[i], e = 1.f + std::exp(-g), sig = 1.f / e;
      dgate[i] = (dy[i] * up[i]) * (sig * (1.f + g * (1.f - sig)));
      dup[i] = dy[i] * (g / e);
    }
  });
}

}  // namespace titan::model::kernels
