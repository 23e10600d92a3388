// The CPU fused casts of float8/kernels/fused_cast.h: amax, cast and dequantize as single
// vectorized, multi-threaded passes, bit for bit the scaling.h composites.
//
// Why: the composite cast is abs (a temporary), amax, x * scale (a temporary), clamp (another)
// and the conversion, over slices of 64 Ki elements (Note [Chunked CPU casts]): about 15 ATen
// calls per slice, and emulated float8 on the CPU spent most of its extra time there and in the
// GEMM's dequantization (to float32, then divide: two passes and a temporary).
//
// Exactness: |x| and max are exact in any order; the cast is the same float32 product, the same
// NaN-propagating clamp and c10's round-to-nearest-even conversion as Tensor::to(); the
// dequantization is the same float32 value divided by the same scale. Scales are still computed
// by scale_from_amax (ATen, float64 division, on the tiny amax tensor).
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "float8/kernels/fused_cast.h"
#include "model/checkpoint_ops.h"
#include "model/scope.h"

namespace titan::float8 {
namespace {

using Vec = at::vec::Vectorized<float>;

// Elements per parallel task: ATen's at::internal::GRAIN_SIZE (ATen/TensorIterator.h).
constexpr int64_t kGrainSize = 32768;

int64_t grain_rows(int64_t row_elems) {
  return std::max<int64_t>(1, kGrainSize / std::max<int64_t>(1, row_elems));
}

// max for non-negative values that propagates NaN like torch.amax.
inline float nan_max(float a, float b) { return (a > b || std::isnan(a)) ? a : b; }

template <typename T>
float row_abs_max(const T* p, int64_t n) {
  float m = 0.f;
  int64_t i = 0;
  if constexpr (std::is_same_v<T, float>) {
    Vec acc(0.f);
    for (; i + Vec::size() <= n; i += Vec::size()) acc = at::vec::maximum(acc, Vec::loadu(p + i).abs());
    m = at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return at::vec::maximum(a, b); }, acc);
  }
  for (; i < n; ++i) m = nan_max(std::abs(static_cast<float>(p[i])), m);
  return m;
}

// [rows, cols] view of x's elements for a per-row (last dim) or per-element-chunk reduction.
template <typename T>
void amax_rows(const T* x, int64_t rows, int64_t cols, float* out) {
  at::parallel_for(0, rows, grain_rows(cols), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) out[r] = row_abs_max(x + r * cols, cols);
  });
}

template <typename T>
void amax_cols(const T* x, int64_t rows, int64_t cols, float* out) {
  constexpr int64_t kColBlock = 256;  // columns per task: a row segment of 1 KiB (float)
  const int64_t blocks = (cols + kColBlock - 1) / kColBlock;
  at::parallel_for(0, blocks, std::max<int64_t>(1, grain_rows(rows * kColBlock)), [&](int64_t b, int64_t e) {
    for (int64_t blk = b; blk < e; ++blk) {
      const int64_t c0 = blk * kColBlock, c1 = std::min(cols, c0 + kColBlock);
      float* o = out + c0;
      std::fill(o, o + (c1 - c0), 0.f);
      for (int64_t r = 0; r < rows; ++r) {
        const T* p = x + r * cols;
        for (int64_t c = c0; c < c1; ++c) o[c - c0] = nan_max(std::abs(static_cast<float>(p[c])), o[c - c0]);
      }
    }
  });
}

// data = D(clamp(float(x) * scale, -m, m)); scale(r, c) = scale[r * rs + c * cs].
template <typename T, typename D>
void cast_2d(const T* x, int64_t rows, int64_t cols, const float* scale, int64_t rs, int64_t cs, float m, D* out) {
  at::parallel_for(0, rows, grain_rows(cols), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const T* p = x + r * cols;
      D* o = out + r * cols;
      const float* sr = scale + r * rs;
      for (int64_t c = 0; c < cols; ++c) {
        float v = static_cast<float>(p[c]) * sr[c * cs];
        v = std::isnan(v) ? v : std::min(std::max(v, -m), m);  // at::clamp keeps NaN
        o[c] = static_cast<D>(v);
      }
    }
  });
}

bool supported_source(const at::Tensor& x) {
  return x.device().is_cpu() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16);
}

template <typename F>
void dispatch_source(at::ScalarType t, F&& f) {
  if (t == at::kFloat) f(float{});
  else f(c10::BFloat16{});
}

template <typename F>
void dispatch_float8(at::ScalarType t, F&& f) {
  if (t == at::kFloat8_e4m3fn) f(c10::Float8_e4m3fn{});
  else f(c10::Float8_e5m2{});
}

// fp8 byte -> float32: exact, so a table of the 256 values is the conversion.
template <typename D>
const std::array<float, 256>& float8_values() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[i] = static_cast<float>(D(static_cast<uint8_t>(i), D::from_bits()));
    return t;
  }();
  return table;
}

}  // namespace

