// The CPU kernels of model/kernels/fused_ops.h: at::vec::Vectorized loops split over the intra-op
// threads with at::parallel_for. Every formula is the one the ATen composite evaluates, in the
// same order where that is possible (RoPE: the same products and sums, bit for bit). Each
// kernel is one float32 row (or span) function that both dtypes run (bfloat16 below).
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

// ---- bfloat16: every row (or span) converted to float32, the float32 row code run on it, the
// result rounded to nearest even. So a bf16 kernel's output is the float32 kernel's output on
// the upcast inputs, rounded (what tests/test_fused_ops.cpp checks bit for bit), and every
// accumulation is float32.

void to_float(const at::BFloat16* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);  // a shift: vectorizes
}
void from_float(const float* src, at::BFloat16* dst, int64_t n) { at::vec::convert(src, dst, n); }

// Elements per converted span of the pointwise kernels (a multiple of every Vec::size()).
constexpr int64_t kSpan = 1024;

// ---- the rows and spans both dtypes run

float rms_norm_row(const float* xr, const float* w, int64_t dim, float eps, float* yr) {
  // as ATen: rsqrt(mean(x^2) + eps), then (x * rstd) * w
  const float inv = 1.f / std::sqrt(sum_of_products(xr, xr, dim) / static_cast<float>(dim) + eps);
  const Vec vinv(inv);
  int64_t d = 0;
  for (; d + Vec::size() <= dim; d += Vec::size()) ((Vec::loadu(xr + d) * vinv) * Vec::loadu(w + d)).store(yr + d);
  for (; d < dim; ++d) yr[d] = (xr[d] * inv) * w[d];
  return inv;
}

// One row of the backward: gxr, and the row's share of gw added to acc. gw_row: scratch [dim].
void rms_norm_backward_row(const float* gr, const float* xr, const float* w, float inv, int64_t dim, float* gw_row,
                           float* gxr, float* acc) {
  // gw_row = g * w (the gradient reaching xhat)
  int64_t d = 0;
  for (; d + Vec::size() <= dim; d += Vec::size()) (Vec::loadu(gr + d) * Vec::loadu(w + d)).store(gw_row + d);
  for (; d < dim; ++d) gw_row[d] = gr[d] * w[d];
  // gx = inv * g*w - x * inv^3 * sum(g*w*x) / D   (d xhat/dx of xhat = x * rstd(x))
  const float c = inv * inv * inv * sum_of_products(gw_row, xr, dim) / static_cast<float>(dim);
  const Vec vinv(inv), vc(c);
  d = 0;
  for (; d + Vec::size() <= dim; d += Vec::size()) {
    const Vec xv = Vec::loadu(xr + d);
    (vinv * Vec::loadu(gw_row + d) - xv * vc).store(gxr + d);
    (Vec::loadu(acc + d) + Vec::loadu(gr + d) * (xv * vinv)).store(acc + d);
  }
  for (; d < dim; ++d) {
    gxr[d] = inv * gw_row[d] - xr[d] * c;
    acc[d] += gr[d] * (xr[d] * inv);
  }
}

