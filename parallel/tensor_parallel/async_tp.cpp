// parallel/tensor_parallel/async_tp.cpp — see async_tp.h.
//
// Note [Deferred collective results]: an autograd Function must return its outputs when its
// forward (backward) returns, but a chunk's collective should still be in flight then. So the
// Functions below come in pairs sharing one ChunkState: the first issues the collective and
// returns its output buffer before it is filled; the second, the only consumer of those buffers,
// waits for every collective before it reads them. Nothing else ever sees an unfilled buffer:
//   forward gather:   IssueChunkGathers (issues c all-gathers)  -> WaitChunkGather_k (waits k)
//   backward of it:   WaitChunkGather_k (issues k's reduce-scatter, returns its buffer)
//                     -> IssueChunkGathers (waits all, assembles the shard's gradient)
//   forward scatter:  IssueChunkReduceScatter_k (issues k, returns its buffer)
//                     -> AssembleScatteredChunks (waits all, concatenates)
//   backward of it:   AssembleScatteredChunks (issues c all-gathers) -> IssueChunkReduceScatter_k
//                     (waits k)
#include "parallel/tensor_parallel/async_tp.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>

#include <sstream>
#include <stdexcept>

#include "parallel/comm/autograd_comm.h"
#include "float8/scaling.h"

namespace titan::parallel::tensor_parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using comm::stand_in;

// The collectives of one chunked gather or scatter and their buffers (See Note [Deferred
// collective results]). Buffers handed to a collective stay referenced here until it is waited.
// The chunks of one module input or output in flight, shared by its Functions; their group
// travels beside it (See Note [A Comm through autograd]).
struct ChunkState : torch::CustomClassHolder {
  int n = 1, chunks = 1;
  std::vector<comm::CommWork> forward_work, backward_work;        // per chunk
  std::vector<at::Tensor> forward_sent, backward_sent;      // inputs in flight
  std::vector<at::Tensor> forward_landing, backward_landing;  // outputs in flight
  // Float8 chunk gather: each chunk's gathered float8 data and the one global scale.
  std::vector<at::Tensor> float8_chunks;
  at::Tensor float8_scale;
  at::ScalarType float8_dtype = at::ScalarType::Float8_e4m3fn;
  bool float8 = false;

  void resize(int c) {
    chunks = c;
    forward_work.resize(static_cast<size_t>(c));
    backward_work.resize(static_cast<size_t>(c));
    forward_sent.resize(static_cast<size_t>(c));
    backward_sent.resize(static_cast<size_t>(c));
    forward_landing.resize(static_cast<size_t>(c));
    backward_landing.resize(static_cast<size_t>(c));
    float8_chunks.resize(static_cast<size_t>(c));
  }
};
using State = c10::intrusive_ptr<ChunkState>;

State state_of(AutogradContext* ctx) {
  return c10::static_intrusive_pointer_cast<ChunkState>(ctx->saved_data.at("state").toCapsule());
}

void keep_state(AutogradContext* ctx, const State& state) {
  ctx->saved_data["state"] = c10::IValue::make_capsule(c10::intrusive_ptr<torch::CustomClassHolder>(state));
}

// [n, B, r, D] rank-major -> [B, n * r, D]: rank t's r rows at [t r, (t+1) r).
at::Tensor rank_major_to_rows(const at::Tensor& flat, int n, const std::vector<int64_t>& piece) {
  return flat.view({n, piece[0], piece[1], piece[2]}).transpose(0, 1).reshape({piece[0], n * piece[1], piece[2]});
}

// [B, n * r, D] -> [n, B, r, D] rank-major, contiguous (what a reduce-scatter sends).
at::Tensor rows_to_rank_major(const at::Tensor& x, int n) {
  return x.reshape({x.size(0), n, x.size(1) / n, x.size(2)}).transpose(0, 1).contiguous();
}