at::Tensor fused_amax_cpu(const at::Tensor& x_in, ScalingGranularity granularity, int64_t axis) {
  const at::Tensor x = x_in.contiguous();
  const bool axiswise = granularity == ScalingGranularity::Axiswise;
  const int64_t cols = axiswise ? x.size(axis) : std::max<int64_t>(1, std::min<int64_t>(x.numel(), 4096));
  std::vector<int64_t> shape = x.sizes().vec();
  at::Tensor out;
  dispatch_source(x.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    const T* p = static_cast<const T*>(x.data_ptr());
    if (!axiswise) {
      // Tensorwise: maxima of fixed 4 Ki-element rows (the tail row shorter), then their max.
      const int64_t n = x.numel(), rows = (n + cols - 1) / cols;
      std::vector<float> part(static_cast<size_t>(rows), 0.f);
      at::parallel_for(0, rows, grain_rows(cols), [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) part[r] = row_abs_max(p + r * cols, std::min(cols, n - r * cols));
      });
      float m = 0.f;
      for (float v : part) m = nan_max(v, m);
      out = at::empty({}, x.options().dtype(at::kFloat)).fill_(m);
      return;
    }
    shape[axis] = 1;
    out = at::empty(shape, x.options().dtype(at::kFloat));
    if (axis == x.dim() - 1) amax_rows(p, x.numel() / cols, cols, out.data_ptr<float>());
    else amax_cols(p, x.size(0), x.numel() / x.size(0), out.data_ptr<float>());  // 2-D, axis 0
  });
  return out;
}

at::Tensor fused_cast_cpu(const at::Tensor& x_in, const at::Tensor& scale_in, at::ScalarType dtype) {
  const at::Tensor x = x_in.contiguous();
  const at::Tensor scale = scale_in.contiguous();
  const float m = static_cast<float>(float8_max(dtype));
  at::Tensor out = at::empty(x.sizes(), x.options().dtype(dtype));
  const int64_t cols = x.dim() == 0 ? 1 : x.size(-1), rows = cols == 0 ? 0 : x.numel() / cols;
  // Scale strides over the [rows, cols] view: tensorwise (0, 0), per row (1, 0), per column (0, 1).
  const bool per_row = scale.dim() > 0 && scale.size(-1) == 1 && scale.numel() == rows && rows > 1;
  const bool per_col = scale.dim() > 0 && scale.numel() == cols && scale.size(-1) == cols && cols > 1;
  const int64_t rs = per_row ? 1 : 0, cs = per_col ? 1 : 0;
  dispatch_source(x.scalar_type(), [&](auto src) {
    using T = decltype(src);
    dispatch_float8(dtype, [&](auto dst) {
      using D = decltype(dst);
      cast_2d<T, D>(static_cast<const T*>(x.data_ptr()), rows, cols, scale.data_ptr<float>(), rs, cs, m, static_cast<D*>(out.data_ptr()));
    });
  });
  return out;
}

std::optional<Float8Tensor> try_fused_to_float8_cpu(const at::Tensor& x, const CastConfig& config,
                                                    int64_t axis_dim, bool round_scales_to_power_of_2) {
  if (!fused_casts_enabled() || !supported_source(x) || x.dim() < 1 || x.numel() == 0) return std::nullopt;
  const bool axiswise = config.granularity == ScalingGranularity::Axiswise;
  const int64_t axis = axiswise ? c10::maybe_wrap_dim(axis_dim, x.dim()) : -1;
  if (axiswise && axis != x.dim() - 1 && !(axis == 0 && x.dim() == 2)) return std::nullopt;
  float8_max(config.dtype);  // a non-float8 dtype: the composite's error message
  // The amax through the op layer, as amax() (per-op AC keeps it; there is no abs to keep).
  at::Tensor a = titan::model::checkpointable_op("amax", [&] { return fused_amax_cpu(x, config.granularity, axis); });
  at::Tensor scale = scale_from_amax(a, config.dtype, round_scales_to_power_of_2);
  titan::model::NamedScope scope("float8 cast", titan::model::MemoryCategory::kFloat8Casts);
  // Per-column scales (1, C) of 2-D data: the cast kernel reads them per column.
  Float8Tensor t{fused_cast_cpu(x, scale, config.dtype), scale, x.scalar_type()};
  check_float8_tensor(t, "to_float8");
  return t;
}

at::Tensor dequantize_to_float_cpu(const at::Tensor& data, const at::Tensor& scale) {
  TORCH_CHECK(data.dim() == 2 && data.device().is_cpu(), "dequantize_to_float_cpu: needs 2-D CPU data, got ",
              data.sizes());
  if (data.stride(1) != 1 && data.stride(0) == 1 && data.size(0) > 1)  // column-major: dequantize as stored
    return dequantize_to_float_cpu(data.t(), scale.dim() == 0 ? scale : scale.t()).t();
  const at::Tensor d = data.stride(1) == 1 ? data : data.contiguous();
  const int64_t rows = d.size(0), cols = d.size(1), ld = d.stride(0);
  at::Tensor out = at::empty({rows, cols}, d.options().dtype(at::kFloat));
  const at::Tensor s = scale.dim() == 0 ? scale.reshape({1, 1}).expand({rows, cols}) : scale.expand({rows, cols});
  const float* sp = s.data_ptr<float>();
  const int64_t ss0 = s.stride(0), ss1 = s.stride(1);
  dispatch_float8(d.scalar_type(), [&](auto tag) {
    using D = decltype(tag);
    const std::array<float, 256>& value = float8_values<D>();
    const uint8_t* src = reinterpret_cast<const uint8_t*>(d.data_ptr());
    float* o = out.data_ptr<float>();
    at::parallel_for(0, rows, grain_rows(cols), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const uint8_t* p = src + r * ld;
        float* orow = o + r * cols;
        const float* sr = sp + r * ss0;
        if (ss1 == 0) {
          const float sv = sr[0];
          for (int64_t c = 0; c < cols; ++c) orow[c] = value[p[c]] / sv;
        } else {
          for (int64_t c = 0; c < cols; ++c) orow[c] = value[p[c]] / sr[c * ss1];
        }
      }
    });
  });
  return out;
}

}  // namespace titan::float8
