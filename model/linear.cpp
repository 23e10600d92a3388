#include "model/linear.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/ops/mm.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <atomic>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "model/activation_checkpoint_ops.h"
#include "model/linear_autograd.h"

namespace titan::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// See Note [One linear skeleton] in model/linear_autograd.h.
struct LinearFunction : public torch::autograd::Function<LinearFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight,
                            const c10::intrusive_ptr<LinearArithmetic>& arithmetic) {
    LinearArithmetic& a = *arithmetic;
    const at::Tensor out = a.records_state() ? a.output(input, weight)
                                             : checkpointable_op("mm", [&] { return a.output(input, weight); });
    ctx->save_for_backward({input, weight});
    ctx->saved_data["arithmetic"] = at::IValue::make_capsule(c10::intrusive_ptr<torch::CustomClassHolder>(arithmetic));
    std::vector<int64_t> out_shape = input.sizes().vec();
    out_shape.back() = weight.size(0);
    return out.reshape(out_shape);  // [..., N]
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto holder = ctx->saved_data.at("arithmetic").toCapsule();  // alive until the end of backward
    LinearArithmetic& a = *static_cast<LinearArithmetic*>(holder.get());
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& input = saved[0];   // [..., K]
    const at::Tensor& weight = saved[1];  // [N, K]
    const at::Tensor grad = grads[0].reshape({-1, weight.size(0)});  // [M, N]
    LinearArithmetic::Grads g = a.backward(grad, input, weight, ctx->needs_input_grad(0), ctx->needs_input_grad(1));
    if (g.input.defined()) g.input = g.input.reshape(input.sizes());
    return {g.input, g.weight, at::Tensor()};
  }
};

std::atomic<CpuFloat32Gemm> g_cpu_float32_gemm{CpuFloat32Gemm::kAten};  // Note [float32 GEMMs on the CPU]

const std::optional<c10::OperatorHandle>& onednn_linear_op() {
  static const std::optional<c10::OperatorHandle> op =
      c10::Dispatcher::singleton().findSchema({"mkldnn::_linear_pointwise", ""});
  return op;
}

// See Note [Deferred weight gradients]: the open scope's target (one backward at a time).
std::atomic<DeferredWeightGrads*> g_deferred{nullptr};
std::mutex g_deferred_mutex;  // backward nodes may run on the engine's device threads

// y = x W^T in the compute dtype through the linears' skeleton (Note [One linear skeleton] in
// model/linear_autograd.h). The backward is the one at::linear's autograd computes (mm backward
// for a column-major W^T):  grad_x = G W,  grad_W = G^T x  with x, G flattened to 2-D.
class HighPrecisionArithmetic final : public LinearArithmetic {
 public:
  at::Tensor output(const at::Tensor& input, const at::Tensor& weight) override {
    return times_transposed(input.reshape({-1, weight.size(1)}), weight);  // [M, N]
  }
  Grads backward(const at::Tensor& g2d, const at::Tensor& input, const at::Tensor& weight, bool need_input,
                 bool need_weight) override {
    Grads g;
    if (need_input) g.input = times_transposed(g2d, weight.t());
    if (need_weight) {
      const at::Tensor x2d = input.reshape({-1, weight.size(1)});
      if (DeferredWeightGrads* later = g_deferred.load()) {
        std::lock_guard<std::mutex> lock(g_deferred_mutex);
        later->add(weight, g2d, x2d);  // W computes it (See Note [Deferred weight gradients])
      } else {
        g.weight = times_transposed(g2d.t(), x2d.t());
      }
    }
    return g;
  }
};

// Stateless: one object serves every call.
const c10::intrusive_ptr<LinearArithmetic>& high_precision_arithmetic() {
  static const c10::intrusive_ptr<LinearArithmetic> arithmetic = c10::make_intrusive<HighPrecisionArithmetic>();
  return arithmetic;
}

}  // namespace

at::Tensor apply_linear(const at::Tensor& input, const at::Tensor& weight,
                        const c10::intrusive_ptr<LinearArithmetic>& arithmetic) {
  return LinearFunction::apply(input, weight, arithmetic);
}

void set_cpu_float32_gemm(CpuFloat32Gemm gemm) {
  TORCH_CHECK(gemm == CpuFloat32Gemm::kAten || onednn_linear_available(),
              "training.cpu_float32_gemm = onednn: this LibTorch has no oneDNN linear (mkldnn::_linear_pointwise); "
              "use aten");
  g_cpu_float32_gemm.store(gemm);
}

