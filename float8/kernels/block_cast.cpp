#include "float8/kernels/block_cast.h"

#include <ATen/ops/empty.h>

#include <sstream>
#include <stdexcept>
#include <string>

#ifdef TITAN_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "float8/kernels/block_cast_kernels.cuh"
#endif

namespace titan::float8 {

#ifdef TITAN_WITH_CUDA

namespace {

constexpr int64_t kMaxGridY = 65535;  // the kernels put this dimension's tiles on grid.y

// Why fused_quantize_blocks_cuda cannot run (empty: it can), apart from the build having CUDA.
// One function for both entry points, so "applies" and the error never disagree.
std::string unsupported_reason(const at::Tensor& x, const BlockLayout& layout, bool transposed) {
  std::ostringstream os;
  os << "fused_quantize_blocks_cuda(" << describe_layout(layout)
     << (transposed ? ", transposed" : "") << "): ";
  if (layout.element == BlockElement::E2M1) {
    os << "E2M1 (MXFP4) has no CUDA cast; quantize_blocks() runs it";
    return os.str();
  }
  const bool mx = layout.e8m0_scales && layout.block_rows == 1 && layout.block_cols == 32;
  const bool blockwise = !layout.e8m0_scales && layout.block_cols == 128 &&
                         (layout.block_rows == 1 || layout.block_rows == 128);
  if (!mx && !blockwise) {
    os << "unsupported block shape " << layout.block_rows << " x " << layout.block_cols
       << " (MX is 1 x 32 with E8M0 scales; blockwise 1 x 128 or 128 x 128 with float32 scales)";
    return os.str();
  }
  if (!x.is_cuda() || x.dim() != 2) {
    os << "needs a 2-D CUDA tensor, got shape " << x.sizes() << " on " << x.device();
    return os.str();
  }
  if (x.scalar_type() != at::kFloat && x.scalar_type() != at::kBFloat16) {
    os << "dtype " << c10::toString(x.scalar_type()) << " is not Float or BFloat16";
    return os.str();
  }
  const int64_t R = x.size(0), C = x.size(1);
  const int64_t blocked = transposed ? R : C;  // the dimension the blocks run along
  if (mx && blocked % 32 != 0) {
    os << "x " << x.sizes() << ": the blocked dimension (" << (transposed ? "rows" : "columns")
       << ") must be a multiple of 32 (MX blocks are never padded)";
    return os.str();
  }
  const bool tiles = blockwise && layout.block_rows == 128;
  if ((tiles && (R + 127) / 128 > kMaxGridY) || (!tiles && transposed && (C + 31) / 32 > kMaxGridY)) {
    os << "x " << x.sizes() << " exceeds the kernels' grid (" << (tiles ? "rows" : "columns")
       << "); split it";
    return os.str();
  }
  return "";
}

}  // namespace

bool block_cast_cuda_applies(const at::Tensor& x, const BlockLayout& layout, bool transposed) {
  return unsupported_reason(x, layout, transposed).empty();
}

BlockScaledTensor fused_quantize_blocks_cuda(const at::Tensor& x_in, const BlockLayout& layout,
                                             bool transposed) {
  if (const std::string why = unsupported_reason(x_in, layout, transposed); !why.empty())
    throw std::invalid_argument(why);
  const at::Tensor x = x_in.contiguous();  // [R, C]
  c10::cuda::CUDAGuard guard(x.device());
  void* stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
  const int64_t R = x.size(0), C = x.size(1);
  const int64_t out_rows = transposed ? C : R, out_cols = transposed ? R : C;
  const kernels::SrcType src =
      x.scalar_type() == at::kFloat ? kernels::SrcType::Float32 : kernels::SrcType::BFloat16;

  BlockScaledTensor out;
  out.layout = layout;
  out.rows = out_rows;
  out.cols = out_cols;
  out.orig_dtype = x.scalar_type();
  out.data = at::empty({out_rows, out_cols}, x.options().dtype(at::kFloat8_e4m3fn));
  if (layout.e8m0_scales) {
    out.scale = at::empty({out_rows, out_cols / 32}, x.options().dtype(at::kByte));
    const kernels::BlockScaleMode mode = layout.rounding == MxScaleRounding::Floor
                                             ? kernels::BlockScaleMode::MxFloor
                                             : kernels::BlockScaleMode::MxRceil;
    (transposed ? kernels::launch_block_cast_dim1 : kernels::launch_block_cast_dim0)(
        x.data_ptr(), src, R, C, mode, out.data.data_ptr(), out.scale.data_ptr(), stream);
    return out;
  }
  const int64_t br = layout.block_rows;
  out.scale = at::empty({(out_rows + br - 1) / br, (out_cols + 127) / 128},
                        x.options().dtype(at::kFloat));
  if (br == 128) {
    kernels::launch_blockwise_tile_cast(x.data_ptr(), src, R, C, transposed, out.data.data_ptr(),
                                        out.scale.data_ptr<float>(), stream);
  } else {
    (transposed ? kernels::launch_block_cast_dim1 : kernels::launch_block_cast_dim0)(
        x.data_ptr(), src, R, C, kernels::BlockScaleMode::Blockwise, out.data.data_ptr(),
        out.scale.data_ptr(), stream);
  }
  return out;
}

#else

bool block_cast_cuda_applies(const at::Tensor&, const BlockLayout&, bool) { return false; }

BlockScaledTensor fused_quantize_blocks_cuda(const at::Tensor&, const BlockLayout& layout, bool) {
  throw std::runtime_error("fused_quantize_blocks_cuda(" + describe_layout(layout) +
                           "): titan_float8 was built without CUDA (configure with -DTITAN_CUDA=ON)");
}

#endif

}  // namespace titan::float8
