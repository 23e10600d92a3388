// parallel/expert_parallel/expert_parallel.cpp — see expert_parallel.h.
#include "parallel/expert_parallel/expert_parallel.h"
#include "model/param_path.h"

#include <ATen/ops/argsort.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/tensor.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include "float8/scaling.h"
#include "model/activation_checkpoint_ops.h"
#include "model/moe/moe.h"
#include "model/transformer.h"
#include "parallel/comm/autograd_comm.h"
#include "parallel/comm/process_group.h"

namespace titan::parallel::expert_parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The float8 dispatch's cast: the rowwise expert recipe's input cast (e4m3, one power-of-2 scale
// per row), so the experts' output GEMMs read it as they would cast it.
const float8::CastConfig kDispatchCast{float8::ScalingGranularity::Axiswise, at::kFloat8_e4m3fn};

// Issues `sent`'s exchange; the output buffer is `landing` until `work` is waited for.
void issue(comm::Comm& ep, const at::Tensor& input, const std::vector<int64_t>& out_splits,
           const std::vector<int64_t>& in_splits, at::Tensor& sent, at::Tensor& landing, comm::CommWork& work) {
  int64_t rows = 0;
  for (int64_t n : out_splits) rows += n;
  std::vector<int64_t> shape = input.sizes().vec();
  shape[0] = rows;
  sent = input.contiguous();
  landing = at::empty(shape, input.options());
  work = ep.all_to_all_async(landing, sent, out_splits, in_splits);
}

at::Tensor exchange(const at::Tensor& input, const std::vector<int64_t>& out_splits,
                    const std::vector<int64_t>& in_splits, comm::Comm& ep) {
  at::Tensor sent, landing;
  comm::CommWork work;
  issue(ep, input, out_splits, in_splits, sent, landing, work);
  work.wait();
  return landing;
}

// Rows to the ranks that hold their experts (or back): the adjoint swaps the split sizes.
// What a rows exchange keeps for its adjoint: the split sizes and the group.
void save_exchange(AutogradContext* ctx, const std::vector<int64_t>& out_splits, const std::vector<int64_t>& in_splits,
                   comm::Comm& ep) {
  ctx->saved_data["out_splits"] = out_splits;
  ctx->saved_data["in_splits"] = in_splits;
  comm::save_comm(ctx, ep);
}
// The adjoint of a rows exchange: the gradient sent back with the split sizes swapped.
variable_list exchange_back(AutogradContext* ctx, const at::Tensor& grad) {
  const std::vector<int64_t> out_splits = ctx->saved_data.at("out_splits").toIntVector();
  const std::vector<int64_t> in_splits = ctx->saved_data.at("in_splits").toIntVector();
  return {exchange(grad, in_splits, out_splits, comm::saved_comm(ctx)), at::Tensor(), at::Tensor(), at::Tensor()};
}

struct RowsAllToAll : public torch::autograd::Function<RowsAllToAll> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input, std::vector<int64_t> out_splits,
                               std::vector<int64_t> in_splits, comm::Comm* ep) {
    save_exchange(ctx, out_splits, in_splits, *ep);
    return {model::checkpointable_op("ep_all_to_all", [&] { return exchange(input, out_splits, in_splits, *ep); })};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) { return exchange_back(ctx, grads[0]); }
};

// See Note [Float8 dispatch]: the rows cast per row, their bytes and scales sent as one
// [rows, D + 4] byte tensor; returns the arrived rows' dequantized values (differentiable: the
// adjoint sends the gradient back in high precision, a straight-through cast), their float8 data
// and their scales [rows, 1].
struct Float8RowsAllToAll : public torch::autograd::Function<Float8RowsAllToAll> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input, std::vector<int64_t> out_splits,
                               std::vector<int64_t> in_splits, comm::Comm* ep) {
    save_exchange(ctx, out_splits, in_splits, *ep);
    const int64_t D = input.size(1);
    const float8::Float8Tensor q = float8::to_float8(input, kDispatchCast, /*axis_dim=*/-1, /*round_scales_to_power_of_2=*/true);
    const at::Tensor packed = at::cat({q.data.contiguous().view(at::kByte), q.scale.contiguous().view(at::kByte)}, 1);
    const at::Tensor arrived =
        model::checkpointable_op("ep_all_to_all", [&] { return exchange(packed, out_splits, in_splits, *ep); });
    at::Tensor data = arrived.narrow(1, 0, D).contiguous().view(kDispatchCast.dtype);
    at::Tensor scale = arrived.narrow(1, D, 4).contiguous().view(at::kFloat);  // [rows, 1]
    const at::Tensor values = float8::dequantize({data, scale, input.scalar_type()});
    ctx->mark_non_differentiable({data, scale});
    return {values, data, scale};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) { return exchange_back(ctx, grads[0]); }
};

