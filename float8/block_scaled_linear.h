// float8/block_scaled_linear.h — the block-scaled LinearCompute: MXFP8, MXFP4 and blockwise
// float8 training of a linear, by recipe name.
//
// The three GEMMs of a linear, each as out = A[M, K] @ B[N, K]^T with both operands' blocks
// along the contraction dimension K (float8/block_scaled.h):
//   output      = x @ W^T      A = x [T, in]        B = W [out, in]
//   grad_input  = G @ W        A = G [T, out]       B = W^T [in, out]   (the weight's "dim1" cast)
//   grad_weight = G^T @ x      A = G^T [out, T]     B = x^T [in, T]     (dim1 casts of G and x)
// so a weight or gradient is cast twice, once with blocks along each dimension. As torchao's
// mx_mm and its blockwise linear do, the autograd function saves the high-precision x and W and
// casts again in backward; nothing block-scaled outlives a step, so checkpoints hold nothing
// beyond the high-precision weights.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <string>
#include <vector>

#include "float8/block_scaled.h"
#include "float8/recipe.h"
#include "model/linear.h"

namespace titan::float8 {

struct BlockScaledRecipe {
  std::string name;        // e.g. "mxfp8_cublas", "blockwise"
  BlockLayout activation;  // x and G, and their transposes for grad_weight
  BlockLayout weight;      // W and W^T
  bool emulated_gemm = false;  // the *_emulated recipes: never the hardware GEMM
};

// A recipe by name: an MX name above (or torchtitan v0.1's "mxfp8" = "mxfp8_cublas") or
// "blockwise". Throws std::invalid_argument naming the bad value and the valid ones.
BlockScaledRecipe block_scaled_recipe_from_name(const std::string& name);
bool is_block_scaled_recipe_name(const std::string& name);

class BlockScaledLinearState : public torch::CustomClassHolder {
 public:
  BlockScaledRecipe recipe;
  BlockGemmBackend backend = BlockGemmBackend::Auto;
  bool fused_dim1_cast = true;  // false: the transposed operands are transposed, then cast
};

class BlockScaledLinearCompute final : public titan::model::LinearCompute {
 public:
  explicit BlockScaledLinearCompute(BlockScaledRecipe recipe, BlockGemmBackend backend = BlockGemmBackend::Auto,
                                    bool fused_dim1_cast = true);

  // input [..., K], weight [N, K] -> [..., N] in input's dtype. Operands cast by a producer
  // (float8 tensorwise all-gathers) are refused: block scales are computed here, per block.
  at::Tensor forward(const titan::model::LinearOperand& input,
                     const titan::model::LinearOperand& weight) override;
  std::string describe() const override;  // "mxfp8_cublas", "blockwise[emulated]"

  const BlockScaledRecipe& recipe() const { return state_->recipe; }
  BlockGemmBackend backend() const { return state_->backend; }
  // The largest block length along either dimension of any operand: a shard boundary (tensor
  // parallel) must fall on a multiple of it, or a block would straddle two ranks.
  int64_t block_alignment() const;

 private:
  c10::intrusive_ptr<BlockScaledLinearState> state_;
};

// Quantizes x (2-D) with blocks along its last dimension, or, `transposed`, x^T with blocks
// along x's first dimension (the "dim1" cast), through the fused CUDA kernel where one applies
// and `fused` allows it.
BlockScaledTensor quantize_operand(const at::Tensor& x, const BlockLayout& layout, bool transposed, bool fused = true);

}  // namespace titan::float8
