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
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#include "float8/kernels/fused_cast.h"
#include "model/activation_checkpoint_ops.h"
#include "model/scope.h"

namespace titan::float8 {
namespace {

// Elements per parallel task: ATen's at::internal::GRAIN_SIZE (ATen/TensorIterator.h).
constexpr int64_t kGrainSize = 32768;

int64_t grain_rows(int64_t row_elems) {
  return std::max<int64_t>(1, kGrainSize / std::max<int64_t>(1, row_elems));
}

// max for non-negative values that propagates NaN like torch.amax.
inline float nan_max(float a, float b) { return (a > b || std::isnan(a)) ? a : b; }

// 8 source elements as float32.
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const c10::BFloat16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));  // bf16 = float's high half
}

// nan_max(|v|, cur) per lane.
inline __m256 abs_max8(__m256 v, __m256 cur) {
  const __m256 a = _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)));
  const __m256 take = _mm256_or_ps(_mm256_cmp_ps(a, cur, _CMP_GT_OQ), _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
  return _mm256_blendv_ps(cur, a, take);
}

template <typename T>
float row_abs_max(const T* p, int64_t n) {
  int64_t i = 0;
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) acc = abs_max8(load8(p + i), acc);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  float m = 0.f;
  for (float v : lanes) m = nan_max(v, m);
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
        int64_t c = c0;
        for (; c + 8 <= c1; c += 8)  // the same choice per lane as the scalar loop: the same bits
          _mm256_storeu_ps(o + (c - c0), abs_max8(load8(p + c), _mm256_loadu_ps(o + (c - c0))));
        for (; c < c1; ++c) o[c - c0] = nan_max(std::abs(static_cast<float>(p[c])), o[c - c0]);
      }
    }
  });
}

// Note [Vectorized float8 conversion]: c10's float32 -> float8 conversion (torch/headeronly/
// util/Float8_e4m3fn.h, Float8_e5m2.h) is integer arithmetic on the float's bits, so it runs 8
// lanes at a time unchanged: with the magnitude's bits a (sign removed), a >= the first value
// past the format's range gives NaN (e4m3fn 0x7f; e5m2 0x7f for NaN, 0x7c for inf); a below the
// smallest normal is rounded by a float32 addition of a magic number (denorm_mask, the FPU's
// round-to-nearest-even places the subnormal's bits); otherwise the exponent is rebiased and
// round-to-nearest-even is "+ half - 1 + (kept mantissa's lowest bit)" before the shift. The
// result is the low byte, OR the sign. Tested against the scalar conversion over every float32
// whose low 16 bits are one of 8 patterns (tests/test_float8.cpp).
// The constants follow from the format's mantissa bits M and exponent bias B (float32: 23 and
// 127); only the first value past the range is given per format (c10's: e4m3fn 480, e5m2 65536).
template <int M, int B, uint32_t FirstOutOfRange>
struct Float8Bits {
  static constexpr int kMantissaShift = 23 - M;
  static constexpr uint32_t kFirstOutOfRange = FirstOutOfRange;
  static constexpr uint32_t kDenormMask = static_cast<uint32_t>((127 - B) + (23 - M) + 1) << 23;
  static constexpr uint32_t kMinNormal = static_cast<uint32_t>(127 - B + 1) << 23;
  static constexpr uint32_t kRebias = (static_cast<uint32_t>(B - 127) << 23) + ((1u << (22 - M)) - 1);
};
using E4m3Bits = Float8Bits<3, 7, 1087u << 20>;  // 480.0f
using E5m2Bits = Float8Bits<2, 15, 143u << 23>;  // 65536.0f
static_assert(E4m3Bits::kDenormMask == 141u << 23 && E4m3Bits::kMinNormal == 121u << 23 &&
              E4m3Bits::kRebias == ((7u - 127u) << 23) + 0x7FFFFu);  // c10's literals
static_assert(E5m2Bits::kDenormMask == 134u << 23 && E5m2Bits::kMinNormal == 113u << 23 &&
              E5m2Bits::kRebias == ((15u - 127u) << 23) + 0xFFFFFu);

