// model/linear.h — the one way the model creates a linear layer.
//
// Every projection in Llama (wq, wk, wv, wo, w1, w2, w3, output) is a `Linear` that owns its
// weight and delegates the product to a swappable `LinearCompute`. float8/ and parallel/ convert
// or wrap linears by fully-qualified name by installing another compute object; the weight
// tensor (and therefore optimizer state, FSDP sharding, checkpoint names) never changes hands.
// This is the C++ counterpart of torchao's `convert_to_float8_training` and torchtitan's
// `parallelize_module`, without replacing modules.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

namespace titan::model {

// Note [Linear operands as data]:
// A compute receives its input and its weight as values, never through shared state. `hp` is
// the high-precision tensor autograd differentiates through. `cast` is set when the producer
// already holds the operand quantized for the GEMM, the way TransformerEngine hands quantized
// tensors to its GEMMs and torchao's FSDP makes the float8 weight the gathered parameter:
//   - the weight, when FSDP all-gathers it in float8 (the Linear's `weight_cast` slot, filled
//     by FSDP's unshard like `weight` itself; `weight` is then a storage-less autograd handle);
//   - the input, when tensor parallel all-gathers a module's input in float8 (returned by the
//     module's prepare_input; `hp` is then a storage-less stand-in whose backward is the
//     gather's adjoint);
//   - the input of an MoE expert, when expert parallelism dispatched the routed rows in float8
//     (one scale per row); `hp` then holds the rows' dequantized values, which the backward reads.
// A compute that cannot use a given cast (high precision, int8, a recipe of other scales)
// refuses it with an error naming the linear; the plan only builds casts a compute can take.
struct QuantizedOperand {
  at::Tensor data;   // same shape as the operand, float8
  at::Tensor scale;  // [] float32: data = saturate(float32(hp) * scale) (one tensorwise scale), or
                     // [..., 1]: one scale per row
  bool defined() const { return data.defined(); }
};

class SequenceChunks;

struct LinearOperand {
  LinearOperand(at::Tensor hp_) : hp(std::move(hp_)) {}  // NOLINT: a plain tensor is an operand
  LinearOperand(at::Tensor hp_, QuantizedOperand cast_) : hp(std::move(hp_)), cast(std::move(cast_)) {}
  at::Tensor hp;          // input [..., K] or weight [N, K], in the compute dtype
  QuantizedOperand cast;  // undefined unless the producer cast it (see the Note)
  // Set for an input still arriving in sequence chunks (See Note [Sequence chunks]); `hp` is
  // then a storage-less stand-in of the whole input's shape.
  std::shared_ptr<SequenceChunks> chunks;
};

// Note [Sequence chunks]: under async tensor parallel a module's sequence-sharded input is not
// gathered whole before its column-parallel linears run: it is all-gathered in chunks, and the
// first reader multiplies chunk k while chunks k+1.. are still in flight (the later readers find
// them arrived). Only a column-parallel compute (parallel/tensor_parallel/tensor_parallel.h) takes such an
// operand; it runs its inner compute once per chunk and assembles the rows.
class SequenceChunks {
 public:
  virtual ~SequenceChunks() = default;
  virtual int count() const = 0;
  // Chunk k of the gathered input, [B, S/count, K] (a slice of every rank's rows), possibly
  // already cast (`cast`); waits for its collective the first time and is then the same value
  // for every reader.
  virtual const LinearOperand& chunk(int k) = 0;
  // The per-chunk outputs [B, S/count, N] -> [B, S, N] in sequence order (differentiable).
  virtual at::Tensor assemble(const std::vector<at::Tensor>& outputs) const = 0;
};

// y = x W^T for x [..., in_features] and W [out_features, in_features]; no bias (Llama has none).
class LinearCompute {
 public:
  virtual ~LinearCompute() = default;
  virtual at::Tensor forward(const LinearOperand& input, const LinearOperand& weight) = 0;
  // Short name for logs, e.g. "hp", "float8[rowwise]", "int8", "colwise(float8[rowwise])".
  virtual std::string describe() const = 0;
  // The compute a decorator (colwise, rowwise, ...) wraps; nullptr for a compute that multiplies.
  virtual const std::shared_ptr<LinearCompute>* inner() const { return nullptr; }
};

// The shapes every LinearCompute::forward takes: input [..., K] (rank >= 1) and weight [N, K].
// Throws std::invalid_argument naming `compute` (its describe()) and both shapes otherwise.
void check_linear_shapes(const std::string& compute, const at::Tensor& input, const at::Tensor& weight);

// The compute at the bottom of a decorator chain: the one that multiplies.
LinearCompute* innermost(const std::shared_ptr<LinearCompute>& compute);

// Note [float32 GEMMs on the CPU]: which library multiplies the high-precision linears' float32
// CPU operands (training.cpu_float32_gemm). kAten: LibTorch's at::mm, whose x86 wheels call MKL;
// MKL picks its kernels by CPU vendor and runs its AVX2 ones on AMD processors, so on an AMD
// EPYC with AVX-512 (Zen 5, two cores) it multiplies at 190-220 GFLOP/s where oneDNN, which the
// same wheel carries and which picks by instruction set, reaches 280-500. kOneDnn: the three
// products (x W^T, G W, G^T x) through LibTorch's oneDNN linear op (mkldnn::_linear_pointwise,
// the one inductor uses on the CPU), taking the transposed operands as strided views. The sums
// run in another order, so the float32 results differ from kAten's in the last bits (about
// 1e-6 relative): kAten stays the default, so a float32 run gives the same bits it always has.
// Process-wide, as at::set_num_threads; bf16 and CUDA operands are unaffected.
enum class CpuFloat32Gemm { kAten, kOneDnn };
void set_cpu_float32_gemm(CpuFloat32Gemm gemm);
CpuFloat32Gemm cpu_float32_gemm();
bool onednn_linear_available();  // this LibTorch registers mkldnn::_linear_pointwise
// Sets the choice for a scope (a probe, a test) and restores the one before it when the scope ends.
class CpuFloat32GemmScope {
 public:
  explicit CpuFloat32GemmScope(CpuFloat32Gemm gemm) : before_(cpu_float32_gemm()) { set_cpu_float32_gemm(gemm); }
  ~CpuFloat32GemmScope() { set_cpu_float32_gemm(before_); }
  CpuFloat32GemmScope(const CpuFloat32GemmScope&) = delete;
  CpuFloat32GemmScope& operator=(const CpuFloat32GemmScope&) = delete;

