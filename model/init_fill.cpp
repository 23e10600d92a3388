// The CPU filler of the counter-based init and the dispatch to its CUDA twin.
#include "model/init_fill.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <sstream>
#include <stdexcept>
#include <string>

#include "model/init_fill_avx2.h"
#include "model/init_philox.h"
#include "util/cpu_features.h"

#ifdef TITAN_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "model/init_kernels.cuh"
#endif

namespace titan::model {

// The scalar reference of the CPU inner loop (init_fill_avx2.h): one row segment, full-tensor
// indices [first, first + n) into out[0, n). Element pairs that share a Philox block (even index
// first) take one call for both.
void philox::fill_run_scalar(float* out, uint64_t first, int64_t n, uint64_t seed, uint64_t key,
                             double std, double lo, double hi) {
  int64_t i = 0;
  if (n > 0 && (first & 1)) {
    out[i] = init_value(seed, key, first, std, lo, hi);
    ++i;
  }
  for (; i + 1 < n; i += 2)
    init_pair(seed, key, (first + static_cast<uint64_t>(i)) >> 1, std, lo, hi, &out[i], &out[i + 1]);
  if (i < n) out[i] = init_value(seed, key, first + static_cast<uint64_t>(i), std, lo, hi);
}

double philox::normal_quantile_scalar(double p) { return normal_quantile(p); }

namespace {

// The box as rows x cols of a row-major full matrix [full_rows, full_cols] (1-D: one row).
struct Box {
  int64_t rows, cols, row0, col0, full_cols;
};

Box box_of(const at::Tensor& out, const std::string& fqn, at::IntArrayRef full_shape,
           at::IntArrayRef offsets) {
  const int64_t dims = static_cast<int64_t>(full_shape.size());
  bool fits = (dims == 1 || dims == 2) && out.dim() == dims &&
              static_cast<int64_t>(offsets.size()) == dims;
  // An empty box fits anywhere: an FSDP shard that is all padding starts past the last row.
  for (int64_t d = 0; fits && out.numel() > 0 && d < dims; ++d)
    fits = offsets[d] >= 0 && offsets[d] + out.size(d) <= full_shape[d];
  if (!fits) {
    std::ostringstream os;
    os << "init of '" << fqn << "': a box of shape " << out.sizes() << " at offsets " << offsets
       << " does not fit the parameter's shape " << full_shape
       << " (1-D or 2-D parameters, box inside the full shape)";
    throw std::invalid_argument(os.str());
  }
  int64_t full_numel = 1;
  for (int64_t d : full_shape) full_numel *= d;
  if (full_numel >= (int64_t{1} << 49))  // the counter holds 48 bits of block index
    throw std::invalid_argument("init of '" + fqn + "': " + std::to_string(full_numel) +
                                " elements; the counter-based init supports fewer than 2^49");
  if (dims == 1) return {1, out.size(0), 0, offsets[0], full_shape[0]};
  return {out.size(0), out.size(1), offsets[0], offsets[1], full_shape[1]};
}

void fill_cpu(float* out, const Box& box, uint64_t seed, uint64_t key, const InitSpec& spec) {
  // Each element is independent: chunks of ~64k elements over the intra-op threads, each chunk
  // split at row ends into contiguous runs of the full tensor.
  // The AVX2 loop where the CPU has it (same values, Note [Vector init layout]).
  static const bool vector = philox::init_avx2_compiled() && util::cpu_has_avx2_kernels();
  const auto fill_run = vector ? philox::fill_run_avx2 : philox::fill_run_scalar;
  const int64_t n = box.rows * box.cols;
  at::parallel_for(0, n, 1 << 16, [&](int64_t begin, int64_t end) {
    int64_t i = begin;
    while (i < end) {
      const int64_t r = i / box.cols, c = i - r * box.cols;
      const int64_t run = std::min(end - i, box.cols - c);
      fill_run(out + i, static_cast<uint64_t>((box.row0 + r) * box.full_cols + box.col0 + c), run,
               seed, key, spec.std, spec.lo, spec.hi);
      i += run;
    }
  });
}

}  // namespace

bool init_cuda_available() {
#ifdef TITAN_WITH_CUDA
  return true;
#else
  return false;
#endif
}

void fill_init_box(const at::Tensor& out, const InitSpec& spec, uint64_t seed,
                   const std::string& fqn, at::IntArrayRef full_shape, at::IntArrayRef offsets) {
  at::NoGradGuard no_grad;
  if (full_shape.size() > 2 && out.dim() == static_cast<int64_t>(full_shape.size())) {
    // A stacked parameter ([experts, H, D]) is drawn as its 2-D view [experts H, D]: every element
    // is a function of its flat index either way (a shard of dim 0 and/or of the last: how FSDP
    // and expert parallelism split stacked experts).
    const size_t n = full_shape.size();
    bool middle_whole = true;
    for (size_t d = 1; d + 1 < n; ++d)
      middle_whole = middle_whole && offsets[d] == 0 && out.size(static_cast<int64_t>(d)) == full_shape[d];
    if (!middle_whole) {
      // A shard of a middle dim too (tensor-parallel experts: [experts, H / tp, D]): one dim-0
      // index at a time, dims 0 and 1 merged into one ([experts H, ...] has the same flat order).
      std::vector<int64_t> merged_shape(full_shape.begin() + 1, full_shape.end());
      merged_shape[0] *= full_shape[0];
      std::vector<int64_t> merged_offsets(offsets.begin() + 1, offsets.end());
      for (int64_t i = 0; i < out.size(0); ++i) {
        merged_offsets[0] = (offsets[0] + i) * full_shape[1] + offsets[1];
        fill_init_box(out.select(0, i), spec, seed, fqn, merged_shape, merged_offsets);
      }
      return;
    }
    int64_t inner = 1;
    for (size_t d = 1; d + 1 < n; ++d) inner *= full_shape[d];
    const at::Tensor rows = out.view({out.size(0) * inner, out.size(static_cast<int64_t>(n) - 1)});
    const std::vector<int64_t> shape2 = {full_shape[0] * inner, full_shape[n - 1]};
    const std::vector<int64_t> offsets2 = {offsets[0] * inner, offsets[n - 1]};
    fill_init_box(rows, spec, seed, fqn, shape2, offsets2);
    return;
  }
  const Box box = box_of(out, fqn, full_shape, offsets);
  if (out.numel() == 0) return;
  if (spec.ones) {
    out.fill_(1.0);
    return;
  }
  const uint64_t key = philox::fqn_hash(fqn.data(), fqn.size());
  const bool direct = out.scalar_type() == at::kFloat && out.is_contiguous();
  at::Tensor values =
      direct ? out : at::empty(out.sizes(), out.options().dtype(at::kFloat).memory_format(at::MemoryFormat::Contiguous));
  if (out.is_cpu()) {
    fill_cpu(values.data_ptr<float>(), box, seed, key, spec);
  } else if (out.is_cuda()) {
#ifdef TITAN_WITH_CUDA
    c10::cuda::CUDAGuard guard(out.device());
    kernels::launch_init_box(values.data_ptr<float>(), box.rows, box.cols, box.row0, box.col0,
                             box.full_cols, seed, key, spec.std, spec.lo, spec.hi,
                             c10::cuda::getCurrentCUDAStream(out.device().index()).stream());
#else
    throw std::runtime_error("init of '" + fqn + "' on " + out.device().str() +
                             ": titan was built without CUDA (configure with -DTITAN_CUDA=ON)");
#endif
  } else {
    // Other devices: generate on the CPU, then copy.
    at::Tensor cpu = at::empty(out.sizes(), at::TensorOptions().dtype(at::kFloat));
    fill_cpu(cpu.data_ptr<float>(), box, seed, key, spec);
    values = cpu;
  }
  if (!values.is_same(out)) out.copy_(values);
}

}  // namespace titan::model
