#include "float8/scaling.h"

#include <ATen/ops/abs.h>
#include <ATen/ops/amax.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/clamp.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/exp2.h>
#include <ATen/ops/floor.h>
#include <ATen/ops/log2.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/stack.h>

#include <algorithm>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "float8/kernels/fused_cast.h"
#include "model/activation_checkpoint_ops.h"
#include "model/scope.h"
#include "util/cpu_features.h"

#include <c10/util/StringUtil.h>

namespace titan::float8 {

namespace {

bool is_float8(at::ScalarType t) { return t == at::kFloat8_e4m3fn || t == at::kFloat8_e5m2; }

}  // namespace

double float8_max(at::ScalarType float8_dtype) {
  if (float8_dtype == at::kFloat8_e4m3fn) return 448.0;
  if (float8_dtype == at::kFloat8_e5m2) return 57344.0;
  throw std::invalid_argument(std::string("float8_max: dtype ") + c10::toString(float8_dtype) +
                              " is not a float8 training dtype (allowed: Float8_e4m3fn, "
                              "Float8_e5m2)");
}

namespace {

// Note [Chunked CPU casts]:
// On the CPU (no fused kernel) abs, x * scale and the clamp each make a full-size float32
// temporary: a float8 cast of a [T, hidden] activation briefly took 2-3x its float32 size,
// ~6% of the debug model's peak. Large CPU tensors are therefore processed in slices of about
// kCastChunkElems along dim 0. max is exact and the rest is elementwise, so the result is the
// same, bit for bit; only the temporaries shrink to one slice.
constexpr int64_t kCastChunkElems = int64_t{1} << 16;

int64_t chunk_rows(const at::Tensor& x) {
  if (!x.device().is_cpu() || x.dim() == 0 || x.numel() <= kCastChunkElems || x.size(0) < 2) return 0;
  return std::max<int64_t>(1, kCastChunkElems / std::max<int64_t>(1, x.numel() / x.size(0)));
}

// amax of |x| (x's dtype) reduced over everything (d < 0) or over dim d with keepdim.
at::Tensor abs_amax(const at::Tensor& x, int64_t d) {
  // abs is never kept by per-op AC (it is not on the save list): See Note [Op save list].
  at::Tensor a = titan::model::checkpointable_op("abs", [&] { return at::abs(x); });
  return d < 0 ? at::amax(a) : at::amax(a, {d}, /*keepdim=*/true);
}

}  // namespace

at::Tensor amax(const at::Tensor& x, ScalingGranularity granularity, int64_t dim) {
  if (granularity == ScalingGranularity::Axiswise && x.dim() == 0) {
    throw std::invalid_argument("float8 amax: axiswise scaling needs a tensor of rank >= 1");
  }
  // Through the op layer (model/activation_checkpoint_ops.h): per-op selective AC keeps the amax and
  // recomputes abs, which is never on the save list (abs(W) of an unsharded weight cost
  // ~11 GiB on Llama3-8B when torchtitan + torchao kept it).
  return titan::model::checkpointable_op("amax", [&] {
    // abs and max are exact in any float dtype, so reducing in x's dtype then widening is exact.
    const int64_t d = granularity == ScalingGranularity::Tensorwise ? -1 : c10::maybe_wrap_dim(dim, x.dim());
    const int64_t rows = chunk_rows(x);  // See Note [Chunked CPU casts]
    if (rows == 0) return abs_amax(x, d).to(at::kFloat);
    std::vector<at::Tensor> parts;
    for (int64_t r = 0; r < x.size(0); r += rows)
      parts.push_back(abs_amax(x.narrow(0, r, std::min(rows, x.size(0) - r)), d));
    at::Tensor out = parts[0];
    if (d != 0) {
      if (d < 0) return at::amax(at::stack(parts)).to(at::kFloat);
      return at::cat(parts, 0).to(at::kFloat);  // per-slice rows of the keepdim result
    }
    for (size_t i = 1; i < parts.size(); ++i) out = at::maximum(out, parts[i]);  // reduced over dim 0
    return out.to(at::kFloat);
  });
}

at::Tensor scale_from_amax(const at::Tensor& amax, at::ScalarType float8_dtype,
                           bool round_to_power_of_2) {
  // float64 division: float32 would round fp8_max / amax differently from torchao.
  at::Tensor scale =
      (float8_max(float8_dtype) / at::clamp(amax.to(at::kDouble), kEps)).to(at::kFloat);
  return round_to_power_of_2 ? round_scale_to_power_of_2(scale) : scale;
}

at::Tensor round_scale_to_power_of_2(const at::Tensor& scale) {
  return at::exp2(at::floor(at::log2(scale.to(at::kFloat))));
}

at::Tensor cast_to_float8(const at::Tensor& x, const at::Tensor& scale, at::ScalarType dtype) {
  // Memory snapshots file these allocations under "float8 casts"; profiles show the range.
  titan::model::NamedScope scope("float8 cast", titan::model::MemoryCategory::kFloat8Casts);
  const double m = float8_max(dtype);
  const int64_t rows = chunk_rows(x);  // See Note [Chunked CPU casts]
  if (rows == 0) return at::clamp(x.to(at::kFloat) * scale, -m, m).to(dtype);
  at::Tensor out = at::empty(x.sizes(), x.options().dtype(dtype));
  // A per-row scale has x's rank and x's dim 0 (Note [Scale follows data]); others broadcast.
  const bool scale_per_row = scale.dim() > 0 && scale.size(0) == x.size(0);
  for (int64_t r = 0; r < x.size(0); r += rows) {
    const int64_t n = std::min(rows, x.size(0) - r);
    const at::Tensor s = scale_per_row ? scale.narrow(0, r, n) : scale;
    out.narrow(0, r, n).copy_(at::clamp(x.narrow(0, r, n).to(at::kFloat) * s, -m, m).to(dtype));
  }
  return out;
}

Float8Tensor to_float8(const at::Tensor& x, const CastConfig& config, int64_t axis_dim,
                       bool round_scales_to_power_of_2) {
  if (x.is_cuda()) {
    if (auto fused = try_fused_to_float8(x, config, axis_dim, round_scales_to_power_of_2)) return *fused;
  } else if (x.device().is_cpu() && titan::util::cpu_has_avx2_kernels()) {  // Note [Fused CPU casts]
    if (auto fused = try_fused_to_float8_cpu(x, config, axis_dim, round_scales_to_power_of_2)) return *fused;
  }
  return to_float8_composite(x, config, axis_dim, round_scales_to_power_of_2);
}

Float8Tensor to_float8_composite(const at::Tensor& x, const CastConfig& config, int64_t axis_dim,
                                 bool round_scales_to_power_of_2) {
  at::Tensor a = amax(x, config.granularity, axis_dim);
  return to_float8_with_scale(x, scale_from_amax(a, config.dtype, round_scales_to_power_of_2),
                              config.dtype);
}

Float8Tensor to_float8_with_global_amax(const at::Tensor& x, const CastConfig& config, int64_t axis_dim,
                                        bool round_scales_to_power_of_2,
                                        const std::function<void(at::Tensor&)>& amax_max) {
  // clone: under per-op AC a replayed amax is the kept (local) tensor, which must stay local.
  at::Tensor global = amax(x, config.granularity, axis_dim).clone();
  amax_max(global);
  return to_float8_with_scale(x, scale_from_amax(global, config.dtype, round_scales_to_power_of_2),
                              config.dtype);
}

Float8Tensor to_float8_with_scale(const at::Tensor& x, const at::Tensor& scale,
                                  at::ScalarType float8_dtype) {
  Float8Tensor t{cast_to_float8(x, scale, float8_dtype), scale, x.scalar_type()};
  check_float8_tensor(t, "to_float8");
  return t;
}

at::Tensor dequantize(const Float8Tensor& t) {
  return (t.data.to(t.orig_dtype) / t.scale).to(t.orig_dtype);
}

void check_float8_tensor(const Float8Tensor& t, const char* what) {
  if (!t.data.defined() || !t.scale.defined()) {
    throw std::invalid_argument(std::string(what) + ": Float8Tensor with undefined data or scale");
  }
  if (!is_float8(t.data.scalar_type())) {
    throw std::invalid_argument(std::string(what) + ": data dtype " +
                                c10::toString(t.data.scalar_type()) + " is not float8");
  }
  if (t.scale.scalar_type() != at::kFloat) {
    throw std::invalid_argument(std::string(what) + ": scale dtype " +
                                c10::toString(t.scale.scalar_type()) + " must be Float");
  }
  if (t.scale.dim() == 0) return;
  bool ok = t.scale.dim() == t.data.dim();
  for (int64_t d = 0; ok && d < t.data.dim(); ++d) {
    ok = t.scale.size(d) == 1 || t.scale.size(d) == t.data.size(d);
  }
  if (!ok) {
    throw std::invalid_argument(std::string(what) + ": scale shape " +
                                c10::str(t.scale.sizes()) + " does not follow data shape " +
                                c10::str(t.data.sizes()) +
                                " (needs 0-dim or the data's rank with 1 or the data's size per "
                                "dim; See Note [Scale follows data])");
  }
}

Float8Tensor reshape(const Float8Tensor& t, at::IntArrayRef shape) {
  check_float8_tensor(t, "float8 reshape");
  at::Tensor data = t.data.reshape(shape);
  if (t.is_tensorwise()) return {data, t.scale, t.orig_dtype};
  const int64_t rank = t.data.dim();
  const int64_t last = t.data.size(-1);
  if (data.dim() == 0 || data.size(-1) != last) {
    throw std::invalid_argument("float8 reshape: axiswise data " + c10::str(t.data.sizes()) +
                                " -> " + c10::str(shape) +
                                " must keep the last dimension so the scale " +
                                c10::str(t.scale.sizes()) + " can follow");
  }
  bool lead_full = true, lead_one = true;
  for (int64_t d = 0; d + 1 < rank; ++d) {
    lead_full = lead_full && t.scale.size(d) == t.data.size(d);
    lead_one = lead_one && t.scale.size(d) == 1;
  }
  std::vector<int64_t> scale_shape;
  for (int64_t d = 0; d + 1 < data.dim(); ++d) {
    scale_shape.push_back(lead_full ? data.size(d) : 1);
  }
  scale_shape.push_back(t.scale.size(-1));
  if (!lead_full && !lead_one) {
    throw std::invalid_argument("float8 reshape: scale " + c10::str(t.scale.sizes()) +
                                " of data " + c10::str(t.data.sizes()) +
                                " mixes per-row and shared leading dims; cannot reshape to " +
                                c10::str(shape));
  }
  Float8Tensor out{data, t.scale.reshape(scale_shape), t.orig_dtype};
  check_float8_tensor(out, "float8 reshape");
  return out;
}

Float8Tensor reshape_to_2d(const Float8Tensor& t) {
  if (t.data.dim() == 2) return t;
  if (t.data.dim() < 1) {
    throw std::invalid_argument("float8 reshape_to_2d: data must have rank >= 1");
  }
  return reshape(t, {-1, t.data.size(-1)});
}

Float8Tensor transpose_2d(const Float8Tensor& t) {
  check_float8_tensor(t, "float8 transpose_2d");
  if (t.data.dim() != 2) {
    throw std::invalid_argument("float8 transpose_2d: data " + c10::str(t.data.sizes()) +
                                " is not 2-D");
  }
  return {t.data.t(), t.is_tensorwise() ? t.scale : t.scale.t(), t.orig_dtype};
}

}  // namespace titan::float8