void rotary_row(const float* xr, const float* c, const float* sn, int64_t half, bool inverse, float* yr) {
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

void swiglu_forward_span(const float* gate, const float* up, int64_t n, float* y) {
  const Vec one(1.f);
  int64_t i = 0;
  for (; i + Vec::size() <= n; i += Vec::size()) {
    const Vec g = Vec::loadu(gate + i);
    ((g / (one + g.neg().exp())) * Vec::loadu(up + i)).store(y + i);  // ATen's silu: x / (1 + e^-x)
  }
  for (; i < n; ++i) y[i] = (gate[i] / (1.f + std::exp(-gate[i]))) * up[i];
}

void swiglu_backward_span(const float* dy, const float* gate, const float* up, int64_t n, float* dgate, float* dup) {
  const Vec one(1.f);
  int64_t i = 0;
  for (; i + Vec::size() <= n; i += Vec::size()) {
    const Vec g = Vec::loadu(gate + i), d = Vec::loadu(dy + i);
    const Vec e = one + g.neg().exp();
    const Vec sig = one / e;
    // d silu(g) / dg = sig * (1 + g * (1 - sig)), as ATen's silu_backward
    ((d * Vec::loadu(up + i)) * (sig * (one + g * (one - sig)))).store(dgate + i);
    (d * (g / e)).store(dup + i);
  }
  for (; i < n; ++i) {
    const float g = gate[i], e = 1.f + std::exp(-g), sig = 1.f / e;
    dgate[i] = (dy[i] * up[i]) * (sig * (1.f + g * (1.f - sig)));
    dup[i] = dy[i] * (g / e);
  }
}

// Loads a [rows, dim] row of either dtype as float32: float32 rows are used in place.
struct RowReader {
  std::vector<float> buffer;
  explicit RowReader(int64_t dim) : buffer(static_cast<size_t>(dim)) {}
  const float* operator()(const float* row, int64_t) { return row; }
  const float* operator()(const at::BFloat16* row, int64_t n) {
    to_float(row, buffer.data(), n);
    return buffer.data();
  }
};
// Where a row's float32 result goes: in place for float32, a buffer then rounded for bf16.
struct RowWriter {
  std::vector<float> buffer;
  explicit RowWriter(int64_t dim) : buffer(static_cast<size_t>(dim)) {}
  float* target(float* row) { return row; }
  float* target(at::BFloat16*) { return buffer.data(); }
  void commit(float*, int64_t) {}
  void commit(at::BFloat16* row, int64_t n) { from_float(buffer.data(), row, n); }
};

template <typename T>
void rms_norm_forward(const T* x, const T* w_in, int64_t rows, int64_t dim, float eps, T* y, float* rstd) {
  RowReader weight(dim);
  const float* w = weight(w_in, dim);
  at::parallel_for(0, rows, grain_rows(dim), [&](int64_t begin, int64_t end) {
    RowReader read(dim);
    RowWriter write(dim);
    for (int64_t r = begin; r < end; ++r) {
      rstd[r] = rms_norm_row(read(x + r * dim, dim), w, dim, eps, write.target(y + r * dim));
      write.commit(y + r * dim, dim);
    }
  });
}

template <typename T>
void rms_norm_backward(const T* g, const T* x, const T* w_in, const float* rstd, int64_t rows, int64_t dim, T* gx,
                       T* gw) {
  RowReader weight(dim);
  const float* w = weight(w_in, dim);
  const int64_t blocks = (rows + kGradWeightBlockRows - 1) / kGradWeightBlockRows;
  std::vector<float> partial(static_cast<size_t>(std::max<int64_t>(blocks, 1) * dim), 0.f);
  at::parallel_for(0, blocks, std::max<int64_t>(1, grain_rows(dim * kGradWeightBlockRows)),
                   [&](int64_t b0, int64_t b1) {
    std::vector<float> gw_row(static_cast<size_t>(dim));
    RowReader read_g(dim), read_x(dim);
    RowWriter write(dim);
    for (int64_t b = b0; b < b1; ++b) {
      float* acc = partial.data() + b * dim;
      for (int64_t r = b * kGradWeightBlockRows; r < std::min(rows, (b + 1) * kGradWeightBlockRows); ++r) {
        rms_norm_backward_row(read_g(g + r * dim, dim), read_x(x + r * dim, dim), w, rstd[r], dim, gw_row.data(),
                              write.target(gx + r * dim), acc);
        write.commit(gx + r * dim, dim);
      }
    }
  });
  // Blocks summed in block order: deterministic (see kGradWeightBlockRows).
  RowWriter write(dim);
  float* sum = write.target(gw);
  std::fill(sum, sum + dim, 0.f);
  for (int64_t b = 0; b < blocks; ++b) {
    const float* acc = partial.data() + b * dim;
    for (int64_t d = 0; d < dim; ++d) sum[d] += acc[d];
  }
  write.commit(gw, dim);
}

template <typename T>
void rotary(const T* x, const float* cos, const float* sin, int64_t outer, int64_t seq, int64_t inner, int64_t half,
            bool inverse, T* y) {
  const int64_t rows = outer * seq * inner;  // one row = one head's [2 * half] vector
  at::parallel_for(0, rows, grain_rows(2 * half), [&](int64_t begin, int64_t end) {
    RowReader read(2 * half);
    RowWriter write(2 * half);
    for (int64_t r = begin; r < end; ++r) {
      const int64_t s = (r / inner) % seq;
      rotary_row(read(x + r * 2 * half, 2 * half), cos + s * half, sin + s * half, half, inverse,
                 write.target(y + r * 2 * half));
      write.commit(y + r * 2 * half, 2 * half);
    }
  });
}

// The pointwise kernels over [begin, end) in spans of kSpan (converted per span for bf16).
template <typename Body>
void by_spans(int64_t n, const Body& body) {
  at::parallel_for(0, n, kGrainSize, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; i += kSpan) body(i, std::min(kSpan, end - i));
  });
}