template <typename D>
using BitsOf = std::conditional_t<std::is_same_v<D, c10::Float8_e4m3fn>, E4m3Bits, E5m2Bits>;

// 8 float32 -> 8 float8 bytes, each equal to static_cast<D>(v) (Note [Vectorized float8 conversion]).
template <typename D>
inline void convert8(__m256 v, uint8_t* out) {
  using B = BitsOf<D>;
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i sign = _mm256_and_si256(bits, _mm256_set1_epi32(static_cast<int>(0x80000000u)));
  const __m256i a = _mm256_xor_si256(bits, sign);  // < 2^31: signed compares are unsigned ones
  const __m256i out_of_range = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(static_cast<int>(B::kFirstOutOfRange - 1)));
  const __m256i subnormal = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(B::kMinNormal)), a);
  const __m256i denorm = _mm256_set1_epi32(static_cast<int>(B::kDenormMask));
  const __m256i sub = _mm256_sub_epi32(
      _mm256_castps_si256(_mm256_add_ps(_mm256_castsi256_ps(a), _mm256_castsi256_ps(denorm))), denorm);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(a, B::kMantissaShift), _mm256_set1_epi32(1));
  const __m256i normal = _mm256_srli_epi32(
      _mm256_add_epi32(_mm256_add_epi32(a, _mm256_set1_epi32(static_cast<int>(B::kRebias))), odd), B::kMantissaShift);
  __m256i r = _mm256_blendv_epi8(normal, sub, subnormal);
  __m256i nan_or_inf = _mm256_set1_epi32(0x7f);
  if constexpr (std::is_same_v<D, c10::Float8_e5m2>) {  // inf stays inf: 0x7c
    const __m256i is_nan = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(static_cast<int>(255u << 23)));
    nan_or_inf = _mm256_blendv_epi8(_mm256_set1_epi32(0x7c), nan_or_inf, is_nan);
  }
  r = _mm256_blendv_epi8(r, nan_or_inf, out_of_range);
  r = _mm256_and_si256(_mm256_or_si256(r, _mm256_srli_epi32(sign, 24)), _mm256_set1_epi32(0xff));
  // The low byte of each lane: bytes 0, 4, 8, 12 of each 128-bit half, then the two halves' words.
  const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                        0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i packed = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(r, pick), _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(packed));
}

