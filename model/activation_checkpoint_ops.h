// model/activation_checkpoint_ops.h — the op layer that per-op selective activation checkpointing acts on.
//
// Code that runs an op worth keeping for backward (a matrix product, attention, a TP
// reduce-scatter, a float8 amax reduction) calls it through `checkpointable_op(name, fn)`.
// Outside an activation-checkpointing context that is just `fn()`. Inside a block checkpointed
// per op (parallel/activation_checkpoint.h), the block's forward runs twice:
//   record  (first forward, no grad): fn() runs; if the policy keeps `name`, its output is stored;
//   replay  (recompute in backward, with grad): a stored output is returned INSTEAD of running
//           fn(); every other op is recomputed.
// The policy is a table the store is built with: the one per-op AC uses lives beside apply_ac,
// parallel::selective_ac_save_list() (See Note [Op save list] in parallel/activation_checkpoint.cpp).
// Ops called inside a kept op are skipped with it in the replay.
//
// Note [Replay needs no autograd history]:
// A replayed output has no autograd history of its own, so callers put checkpointable_op where
// that does not matter: inside the forward of a custom autograd Function (which owns the
// backward and saves what it needs itself, e.g. the linear's x and W), or around a
// non-differentiable op (amax). That is why every linear, whatever its arithmetic, runs through
// one autograd Function (Note [One linear skeleton] in model/linear_autograd.h) and attention
// goes through attention_op() below.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace titan::model {

// One row of the save list: an op name callers use, and whether only every second call of it
// in a block is kept (torchtitan keeps the 1st, 3rd, 5th ... mm and recomputes the others).
struct SaveListEntry {
  const char* op;
  bool every_second;
  const char* why;
};
using SaveList = std::vector<SaveListEntry>;

enum class OpCheckpointPhase { kRecord, kReplay };

// What one checkpointed block keeps between its first forward and its recompute.
class OpCheckpointStore {
 public:
  // `save_list` must outlive the store (the policy tables are static).
  explicit OpCheckpointStore(const SaveList& save_list) : save_list_(&save_list) {}
  const SaveList& save_list() const { return *save_list_; }
  struct Entry {
    std::string op;    // the name passed to checkpointable_op
    bool kept = false;
    std::vector<at::Tensor> outputs;  // the op's outputs while kept (handed over in replay)
    size_t nested_end = 0;  // entries of ops called inside this one end here (exclusive)
  };
  const std::vector<Entry>& entries() const { return entries_; }
  std::vector<std::string> kept_ops() const;  // names of kept outputs, in call order
  int64_t kept_bytes() const;
  void clear() { entries_.clear(); }

 private:
  friend std::vector<at::Tensor> checkpointable_op_multi(
      const char*, const std::function<std::vector<at::Tensor>()>&);
  const SaveList* save_list_;
  std::vector<Entry> entries_;
  size_t replay_pos_ = 0;
  std::vector<int64_t> counts_;  // calls per save-list row in this pass
  friend class OpCheckpointScope;
};

// Makes `store` the current store of this thread in `phase` for its lifetime (nestable; the
// previous one is restored). Replay checks that it consumed exactly what record produced.
class OpCheckpointScope {
 public:
  OpCheckpointScope(OpCheckpointStore* store, OpCheckpointPhase phase);
  ~OpCheckpointScope() noexcept(false);
  OpCheckpointScope(const OpCheckpointScope&) = delete;
  OpCheckpointScope& operator=(const OpCheckpointScope&) = delete;

 private:
  OpCheckpointStore* prev_store_;
  OpCheckpointPhase prev_phase_;
  OpCheckpointStore* store_;
  OpCheckpointPhase phase_;
  int uncaught_;
};

// Suspends any current store (e.g. while the recompute runs its backward, where float8's
// backward casts call amax again and must not consume replayed outputs).
class OpCheckpointPause {
 public:
  OpCheckpointPause();
  ~OpCheckpointPause();

 private:
  OpCheckpointStore* prev_store_;
};

// See the file comment. `name` should be a row of the save list or a descriptive name of an op
// deliberately left off it ("abs", "cast"), so tests can see what was offered and not kept.
at::Tensor checkpointable_op(const char* name, const std::function<at::Tensor()>& fn);
// The same for an op with several outputs (kept or recomputed together).
std::vector<at::Tensor> checkpointable_op_multi(const char* name,
                                                const std::function<std::vector<at::Tensor>()>& fn);

// Whether a per-op checkpointing store is current on this thread (record or replay): code that
// would split an op across autograd Functions (an exchange issued in one, waited in another) runs
// it whole instead, so it can be kept and replayed as one op.
bool op_checkpoint_active();

// Scaled dot-product attention through the op layer (kept as "sdpa").
// q [B, H, S, qk_hd], k [B, KV, S, qk_hd], v [B, KV, S, v_hd] -> [B, H, S, v_hd]; causal, no
// dropout; `scale` of q . k, unset 1 / sqrt(qk_hd) (See Note [Attention head sizes and scale] in
// model/kernels/attention.h).
at::Tensor attention_op(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                        std::optional<double> scale = std::nullopt);

}  // namespace titan::model
