#include "model/activation_checkpoint_ops.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_backward.h>
#include <ATen/ops/repeat_interleave.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>

#include <exception>

#include "model/attention_blocks.h"
#include "model/kernels/attention.h"

namespace titan::model {

namespace {

thread_local OpCheckpointStore* t_store = nullptr;
thread_local OpCheckpointPhase t_phase = OpCheckpointPhase::kRecord;

// Index of `op` in `list`, -1 if absent.
int save_list_row(const SaveList& list, const char* op) {
  for (size_t i = 0; i < list.size(); ++i)
    if (std::string(op) == list[i].op) return static_cast<int>(i);
  return -1;
}

}  // namespace

std::vector<std::string> OpCheckpointStore::kept_ops() const {
  std::vector<std::string> out;
  for (const auto& e : entries_)
    if (e.kept) out.push_back(e.op);
  return out;
}

int64_t OpCheckpointStore::kept_bytes() const {
  int64_t bytes = 0;
  for (const auto& e : entries_)
    for (const auto& t : e.outputs)
      if (t.defined()) bytes += static_cast<int64_t>(t.nbytes());
  return bytes;
}

OpCheckpointScope::OpCheckpointScope(OpCheckpointStore* store, OpCheckpointPhase phase)
    : prev_store_(t_store), prev_phase_(t_phase), store_(store), phase_(phase),
      uncaught_(std::uncaught_exceptions()) {
  TORCH_CHECK(store != nullptr, "OpCheckpointScope needs a store");
  if (phase == OpCheckpointPhase::kRecord) store->entries_.clear();
  store->replay_pos_ = 0;
  store->counts_.assign(store->save_list_->size(), 0);
  t_store = store;
  t_phase = phase;
}

OpCheckpointScope::~OpCheckpointScope() noexcept(false) {
  t_store = prev_store_;
  t_phase = prev_phase_;
  const bool unwinding = std::uncaught_exceptions() > uncaught_;
  if (!unwinding && phase_ == OpCheckpointPhase::kReplay)
    TORCH_CHECK(store_->replay_pos_ == store_->entries_.size(),
                "selective AC: the recompute ran ", store_->replay_pos_,
                " checkpointable ops but the first forward ran ", store_->entries_.size(),
                " (the block's forward must be deterministic in its op sequence)");
}

OpCheckpointPause::OpCheckpointPause() : prev_store_(t_store) { t_store = nullptr; }
OpCheckpointPause::~OpCheckpointPause() { t_store = prev_store_; }

std::vector<at::Tensor> checkpointable_op_multi(
    const char* name, const std::function<std::vector<at::Tensor>()>& fn) {
  OpCheckpointStore* store = t_store;
  if (store == nullptr) return fn();
  if (t_phase == OpCheckpointPhase::kRecord) {
    // The entry is reserved before fn runs, so ops nested inside it (float8's amax inside a
    // float8 GEMM) are recorded after it and can be skipped together in the replay.
    const size_t index = store->entries_.size();
    store->entries_.emplace_back();
    store->entries_[index].op = name;
    bool kept = false;
    const int row = save_list_row(*store->save_list_, name);
    if (row >= 0) {
      const int64_t n = ++store->counts_[row];  // 1-based call number of this op in the block
      kept = !(*store->save_list_)[row].every_second || n % 2 == 1;
    }
    std::vector<at::Tensor> out = fn();
    OpCheckpointStore::Entry& entry = store->entries_[index];
    entry.kept = kept;
    entry.nested_end = store->entries_.size();
    if (kept)
      for (const auto& t : out) entry.outputs.push_back(t.defined() ? t.detach() : t);
    return out;
  }
  TORCH_CHECK(store->replay_pos_ < store->entries_.size(), "selective AC: the recompute ran more "
              "checkpointable ops than the first forward (", store->entries_.size(), "); extra: ", name);
  OpCheckpointStore::Entry& entry = store->entries_[store->replay_pos_++];
  TORCH_CHECK(entry.op == name, "selective AC: op #", store->replay_pos_, " was '", entry.op,
              "' in the first forward but '", name, "' in the recompute");
  if (!entry.kept) return fn();
  // Ops nested in a kept op do not run again: release what they kept and skip them.
  for (size_t i = store->replay_pos_; i < entry.nested_end; ++i) store->entries_[i].outputs.clear();
  store->replay_pos_ = entry.nested_end;
  return std::move(entry.outputs);  // handed over: the store no longer holds them
}

bool op_checkpoint_active() { return t_store != nullptr; }

at::Tensor checkpointable_op(const char* name, const std::function<at::Tensor()>& fn) {
  return checkpointable_op_multi(name, [&] { return std::vector<at::Tensor>{fn()}; })[0];
}

// ---------------------------------------------------------------- attention

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The CPU attention kernels as an autograd Function, so its forward can be replayed
// (See Note [Replay needs no autograd history]): the backward needs q, k, v, out and the
// logsumexp, all of which are saved here, and never the forward's history. `titan_kernel`
// (attention_op decides it once): titan's bf16 kernel (model/kernels/attention.h; grouped-query
// k/v and unequal head sizes as they are), else the two ATen flash kernels
// at::scaled_dot_product_attention's autograd uses on the CPU (k/v repeated to every query head by
// attention_op; a v of another head size padded, Note [Equal head sizes for LibTorch's flash
// kernels] in model/attention_blocks.h). What is kept and saved is the unpadded out
// [B, H, S, v_hd].
struct CpuFlashAttention : public torch::autograd::Function<CpuFlashAttention> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               bool titan_kernel, std::optional<double> scale) {
    // out [B, H, S, v_hd], logsumexp [B, H, S] float32: kept or recomputed together.
    auto r = checkpointable_op_multi("sdpa", [&] {
      if (titan_kernel) {
        auto [out, lse] = cpu_attention_forward(q, k, v, /*causal=*/true, scale);
        return std::vector<at::Tensor>{out, lse};
      }
      const EqualHeadOperands e = equal_head_operands(q, k, v, scale);
      auto [out, lse] =
          at::_scaled_dot_product_flash_attention_for_cpu(e.q, e.k, e.v, 0.0, /*is_causal=*/true, {}, e.scale);
      return std::vector<at::Tensor>{out.narrow(-1, 0, e.v_head_dim), lse};
    });
    ctx->save_for_backward({q, k, v, r[0], r[1]});
    ctx->saved_data["titan_kernel"] = titan_kernel;
    ctx->saved_data["scale"] = scale;
    return {r[0]};
  }

  // The gradient goes to LibTorch's backward as it comes (See Note [Attention gradient as it comes]).
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto s = ctx->get_saved_variables();
    const std::optional<double> scale = ctx->saved_data["scale"].toOptional<double>();
    if (ctx->saved_data["titan_kernel"].toBool()) {
      auto g = cpu_attention_backward(grads[0], s[0], s[1], s[2], s[3], s[4], /*causal=*/true, s[0].scalar_type(),
                                      scale);
      return {std::get<0>(g), std::get<1>(g), std::get<2>(g), at::Tensor(), at::Tensor()};
    }
    const EqualHeadOperands e = equal_head_operands(s[0], s[1], s[2], scale);
    auto g = at::_scaled_dot_product_flash_attention_for_cpu_backward(
        pad_head_dim(grads[0], e.head_dim), e.q, e.k, e.v, pad_head_dim(s[3], e.head_dim), s[4], 0.0,
        /*is_causal=*/true, {}, e.scale);
    if (e.qk_head_dim == e.v_head_dim)
      return {std::get<0>(g), std::get<1>(g), std::get<2>(g), at::Tensor(), at::Tensor()};
    return {std::get<0>(g).narrow(-1, 0, e.qk_head_dim), std::get<1>(g).narrow(-1, 0, e.qk_head_dim),
            std::get<2>(g).narrow(-1, 0, e.v_head_dim), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor attention_op(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, std::optional<double> scale) {
  const auto dt = q.scalar_type();
  const bool cpu_flash = q.device().is_cpu() &&
                         (dt == at::kFloat || dt == at::kBFloat16 || dt == at::kHalf);
  if (!cpu_flash) {
    // TODO(ac): CUDA/float64 take the generic kernel, which selective AC recomputes (its
    // autograd node cannot be rebuilt from a kept output without a per-backend Function). It
    // takes a v of another head size and the scale itself.
    return at::scaled_dot_product_attention(q, k, v, std::nullopt, 0.0, /*is_causal=*/true,
                                            scale, /*enable_gqa=*/q.size(1) != k.size(1));
  }
  const bool titan_kernel = cpu_attention_kernel_applies(q, v);
  at::Tensor kk = k, vv = v;
  // GQA for LibTorch's kernel: repeat each kv head, as SDPA's math path does (titan's takes them as they are)
  if (q.size(1) != k.size(1) && !titan_kernel) {
    const int64_t rep = q.size(1) / k.size(1);
    kk = k.repeat_interleave(rep, 1);
    vv = v.repeat_interleave(rep, 1);
  }
  return CpuFlashAttention::apply(q, kk, vv, titan_kernel, scale)[0];
}

}  // namespace titan::model