// The combine split in two (See Note [Deferred collective results] in
// parallel/tensor_parallel/async_tp.cpp), so the shared experts run while the rows travel:
//   forward:  IssueCombine (issues the all-to-all, returns a stand-in) -> the shared experts ->
//             WaitCombine (waits, returns the rows)
//   backward: WaitCombine (issues the gradient's all-to-all, returns a stand-in) -> the shared
//             experts' backward -> IssueCombine (waits, returns the gradient)
// Autograd runs the shared experts' backward between the two: its ready nodes run newest first.
struct CombineInFlight : torch::CustomClassHolder {
  std::vector<int64_t> out_splits, in_splits;  // of the forward exchange
  comm::CommWork forward_work, backward_work;
  at::Tensor forward_sent, forward_landing, backward_sent, backward_landing;
};
using Combine = c10::intrusive_ptr<CombineInFlight>;

Combine combine_of(AutogradContext* ctx) {
  return c10::static_intrusive_pointer_cast<CombineInFlight>(ctx->saved_data.at("combine").toCapsule());
}

void keep_combine(AutogradContext* ctx, const Combine& combine) {
  ctx->saved_data["combine"] = c10::IValue::make_capsule(c10::intrusive_ptr<torch::CustomClassHolder>(combine));
}

struct IssueCombine : public torch::autograd::Function<IssueCombine> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& rows, const Combine& c, comm::Comm* ep) {
    issue(*ep, rows.detach(), c->out_splits, c->in_splits, c->forward_sent, c->forward_landing, c->forward_work);
    keep_combine(ctx, c);
    return {comm::stand_in(c->forward_landing.sizes().vec(), rows.options())};
  }
  static variable_list backward(AutogradContext* ctx, variable_list) {
    Combine c = combine_of(ctx);
    c->backward_work.wait();
    c->backward_sent = at::Tensor();
    return {std::exchange(c->backward_landing, at::Tensor()), at::Tensor(), at::Tensor()};
  }
};