template <typename T>
void swiglu_forward(const T* gate, const T* up, int64_t n, T* y) {
  by_spans(n, [&](int64_t i, int64_t len) {
    thread_local RowReader read_g(kSpan), read_u(kSpan);
    thread_local RowWriter write(kSpan);
    swiglu_forward_span(read_g(gate + i, len), read_u(up + i, len), len, write.target(y + i));
    write.commit(y + i, len);
  });
}

template <typename T>
void swiglu_backward(const T* dy, const T* gate, const T* up, int64_t n, T* dgate, T* dup) {
  by_spans(n, [&](int64_t i, int64_t len) {
    thread_local RowReader read_d(kSpan), read_g(kSpan), read_u(kSpan);
    thread_local RowWriter write_g(kSpan), write_u(kSpan);
    swiglu_backward_span(read_d(dy + i, len), read_g(gate + i, len), read_u(up + i, len), len,
                         write_g.target(dgate + i), write_u.target(dup + i));
    write_g.commit(dgate + i, len);
    write_u.commit(dup + i, len);
  });
}

}  // namespace

double sum_of_squares_cpu(const at::BFloat16* x, int64_t n) {
  constexpr int64_t kBlock = 4096;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<float> partial(static_cast<size_t>(blocks), 0.f);
  at::parallel_for(0, blocks, std::max<int64_t>(1, kGrainSize / kBlock), [&](int64_t b0, int64_t b1) {
    float widened[kSpan];
    for (int64_t b = b0; b < b1; ++b) {
      float sum = 0;
      for (int64_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); i += kSpan) {
        const int64_t len = std::min(kSpan, std::min(n, (b + 1) * kBlock) - i);
        to_float(x + i, widened, len);
        sum += sum_of_products(widened, widened, len);
      }
      partial[static_cast<size_t>(b)] = sum;
    }
  });
  double total = 0;
  for (float p : partial) total += static_cast<double>(p);
  return total;
}

#define TITAN_FUSED_KERNELS(T)                                                                                   \
  void rms_norm_forward_cpu(const T* x, const T* w, int64_t rows, int64_t dim, float eps, T* y, float* rstd) {  \
    rms_norm_forward(x, w, rows, dim, eps, y, rstd);                                                            \
  }                                                                                                             \
  void rms_norm_backward_cpu(const T* g, const T* x, const T* w, const float* rstd, int64_t rows, int64_t dim,   \
                             T* gx, T* gw) {                                                                    \
    rms_norm_backward(g, x, w, rstd, rows, dim, gx, gw);                                                        \
  }                                                                                                             \
  void rotary_cpu(const T* x, const float* cos, const float* sin, int64_t outer, int64_t seq, int64_t inner,     \
                  int64_t half, bool inverse, T* y) {                                                           \
    rotary(x, cos, sin, outer, seq, inner, half, inverse, y);                                                   \
  }                                                                                                             \
  void swiglu_forward_cpu(const T* gate, const T* up, int64_t n, T* y) { swiglu_forward(gate, up, n, y); }      \
  void swiglu_backward_cpu(const T* dy, const T* gate, const T* up, int64_t n, T* dgate, T* dup) {              \
    swiglu_backward(dy, gate, up, n, dgate, dup);                                                               \
  }
TITAN_FUSED_KERNELS(float)
TITAN_FUSED_KERNELS(at::BFloat16)
#undef TITAN_FUSED_KERNELS

}  // namespace titan::model::kernels
