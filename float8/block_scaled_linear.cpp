#include "float8/block_scaled_linear.h"

#include <algorithm>
#include <sstream>
#include <stdexcept>

#include "float8/kernels/block_cast.h"
#include "model/linear_autograd.h"

namespace titan::float8 {

bool is_block_scaled_recipe_name(const std::string& name) {
  const auto& mx = mx_recipe_names();
  return name == kBlockwiseRecipeName || name == "mxfp8" || std::find(mx.begin(), mx.end(), name) != mx.end();
}

BlockScaledRecipe block_scaled_recipe_from_name(const std::string& name) {
  BlockScaledRecipe r;
  r.name = name == "mxfp8" ? "mxfp8_cublas" : name;  // torchtitan v0.1's [mx] default
  if (r.name == kBlockwiseRecipeName) {
    r.activation = blockwise_layout(1);
    r.weight = blockwise_layout(128);
    return r;
  }
  if (r.name == "mxfp8_cublas" || r.name == "mxfp8_emulated") {
    r.activation = r.weight = mx_layout(BlockElement::E4M3, MxScaleRounding::Floor);
  } else if (r.name == "mxfp8_cublas_rceil") {
    r.activation = r.weight = mx_layout(BlockElement::E4M3, MxScaleRounding::Rceil);
  } else if (r.name == "mxfp4_emulated") {
    r.activation = r.weight = mx_layout(BlockElement::E2M1, MxScaleRounding::Floor);
  } else {
    std::string valid;
    for (const auto& n : mx_recipe_names()) valid += n + ", ";
    throw std::invalid_argument("block-scaled recipe '" + name + "' is unknown (valid: " + valid +
                                "mxfp8 (= mxfp8_cublas), " + kBlockwiseRecipeName + ")");
  }
  r.emulated_gemm = r.name.find("_emulated") != std::string::npos;
  return r;
}

BlockScaledTensor quantize_operand(const at::Tensor& x, const BlockLayout& layout, bool transposed, bool fused) {
  if (fused && x.is_cuda() && block_cast_cuda_applies(x, layout, transposed))
    return fused_quantize_blocks_cuda(x, layout, transposed);
  return quantize_blocks(transposed ? x.t().contiguous() : x, layout);
}

namespace {

// Note [Block-scaled linear autograd]: the products through the linears' skeleton (Note [One
// linear skeleton] in model/linear_autograd.h): the output GEMM, casts included, is its "mm"
// (per-op selective AC keeps its product as it keeps a high-precision one); backward flattens
// input to x [T, K] and the gradient to G [T, N] and runs the two backward GEMMs with the operands
// of the file comment of block_scaled_linear.h.
class BlockScaledArithmetic final : public titan::model::LinearArithmetic {
 public:
  explicit BlockScaledArithmetic(c10::intrusive_ptr<BlockScaledLinearState> state) : state_(std::move(state)) {}

  at::Tensor output(const at::Tensor& input, const at::Tensor& weight) override {
    const BlockScaledLinearState& s = *state_;
    const int64_t K = weight.size(1);
    const BlockScaledTensor x = quantize_operand(input.reshape({-1, K}), s.recipe.activation, false);
    const BlockScaledTensor w = quantize_operand(weight, s.recipe.weight, false);
    return block_scaled_mm(x, w, input.scalar_type(), s.backend);
  }

  Grads backward(const at::Tensor& grad, const at::Tensor& input, const at::Tensor& weight, bool need_input,
                 bool need_weight) override {
    const BlockScaledLinearState& s = *state_;
    const int64_t K = weight.size(1);
    const at::Tensor x = input.reshape({-1, K});
    const at::Tensor G = grad.contiguous();
    Grads g;
    if (need_input) {
      const BlockScaledTensor gq = quantize_operand(G, s.recipe.activation, false);
      const BlockScaledTensor wt = quantize_operand(weight, s.recipe.weight, /*transposed=*/true, s.fused_dim1_cast);
      g.input = block_scaled_mm(gq, wt, input.scalar_type(), s.backend);
    }
    if (need_weight) {
      const BlockScaledTensor gt = quantize_operand(G, s.recipe.activation, /*transposed=*/true, s.fused_dim1_cast);
      const BlockScaledTensor xt = quantize_operand(x, s.recipe.activation, /*transposed=*/true, s.fused_dim1_cast);
      g.weight = block_scaled_mm(gt, xt, weight.scalar_type(), s.backend);
    }
    return g;
  }

 private:
  c10::intrusive_ptr<BlockScaledLinearState> state_;
};

}  // namespace

BlockScaledLinearCompute::BlockScaledLinearCompute(BlockScaledRecipe recipe, BlockGemmBackend backend,
                                                   bool fused_dim1_cast)
    : state_(c10::make_intrusive<BlockScaledLinearState>()) {
  state_->fused_dim1_cast = fused_dim1_cast;
  if (recipe.emulated_gemm) backend = BlockGemmBackend::Emulated;
  state_->recipe = std::move(recipe);
  state_->backend = backend;
}

int64_t BlockScaledLinearCompute::block_alignment() const {
  const BlockScaledRecipe& r = state_->recipe;
  return std::max({r.activation.block_cols, r.activation.block_rows, r.weight.block_cols, r.weight.block_rows});
}

at::Tensor BlockScaledLinearCompute::forward(const titan::model::LinearOperand& input,
                                             const titan::model::LinearOperand& weight) {
  const at::Tensor& x = input.hp;
  const at::Tensor& w = weight.hp;
  titan::model::check_linear_shapes(describe(), x, w);
  if (input.chunks)
    throw std::invalid_argument("an input arriving in sequence chunks needs a column-parallel compute");
  if (input.cast.defined() || weight.cast.defined())
    throw std::invalid_argument("recipe '" + state_->recipe.name +
                                "' computes its own block scales: it cannot take an operand already "
                                "cast to float8 with one tensorwise scale (float8 all-gathers are for "
                                "the tensorwise recipe)");
  const BlockScaledRecipe& r = state_->recipe;
  if (r.activation.e8m0_scales) {
    // MX blocks are never padded (torchao's rule): grad_weight's blocks run along the tokens.
    const int64_t tokens = x.numel() / std::max<int64_t>(1, x.size(-1));
    if (tokens % r.activation.block_cols != 0) {
      std::ostringstream os;
      os << "recipe '" << r.name << "': the linear sees " << tokens << " tokens (input " << x.sizes()
         << "); its grad_weight GEMM contracts over them in blocks of " << r.activation.block_cols
         << ", so the tokens per micro-batch and rank (local_batch_size x seq_len / cp) must be a multiple of "
         << r.activation.block_cols;
      throw std::invalid_argument(os.str());
    }
  }
  return titan::model::apply_linear(x, w, c10::make_intrusive<BlockScaledArithmetic>(state_));
}

std::string BlockScaledLinearCompute::describe() const {
  std::string d = state_->recipe.name;
  if (state_->backend == BlockGemmBackend::Emulated && !state_->recipe.emulated_gemm) d += "[emulated]";
  return d;
}

}  // namespace titan::float8
