// parallel/pipeline/pipeline_schedule.h — the pipeline-parallel schedule: this rank's stages run the actions
// of the plan's order, passing activations forward and gradients backward over the pp dimension.
//
// Note [Pipeline execution]: each pp rank runs its own list of actions (the plan's order with
// the idle slots dropped). Transfers are point-to-point over the mesh's pp group (Note
// [Point-to-point] in process_group.h), tagged by (stage, micro-batch, direction), so a send and
// its receive meet whatever else is in flight; sends are posted as soon as a stage's output (or
// input gradient) exists and waited for once the receiver is known to have taken them (Note
// [Retiring sends] in pipeline_schedule.cpp) or at the end of the pass, and each rank posts the
// receives of its next two actions that need one before it computes, so a neighbour's tensor
// arrives while this stage works. Shapes and dtypes follow from the config on both sides
// (micro-batch rows x seq_len / tp under sequence parallel x dim, in the compute dtype): no
// shape handshake between stages. Stages on the same rank (the V placement's turn) hand tensors
// over in memory.
//
// A stage's forward input is a fresh leaf, so its backward ends there and yields the gradient
// the previous stage needs. B runs the stage's whole backward. The zero-bubble schedules split it:
// I runs the whole backward except the linears' weight-gradient GEMMs, which it defers with the
// operands they need (each linear's output gradient and input; Note [Deferred weight gradients]
// in model/linear.h), and keeps the graph; W runs only those GEMMs and delivers their results
// through each weight's autograd path. Nothing is computed twice. The small weights (norms,
// embedding) and the other linear computes (float8, int8, the MoE experts) get their gradients
// in I. Under activation checkpointing a block's recompute computes both gradients in one go, so
// there I runs the whole backward and W has nothing left to do; the numbers are the same either
// way.
//
// Loss: the last stage computes every micro-batch's loss sum; each backward runs on sum /
// global_tokens (See Note [Loss scaling] in schedule.h), so the step's gradient is the global
// token mean's, as without PP. The step's loss sum is shared over the pp group (the other
// stages add 0), so every rank logs the real loss.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <chrono>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "parallel/pipeline/plan.h"
#include "parallel/pipeline/schedule.h"

namespace titan::parallel::pipeline {

// When this rank ran each of its actions in the last step, for the printed timeline.
struct ActionTiming {
  Action action;
  double start_seconds = 0;  // from the start of the step
  double end_seconds = 0;
};

class PipelineSchedule : public Schedule {
 public:
  // `boundary_seq`: the sequence length of the tensors between stages on this rank (seq_len,
  // divided by tp under sequence parallel); `split_backward_weights`: false under activation
  // checkpointing (See Note [Pipeline execution]).
  PipelineSchedule(model::Transformer& model, MicrobatchHooks& hooks, comm::DeviceMesh& mesh, PipelinePlan plan,
                   c10::Device device, at::ScalarType boundary_dtype, int64_t boundary_seq,
                   bool split_backward_weights);
  std::string describe() const override;
  double step(const at::Tensor& inputs, const at::Tensor& labels, double global_tokens) override;
  // Validation: the rows in micro-batches of the plan's size, each run forward through this
  // rank's stages in stage order (a forward-only schedule cannot deadlock: every stage's input
  // comes from a lower stage), without autograd; the loss sum all-reduced over pp.
  double evaluate(const at::Tensor& inputs, const at::Tensor& labels) override;

  // See Note [Pipeline timeline] in pipeline_schedule.cpp.
  std::vector<std::string> timeline() const override;
  const PipelinePlan& plan() const { return plan_; }
  const std::vector<ActionTiming>& last_step_timings() const { return timings_; }

 private:
  struct MicrobatchState;
  struct Pass;
  void run_pass(Pass& pass);
  void forward(Pass& pass, const Action& a);
  void backward(Pass& pass, const Action& a);
  // The receives of the next actions (from index `from`) that need one, up to two, if not posted.
  void post_receives(Pass& pass, size_t from);
  at::Tensor take_input(Pass& pass, const Action& a, bool gradient);
  void hand_over(Pass& pass, const at::Tensor& tensor, int to_stage, int64_t microbatch, bool gradient,
                 const Action& from);
  int tag(int stage, int64_t microbatch, bool gradient) const;
  // The index in its rank's order of the action running stage `stage`'s forward (or its
  // backward: B or I) of `microbatch` (See Note [Retiring sends] in pipeline_schedule.cpp).
  size_t position(int stage, int64_t microbatch, bool backward) const;
  // Waits for pass.outgoing[index]'s send; a failure names the action, micro-batch and peer.
  void wait_send(Pass& pass, size_t index) const;
  std::string where(const Action& a) const;

  model::Transformer& model_;
  MicrobatchHooks& hooks_;
  comm::DeviceMesh& mesh_;
  PipelinePlan plan_;
  c10::Device device_;
  at::ScalarType boundary_dtype_;
  int64_t boundary_seq_;
  bool split_backward_weights_;
  int pp_rank_;
  std::map<std::tuple<int, int64_t, bool>, size_t> position_;  // (stage, micro-batch, backward) -> index
  std::vector<ActionTiming> timings_;
  std::chrono::steady_clock::time_point step_start_;
  double step_seconds_ = 0;
  double waited_seconds_ = 0;  // the current action's wait for its input  // the last step's schedule, first action to the loss all-reduce
};

}  // namespace titan::parallel::pipeline