// Forward: issues the c all-gathers of x [B, s, D] (float8 bytes with one global scale, or x's
// own values) and returns c stand-ins [B, s/c, D] that carry the pieces' gradients back.
struct IssueChunkGathers : torch::autograd::Function<IssueChunkGathers> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const State& state,
                               const std::optional<Float8ChunkCast>& float8, comm::Comm* group) {
    ChunkState& st = *state;
    comm::Comm& comm = *group;
    const int64_t piece_rows = x.size(1) / st.chunks;
    at::Tensor source = x.detach();
    if (float8) {
      at::NoGradGuard no_grad;
      // One scale for every rank: the global amax of the sequence shards (one MAX all-reduce).
      const float8::Float8Tensor local = float8::to_float8_with_global_amax(
          source, float8->cast, /*axis_dim=*/-1, float8->round_scales_to_power_of_2,
          [&comm](at::Tensor& amax) { comm.all_reduce(amax, comm::ReduceOp::kMax); });
      st.float8 = true;
      st.float8_dtype = local.data.scalar_type();
      st.float8_scale = local.scale;
      source = local.data.view(at::kByte);
    }
    variable_list pieces;
    for (int k = 0; k < st.chunks; ++k) {
      const auto K = static_cast<size_t>(k);
      st.forward_sent[K] = source.narrow(1, k * piece_rows, piece_rows).contiguous();  // [B, s/c, D]
      st.forward_landing[K] = at::empty({st.n * st.forward_sent[K].numel()}, source.options());
      st.forward_work[K] = comm.all_gather_into_tensor_async(st.forward_landing[K], st.forward_sent[K].view({-1}));
      pieces.push_back(stand_in({x.size(0), piece_rows, x.size(2)}, x.options()));
    }
    keep_state(ctx, state);
    comm::save_comm(ctx, comm);
    return pieces;
  }

  // grads: per piece, the buffer a WaitChunkGather backward handed over while its
  // reduce-scatter was in flight (See Note [Deferred collective results]).
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    State state = state_of(ctx);
    std::vector<at::Tensor> parts;
    for (int k = 0; k < state->chunks; ++k) {
      const auto K = static_cast<size_t>(k);
      state->backward_work[K].wait();
      state->backward_sent[K] = at::Tensor();
      parts.push_back(grads[K]);
    }
    return {at::cat(parts, 1), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Forward: waits for chunk k and returns it gathered, [B, n s/c, D] (a stand-in when it travelled
// in float8: its data is in state->float8_chunks[k]). Backward: issues the reduce-scatter of its
// gradient and returns the (unfilled) output buffer.
struct WaitChunkGather : torch::autograd::Function<WaitChunkGather> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& piece, const State& state, int64_t k,
                            comm::Comm* group) {
    ChunkState& st = *state;
    const auto K = static_cast<size_t>(k);
    st.forward_work[K].wait();
    st.forward_sent[K] = at::Tensor();
    const std::vector<int64_t> shape = piece.sizes().vec();  // [B, s/c, D]
    at::Tensor landed = std::move(st.forward_landing[K]);
    keep_state(ctx, state);
    comm::save_comm(ctx, *group);
    ctx->saved_data["k"] = k;
    if (st.float8) {
      st.float8_chunks[K] = rank_major_to_rows(landed, st.n, shape).view(st.float8_dtype);
      return stand_in({shape[0], st.n * shape[1], shape[2]}, piece.options());
    }
    return rank_major_to_rows(landed, st.n, shape);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    State state = state_of(ctx);
    const auto K = static_cast<size_t>(ctx->saved_data["k"].toInt());
    const at::Tensor& g = grads[0];  // [B, n s/c, D]
    state->backward_sent[K] = rows_to_rank_major(g, state->n);
    at::Tensor out = at::empty({g.size(0), g.size(1) / state->n, g.size(2)}, g.options());
    state->backward_work[K] =
        comm::saved_comm(ctx).reduce_scatter_tensor_async(out.view({-1}), state->backward_sent[K].view({-1}));
    return {out, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// See Note [Sequence chunks]: the chunks of one module input, waited for on first use.
class ChunkedGather final : public model::SequenceChunks {
 public:
  ChunkedGather(State state, variable_list pieces, comm::Comm& comm)
      : state_(std::move(state)), pieces_(std::move(pieces)), comm_(comm) {
    operands_.resize(pieces_.size());
  }
  int count() const override { return state_->chunks; }
  const model::LinearOperand& chunk(int k) override {
    auto& slot = operands_.at(static_cast<size_t>(k));
    if (!slot) {
      at::Tensor rows = WaitChunkGather::apply(pieces_[static_cast<size_t>(k)], state_, k, &comm_);
      slot = state_->float8
                 ? model::LinearOperand(rows, {state_->float8_chunks[static_cast<size_t>(k)], state_->float8_scale})
                 : model::LinearOperand(rows);
    }
    return *slot;
  }
  // outputs[k] [B, n s/c, N]: rank t's rows of chunk k are sequence rows t s + k s/c + [0, s/c).
  at::Tensor assemble(const std::vector<at::Tensor>& outputs) const override {
    const int n = state_->n, c = state_->chunks;
    const at::Tensor& first = outputs.at(0);
    const int64_t B = first.size(0), rows = first.size(1) / n, N = first.size(2);
    return at::stack(outputs, 1).view({B, c, n, rows, N}).permute({0, 2, 1, 3, 4}).reshape({B, n * c * rows, N});
  }

 private:
  State state_;
  variable_list pieces_;
  comm::Comm& comm_;
  std::vector<std::optional<model::LinearOperand>> operands_;
};

// Forward: issues chunk k's reduce-scatter of y [B, n s/c, N] and returns its (unfilled) output
// [B, s/c, N]. Backward: waits for chunk k's all-gather (issued by AssembleScatteredChunks).
struct IssueChunkReduceScatter : torch::autograd::Function<IssueChunkReduceScatter> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& y, const State& state, int64_t k,
                            comm::Comm* group) {
    ChunkState& st = *state;
    const auto K = static_cast<size_t>(k);
    st.forward_sent[K] = rows_to_rank_major(y, st.n);
    at::Tensor out = at::empty({y.size(0), y.size(1) / st.n, y.size(2)}, y.options());
    st.forward_work[K] = group->reduce_scatter_tensor_async(out.view({-1}), st.forward_sent[K].view({-1}));
    keep_state(ctx, state);
    ctx->saved_data["k"] = k;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    State state = state_of(ctx);
    const auto K = static_cast<size_t>(ctx->saved_data["k"].toInt());
    state->backward_work[K].wait();
    state->backward_sent[K] = at::Tensor();
    const std::vector<int64_t> piece = grads[0].sizes().vec();  // [B, s/c, N]
    at::Tensor g = rank_major_to_rows(state->backward_landing[K], state->n, piece);
    state->backward_landing[K] = at::Tensor();
    return {g, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Forward: waits for every chunk's reduce-scatter and concatenates them, [B, s, N]. Backward:
// issues every chunk's all-gather (last chunk first: its backward runs first) and returns each
// chunk's local gradient.
struct AssembleScatteredChunks : torch::autograd::Function<AssembleScatteredChunks> {
  static at::Tensor forward(AutogradContext* ctx, at::TensorList outputs, const State& state, comm::Comm* group) {
    for (int k = 0; k < state->chunks; ++k) {
      state->forward_work[static_cast<size_t>(k)].wait();
      state->forward_sent[static_cast<size_t>(k)] = at::Tensor();
    }
    keep_state(ctx, state);
    comm::save_comm(ctx, *group);
    return at::cat(outputs, 1);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    State state = state_of(ctx);
    const int c = state->chunks;
    const int64_t rows = grads[0].size(1) / c;
    variable_list out(static_cast<size_t>(c));
    for (int k = c - 1; k >= 0; --k) {
      const auto K = static_cast<size_t>(k);
      state->backward_sent[K] = grads[0].narrow(1, k * rows, rows).contiguous();  // [B, s/c, N]
      state->backward_landing[K] = at::empty({state->n * state->backward_sent[K].numel()}, grads[0].options());
      state->backward_work[K] = comm::saved_comm(ctx).all_gather_into_tensor_async(state->backward_landing[K],
                                                                                   state->backward_sent[K].view({-1}));
      out[K] = state->backward_sent[K];
    }
    out.push_back(at::Tensor());  // state
    out.push_back(at::Tensor());  // group
    return out;
  }
};

State new_state(comm::Comm& comm, int chunks) {
  auto state = c10::make_intrusive<ChunkState>();
  state->n = comm.size();
  state->resize(chunks);
  return state;
}

void check_chunks(const char* what, int64_t rows, int chunks, const comm::Comm& comm) {
  if (chunks >= 1 && rows % chunks == 0) return;
  std::ostringstream os;
  os << "[rank " << comm.global_rank() << "] async tensor parallel: " << what << " of " << rows
     << " rows cannot be split into parallelism.async_tp_chunks = " << chunks
     << " chunks; choose a divisor of seq_len / tensor_parallel_degree";
  throw std::invalid_argument(os.str());
}

}  // namespace

model::ModuleInputHook make_async_sequence_gather(comm::Comm& comm, int chunks, std::optional<Float8ChunkCast> float8) {
  return [&comm, chunks, float8](const at::Tensor& x) {
    check_chunks("a sequence shard", x.size(1), chunks, comm);
    State state = new_state(comm, chunks);
    variable_list pieces = IssueChunkGathers::apply(x, state, float8, &comm);
    model::LinearOperand operand(stand_in({x.size(0), comm.size() * x.size(1), x.size(2)}, x.options()));
    operand.chunks = std::make_shared<ChunkedGather>(std::move(state), std::move(pieces), comm);
    return operand;
  };
}

at::Tensor chunked_matmul_reduce_scatter(const at::Tensor& x, const model::LinearOperand& weight,
                                         model::LinearCompute& multiply, comm::Comm& comm, int chunks) {
  const int n = comm.size();
  const int64_t B = x.size(0), S = x.size(1), K = x.size(2);
  check_chunks("the row-parallel output's sequence", S, n, comm);
  const int64_t shard = S / n;
  check_chunks("a sequence shard", shard, chunks, comm);
  const int64_t rows = shard / chunks;
  State state = new_state(comm, chunks);
  std::vector<at::Tensor> outputs;
  // Chunk k: for every destination rank t, its rows t s + k s/c + [0, s/c).
  const at::Tensor grouped = x.reshape({B, n, chunks, rows, K});
  for (int k = 0; k < chunks; ++k) {
    at::Tensor x_k = grouped.select(2, k).reshape({B, n * rows, K});      // [B, n s/c, K]
    at::Tensor y_k = multiply.forward(x_k, weight);                       // [B, n s/c, N] partial
    outputs.push_back(IssueChunkReduceScatter::apply(y_k, state, k, &comm));  // [B, s/c, N] in flight
  }
  return AssembleScatteredChunks::apply(at::TensorList(outputs), state, &comm);  // [B, s, N]
}

}  // namespace titan::parallel::tensor_parallel