 private:
  CpuFloat32Gemm before_;
};
// a W^T for a [M, K] and W [N, K], either of any strides: the GEMM of the high-precision linear,
// through the library cpu_float32_gemm() names for float32 CPU operands, else at::mm.
at::Tensor times_transposed(const at::Tensor& a, const at::Tensor& w);

// The high-precision product x W^T (an autograd Function whose GEMM goes through the op layer,
// model/activation_checkpoint_ops.h): the default compute of every Linear.
class HighPrecisionLinearCompute final : public LinearCompute {
 public:
  at::Tensor forward(const LinearOperand& input, const LinearOperand& weight) override;
  std::string describe() const override { return "hp"; }
};

// Note [Deferred weight gradients]: the zero-bubble pipeline schedules split a stage's backward
// into I (what the previous stage waits for) and W (the weight gradients, run later in a bubble).
// While a DeferWeightGrads scope is open, the high-precision linear's backward computes only its
// input gradient and hands (its weight as autograd saw it, its output gradient, its input) to the
// scope's DeferredWeightGrads; everything else in the backward runs as usual. run() later
// computes each weight gradient, G^T x, the same GEMM the backward would have run, and delivers
// it through the weight's own autograd path (a leaf's accumulation, a cast's backward, FSDP's
// hooks), in the order the linears deferred them. Process-wide, not per thread: on CUDA the
// autograd engine runs backward nodes on its device threads. Linears of other computes (float8,
// int8, ...) compute their weight gradients in place.
class DeferredWeightGrads {
 public:
  void add(at::Tensor weight, at::Tensor grad_output_2d, at::Tensor input_2d);
  void run();                         // computes and delivers them all, then holds nothing
  int64_t held_bytes() const;         // the output gradients and inputs kept until run()
  bool empty() const { return entries_.empty(); }

 private:
  struct Entry {
    at::Tensor weight, grad_output_2d, input_2d;
  };
  std::vector<Entry> entries_;
};

class DeferWeightGrads {
 public:
  explicit DeferWeightGrads(DeferredWeightGrads& target);
  ~DeferWeightGrads();
  DeferWeightGrads(const DeferWeightGrads&) = delete;
  DeferWeightGrads& operator=(const DeferWeightGrads&) = delete;
};

class Linear {
 public:
  Linear(std::string fqn, int64_t in_features, int64_t out_features);

  // input [..., in_features] -> [..., out_features]; errors name this linear's fqn.
  at::Tensor forward(const LinearOperand& input) const;

  const std::string& fqn() const { return fqn_; }  // e.g. "layers.0.attention.wq"
  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }

  void set_compute(std::shared_ptr<LinearCompute> compute);
  const std::shared_ptr<LinearCompute>& compute() const { return compute_; }

  at::Tensor weight;              // [out_features, in_features], parameter "<fqn>.weight"
  QuantizedOperand weight_cast;   // set by an FSDP float8 all-gather while unsharded, else empty
  // The model's choice that this linear computes in the parameters' dtype whatever the
  // converters (an MoE router's gate: torchtitan's MoE configs filter "router.gate" too).
  bool keeps_precision = false;

 private:
  std::string fqn_;
  int64_t in_features_;
  int64_t out_features_;
  std::shared_ptr<LinearCompute> compute_;
};

}  // namespace titan::model