struct WaitCombine : public torch::autograd::Function<WaitCombine> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& /*stand_in*/, const Combine& c,
                               comm::Comm* ep) {
    c->forward_work.wait();
    c->forward_sent = at::Tensor();
    keep_combine(ctx, c);
    comm::save_comm(ctx, *ep);
    return {std::exchange(c->forward_landing, at::Tensor())};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    Combine c = combine_of(ctx);
    issue(comm::saved_comm(ctx), grads[0], c->in_splits, c->out_splits, c->backward_sent, c->backward_landing,
          c->backward_work);
    return {comm::stand_in(grads[0].sizes().vec(), grads[0].options()), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

int64_t local_experts_begin(int64_t num_experts, int ep_size, int ep_rank) {
  if (ep_size < 1 || num_experts % ep_size != 0)
    throw std::invalid_argument("parallelism.expert_parallel_degree " + std::to_string(ep_size) +
                                " does not divide the model's " + std::to_string(num_experts) +
                                " experts (each EP rank holds num_experts / degree of them)");
  return ep_rank * (num_experts / ep_size);
}

at::Tensor expert_parallel_experts(const at::Tensor& rows, const std::vector<int64_t>& counts,
                                   const model::moe::RoutedExperts& experts, comm::Comm& ep,
                                   const std::function<void()>& while_combining,
                                   const model::moe::ExpertComputes& computes) {
  const int n = ep.size();
  const int64_t E = static_cast<int64_t>(counts.size()), local = E / n;
  local_experts_begin(E, n, ep.rank());
  TORCH_CHECK(experts.local_experts() == local, "expert parallel: this rank holds ", experts.local_experts(),
              " experts' weights, expected ",
              local, " (", E, " experts over ", n, " ranks)");
  // 1. How many rows every source sends to each of this rank's experts: [n, local].
  at::Tensor received;
  {
    const at::Tensor sent = at::tensor(counts, at::kLong);
    received = model::checkpointable_op("ep_all_to_all", [&] {
      at::Tensor out = at::empty({E}, sent.options());
      ep.all_to_all_single_async(out, sent).wait();
      return out;
    });
  }
  const at::Tensor from = received.to(at::kCPU).view({n, local}).contiguous();
  const int64_t* got = from.data_ptr<int64_t>();
  std::vector<int64_t> in_splits(static_cast<size_t>(n), 0), out_splits(static_cast<size_t>(n), 0);
  for (int j = 0; j < n; ++j)
    for (int64_t e = 0; e < local; ++e) {
      in_splits[static_cast<size_t>(j)] += counts[static_cast<size_t>(j * local + e)];
      out_splits[static_cast<size_t>(j)] += got[j * local + e];
    }
  // 2. Dispatch, in float8 when asked (See Note [Float8 dispatch]).
  at::Tensor arrived;  // by (source, expert)
  model::QuantizedOperand arrived_cast;
  if (computes.float8_dispatch) {
    const variable_list sent = Float8RowsAllToAll::apply(rows, out_splits, in_splits, &ep);
    arrived = sent[0];
    arrived_cast = {sent[1], sent[2]};
  } else {
    arrived = RowsAllToAll::apply(rows, out_splits, in_splits, &ep)[0];
  }
  // 3. Group by local expert (then source), run the experts, undo the grouping.
  std::vector<int64_t> block_start(static_cast<size_t>(n * local));
  int64_t at_row = 0;
  for (int64_t b = 0; b < n * local; ++b) {
    block_start[static_cast<size_t>(b)] = at_row;
    at_row += got[b];
  }
  std::vector<int64_t> order;
  std::vector<int64_t> local_counts(static_cast<size_t>(local), 0);
  order.reserve(static_cast<size_t>(at_row));
  for (int64_t e = 0; e < local; ++e)
    for (int j = 0; j < n; ++j) {
      const int64_t b = j * local + e;
      for (int64_t i = 0; i < got[b]; ++i) order.push_back(block_start[static_cast<size_t>(b)] + i);
      local_counts[static_cast<size_t>(e)] += got[b];
    }
  const at::Tensor by_expert = at::tensor(order, at::kLong).to(rows.device());
  const model::QuantizedOperand grouped_cast =
      arrived_cast.defined() ? model::QuantizedOperand{arrived_cast.data.index_select(0, by_expert),
                                                       arrived_cast.scale.index_select(0, by_expert)}
                             : model::QuantizedOperand{};
  const at::Tensor computed =
      experts.forward(arrived.index_select(0, by_expert), local_counts, computes, grouped_cast);
  const at::Tensor back = computed.index_select(0, at::argsort(by_expert));
  // 4. Combine: every row back to its source, in the order it left, with `while_combining` run
  // while the rows travel. Per-op AC keeps the exchange as one op, so there it runs whole.
  if (model::op_checkpoint_active()) {
    const at::Tensor combined = RowsAllToAll::apply(back, in_splits, out_splits, &ep)[0];
    if (while_combining) while_combining();
    return combined;
  }
  Combine combine = c10::make_intrusive<CombineInFlight>();
  combine->out_splits = in_splits;
  combine->in_splits = out_splits;
  const at::Tensor in_flight = IssueCombine::apply(back, combine, &ep)[0];
  if (while_combining) while_combining();
  return WaitCombine::apply(in_flight, combine, &ep)[0];
}

ExpertParallelPlan apply_ep(model::Transformer& model, comm::Comm& ep, int efsdp,
                            const std::function<bool(const std::string&)>& holds) {
  ExpertParallelPlan plan;
  int64_t num_experts = 0, layers = 0;
  for (model::TransformerBlock* block : model.blocks()) {
    if (!block->moe || !holds(block->path)) continue;
    model::moe::MoE& moe = *block->moe;
    num_experts = moe.args.num_experts;
    local_experts_begin(num_experts, ep.size(), ep.rank());  // the degree divides the experts
    moe.experts_compute = [&ep](const at::Tensor& rows, const std::vector<int64_t>& counts,
                                const model::moe::RoutedExperts& experts, const model::moe::ExpertComputes& computes,
                                const std::function<void()>& meanwhile) {
      return expert_parallel_experts(rows, counts, experts, ep, meanwhile, computes);
    };
    for (const std::string& w : moe.expert_params()) plan.sharded_experts.push_back(w);
    ++layers;
  }
  std::ostringstream os;
  const int64_t local = num_experts / ep.size(), first = local_experts_begin(num_experts, ep.size(), ep.rank());
  os << "expert parallel " << ep.size() << ": " << layers << " MoE layers; this rank (ep rank " << ep.rank()
     << ") holds experts [" << first << ", " << first + local << ") of " << num_experts
     << ", rank j of the EP group experts [j*" << local << ", (j+1)*" << local
     << "); tokens dispatched and combined by all-to-all; router and shared experts replicated, the shared experts computed while the combine travels; "
     << (efsdp > 1 ? "the " + std::to_string(efsdp) + " efsdp ranks holding the same experts FSDP-shard them"
                   : "no other rank holds the same experts");
  plan.description = os.str();
  return plan;
}

}  // namespace titan::parallel::expert_parallel