CpuFloat32Gemm cpu_float32_gemm() { return g_cpu_float32_gemm.load(); }

bool onednn_linear_available() { return onednn_linear_op().has_value(); }

at::Tensor times_transposed(const at::Tensor& a, const at::Tensor& w) {
  // K = 0 (an expert's weight gradient when no token chose it) stays with at::mm, which gives the
  // zeros: oneDNN has no primitive for an empty sum.
  if (g_cpu_float32_gemm.load(std::memory_order_relaxed) == CpuFloat32Gemm::kOneDnn && a.is_cpu() &&
      a.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat && a.size(1) > 0) {
    // mkldnn::_linear_pointwise(Tensor X, Tensor W, Tensor? B, str attr, Scalar?[] scalars, str? algorithm)
    torch::jit::Stack stack{a, w, c10::IValue(), c10::IValue(std::string("none")),
                            c10::IValue(c10::List<std::optional<at::Scalar>>()), c10::IValue()};
    onednn_linear_op()->callBoxed(&stack);
    return stack[0].toTensor();
  }
  return at::mm(a, w.t());
}

void DeferredWeightGrads::add(at::Tensor weight, at::Tensor grad_output_2d, at::Tensor input_2d) {
  entries_.push_back({std::move(weight), std::move(grad_output_2d), std::move(input_2d)});
}

void DeferredWeightGrads::run() {
  std::vector<Entry> entries = std::move(entries_);
  entries_.clear();
  for (Entry& e : entries) {
    const at::Tensor grad_weight = times_transposed(e.grad_output_2d.t(), e.input_2d.t());
    e.grad_output_2d = e.input_2d = at::Tensor();
    torch::autograd::backward({e.weight}, {grad_weight});
  }
}

int64_t DeferredWeightGrads::held_bytes() const {
  int64_t bytes = 0;
  for (const Entry& e : entries_) bytes += e.grad_output_2d.nbytes() + e.input_2d.nbytes();
  return bytes;
}

DeferWeightGrads::DeferWeightGrads(DeferredWeightGrads& target) {
  DeferredWeightGrads* expected = nullptr;
  TORCH_CHECK(g_deferred.compare_exchange_strong(expected, &target), "DeferWeightGrads: a scope is already open");
}

DeferWeightGrads::~DeferWeightGrads() { g_deferred.store(nullptr); }

LinearCompute* innermost(const std::shared_ptr<LinearCompute>& compute) {
  LinearCompute* c = compute.get();
  while (c && c->inner()) c = c->inner()->get();
  return c;
}

at::Tensor HighPrecisionLinearCompute::forward(const LinearOperand& input, const LinearOperand& weight) {
  if (input.cast.defined() || weight.cast.defined())
    throw std::invalid_argument("the high-precision linear was handed a float8 operand; only a "
                                "float8 tensorwise compute can use one");
  if (input.chunks)
    throw std::invalid_argument("an input arriving in sequence chunks needs a column-parallel compute");
  return apply_linear(input.hp, weight.hp, high_precision_arithmetic());
}

Linear::Linear(std::string fqn, int64_t in_features, int64_t out_features)
    : fqn_(std::move(fqn)),
      in_features_(in_features),
      out_features_(out_features),
      compute_(std::make_shared<HighPrecisionLinearCompute>()) {}

void check_linear_shapes(const std::string& compute, const at::Tensor& input, const at::Tensor& weight) {
  if (weight.dim() == 2 && input.dim() >= 1 && input.size(-1) == weight.size(1)) return;
  std::ostringstream os;
  os << compute << ": input " << input.sizes() << " does not match weight " << weight.sizes()
     << " (need input [..., K] and weight [N, K])";
  throw std::invalid_argument(os.str());
}

at::Tensor Linear::forward(const LinearOperand& input) const {
  try {
    return compute_->forward(input, LinearOperand(weight, weight_cast));
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument("linear " + fqn_ + " (" + compute_->describe() + "): " + e.what());
  }
}

void Linear::set_compute(std::shared_ptr<LinearCompute> compute) {
  TORCH_CHECK(compute, "Linear ", fqn_, ": set_compute needs a non-null LinearCompute");
  compute_ = std::move(compute);
}

}  // namespace titan::model
