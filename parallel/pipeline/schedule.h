// parallel/pipeline/schedule.h — the micro-batch schedule: in which order this rank runs the forward and
// backward passes of one step's micro-batches (torchtitan's pipeline schedules; PyTorch's
// torch.distributed.pipelining `step`).
//
// Note [Schedules as data]: a schedule is a list of actions per rank, each written as torchtitan's
// schedule CSV writes it, "<stage><F|B><micro-batch>": "0F1" is stage 0's forward of micro-batch
// 1, "0B1" its backward. The runner executes the list in order; nothing else decides what runs
// when. Gradient accumulation without pipeline parallelism is the one-stage schedule
//
//     0F0 0B0 0F1 0B1 ... 0F(n-1) 0B(n-1)
//
// (each micro-batch's backward right after its forward, so one micro-batch's activations are
// alive at a time). Pipeline schedules (GPipe, 1F1B, interleaved, zero-bubble) are other lists,
// over more stages, with the transfers between stages; the trainer's step does not change.
//
// Note [Loss scaling]: every micro-batch's loss is the SUM of its token losses; its backward runs
// on sum / global_tokens (the tokens of the whole step: every micro-batch of every data-parallel
// rank), so the accumulated gradient is the gradient of the global token-mean loss however the
// step is split, and the data-parallel ranks' gradients are then summed (FSDP's reduce-scatter,
// HSDP's all-reduce).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

namespace titan::model {
class Transformer;
}

namespace titan::parallel::comm {
class DeviceMesh;
}

namespace titan::parallel::pipeline {

// Note [What a schedule sees of the model]: a schedule runs micro-batches through model parts;
// of the parallelized model (parallel/parallel_model.h, which implements this) it calls only
// these three, around each micro-batch. The trainer owns the schedule beside the model parts
// and finishes the step's gradients itself (ParallelModel::finish_gradients).
class MicrobatchHooks {
 public:
  virtual ~MicrobatchHooks() = default;
  // Before each micro-batch's forward: points the model at the parameters the forward reads
  // (compute-dtype copies of the masters; FSDP's gathers make their own).
  virtual void bind_compute_params() = 0;
  // The sum over tokens of the cross entropy of one micro-batch's logits (vocab-parallel under
  // loss parallel; with multi-token prediction's depths: model/mtp.h). `documents`: the rows'
  // documents (model::document_ids) or undefined.
  virtual at::Tensor loss_sum(const at::Tensor& logits, const at::Tensor& labels, const at::Tensor& documents) = 0;
  // After a micro-batch's backward (under pipeline parallelism: after the step's last one):
  // FSDP's gradient reduce-scatters that are still pending.
  virtual void after_backward() = 0;
};

// As torch.distributed.pipelining names them: B is a full backward; zero-bubble schedules split it
// into I (the gradient of the stage's input, which the previous stage waits for) and W (the
// gradient of the stage's weights, run where the schedule has a bubble to fill).
enum class ActionType : char { kForward = 'F', kBackward = 'B', kBackwardInput = 'I', kBackwardWeight = 'W' };

struct Action {
  int stage = 0;
  ActionType type = ActionType::kForward;
  int64_t microbatch = 0;

  std::string str() const;  // "0F1"
  bool operator==(const Action& other) const {
    return stage == other.stage && type == other.type && microbatch == other.microbatch;
  }
};
// "0F1" -> {0, kForward, 1}; the types F, B, I, W. Throws std::invalid_argument quoting `text`
// and the valid form.
Action parse_action(const std::string& text);

// The one-stage schedule's actions for `microbatches` micro-batches: 0F0 0B0 0F1 0B1 ...
std::vector<Action> single_stage_actions(int64_t microbatches);

// One step's forward and backward passes over this rank's rows, by a list of actions.
class Schedule {
 public:
  virtual ~Schedule() = default;
  // For the start-up plan: the name, the stages and micro-batches, and this rank's actions.
  virtual std::string describe() const = 0;
  const std::vector<Action>& actions() const { return actions_; }
  // Runs this rank's actions over inputs / labels [rows, S] int64 (this rank's rows of the
  // global batch, on any device; the rows are split into equal micro-batches). Returns this
  // rank's sum of token losses (See Note [Loss scaling]).
  virtual double step(const at::Tensor& inputs, const at::Tensor& labels, double global_tokens) = 0;
  // Forward only, without autograd (validation): this rank's sum of token losses over inputs /
  // labels [rows, S], split as the schedule splits a step's rows (the pipeline: into its
  // micro-batches, every one run forward through this rank's stages in order). Touches no
  // gradient and no optimizer state; activation checkpointing and FSDP's kept parameters do not
  // apply without autograd.
  virtual double evaluate(const at::Tensor& inputs, const at::Tensor& labels) = 0;
  // What this rank ran in the last step, as text lines (the pipeline's timeline); empty when the
  // schedule has nothing to show (gradient accumulation).
  virtual std::vector<std::string> timeline() const { return {}; }

 protected:
  std::vector<Action> actions_;
};

// Gradient accumulation: the whole model is stage 0 of this rank (See Note [Schedules as data]).
class SingleStageSchedule : public Schedule {
 public:
  SingleStageSchedule(model::Transformer& model, MicrobatchHooks& hooks, const comm::DeviceMesh& mesh,
                      int64_t microbatches, c10::Device device);
  std::string describe() const override;
  double step(const at::Tensor& inputs, const at::Tensor& labels, double global_tokens) override;
  double evaluate(const at::Tensor& inputs, const at::Tensor& labels) override;

 private:
  // Forward of one micro-batch: its loss sum (a scalar with its autograd graph).
  at::Tensor forward(const at::Tensor& inputs, const at::Tensor& labels);
  // Backward of one micro-batch's loss sum, scaled by 1 / global_tokens.
  void backward(const at::Tensor& loss_sum, double global_tokens);

  model::Transformer& model_;
  MicrobatchHooks& hooks_;
  const comm::DeviceMesh& mesh_;
  int64_t microbatches_;
  c10::Device device_;
};

}  // namespace titan::parallel::pipeline