// clamp(v, -m, m) keeping NaN, as at::clamp.
inline __m256 clamp8(__m256 v, __m256 lo, __m256 hi) {
  const __m256 c = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
  return _mm256_blendv_ps(c, v, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
}

// data = D(clamp(float(x) * scale, -m, m)); scale(r, c) = scale[r * rs + c * cs].
template <typename T, typename D>
void cast_2d(const T* x, int64_t rows, int64_t cols, const float* scale, int64_t rs, int64_t cs, float m, D* out) {
  at::parallel_for(0, rows, grain_rows(cols), [&](int64_t b, int64_t e) {
    const __m256 lo = _mm256_set1_ps(-m), hi = _mm256_set1_ps(m);
    for (int64_t r = b; r < e; ++r) {
      const T* p = x + r * cols;
      D* o = out + r * cols;
      const float* sr = scale + r * rs;
      int64_t c = 0;
      const __m256 row_scale = _mm256_set1_ps(sr[0]);
      for (; c + 8 <= cols; c += 8) {
        const __m256 s = cs == 0 ? row_scale : _mm256_loadu_ps(sr + c);
        convert8<D>(clamp8(_mm256_mul_ps(load8(p + c), s), lo, hi), reinterpret_cast<uint8_t*>(o + c));
      }
      for (; c < cols; ++c) {
        float v = static_cast<float>(p[c]) * sr[c * cs];
        v = std::isnan(v) ? v : std::min(std::max(v, -m), m);  // at::clamp keeps NaN
        o[c] = static_cast<D>(v);
      }
    }
  });
}

// torchao's f32 -> e2m1 steps (float8/block_scaled.cpp's float_to_e2m1_codes) on 8 lanes: the
// denormal candidate by a float32 addition of 2^22 (the FPU rounds to a multiple of 0.5), the
// normal one rebiased with round-half-to-even, >= 6 (and inf) saturating to 7, NaN taking the
// normal path as there (it fails both comparisons); the low byte, OR the sign into bit 3.
inline __m256i e2m1_codes8(__m256 v) {
  constexpr int32_t kDenormMask = 149 << 23;                       // 2^22 as float32 bits
  constexpr int32_t kRebias = -(126 << 23) + ((1 << 21) - 1);      // (1 - 127) << 23, + half - 1
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i sign = _mm256_and_si256(bits, _mm256_set1_epi32(static_cast<int>(0x80000000u)));
  const __m256i a = _mm256_xor_si256(bits, sign);
  const __m256 magnitude = _mm256_castsi256_ps(a);
  const __m256i denorm = _mm256_set1_epi32(kDenormMask);
  const __m256i sub = _mm256_sub_epi32(_mm256_castps_si256(_mm256_add_ps(magnitude, _mm256_castsi256_ps(denorm))), denorm);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(a, 22), _mm256_set1_epi32(1));
  // Arithmetic shift as the int32 tensor form's; only lanes >= 1.0 (positive sums) keep it.
  const __m256i normal = _mm256_srai_epi32(_mm256_add_epi32(_mm256_add_epi32(a, _mm256_set1_epi32(kRebias)), odd), 22);
  const __m256 below_one = _mm256_cmp_ps(magnitude, _mm256_set1_ps(1.0f), _CMP_LT_OQ);
  const __m256 saturates = _mm256_cmp_ps(magnitude, _mm256_set1_ps(6.0f), _CMP_GE_OQ);
  __m256i code = _mm256_blendv_epi8(normal, sub, _mm256_castps_si256(below_one));
  code = _mm256_blendv_epi8(code, _mm256_set1_epi32(7), _mm256_castps_si256(saturates));
  code = _mm256_and_si256(code, _mm256_set1_epi32(0xff));
  return _mm256_or_si256(code, _mm256_and_si256(_mm256_srai_epi32(sign, 28), _mm256_set1_epi32(0x8)));
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

at::Tensor e2m1_codes_cpu(const at::Tensor& x_in) {
  TORCH_CHECK(x_in.device().is_cpu() && x_in.scalar_type() == at::kFloat, "e2m1_codes_cpu: needs float32 CPU data");
  const at::Tensor x = x_in.contiguous();
  at::Tensor out = at::empty(x.sizes(), x.options().dtype(at::kByte));
  const float* src = x.data_ptr<float>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  const int64_t n = x.numel();
  at::parallel_for(0, (n + 7) / 8, kGrainSize / 8, [&](int64_t b, int64_t e) {
    alignas(32) int32_t lanes[8];
    alignas(32) float tail[8];
    for (int64_t g = b; g < e; ++g) {
      const int64_t i = g * 8, k = std::min<int64_t>(8, n - i);
      __m256 v;
      if (k == 8) {
        v = _mm256_loadu_ps(src + i);
      } else {
        std::fill(tail, tail + 8, 0.f);
        std::copy(src + i, src + i + k, tail);
        v = _mm256_load_ps(tail);
      }
      _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), e2m1_codes8(v));
      for (int64_t j = 0; j < k; ++j) dst[i + j] = static_cast<uint8_t>(lanes[j]);
    }
  });
  return out;
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
        // The table lookup as a gather, then the same float32 division.
        int64_t c = 0;
        const __m256 row_scale = _mm256_set1_ps(sr[0]);
        if (ss1 == 0 || ss1 == 1) {
          for (; c + 8 <= cols; c += 8) {
            const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + c));
            const __m256 v = _mm256_i32gather_ps(value.data(), _mm256_cvtepu8_epi32(bytes), 4);
            _mm256_storeu_ps(orow + c, _mm256_div_ps(v, ss1 == 0 ? row_scale : _mm256_loadu_ps(sr + c)));
          }
        }
        for (; c < cols; ++c) orow[c] = value[p[c]] / sr[c * ss1];
      }
    });
  });
  return out;
}

}  // namespace titan::float8
