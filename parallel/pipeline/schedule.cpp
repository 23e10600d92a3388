// parallel/pipeline/schedule.cpp — see schedule.h.
#include "parallel/pipeline/schedule.h"

#include <ATen/core/grad_mode.h>

#include <torch/csrc/autograd/autograd.h>

#include <cctype>
#include <sstream>
#include <stdexcept>

#include "model/transformer.h"
#include "model/scope.h"
#include "parallel/context_parallel/sequence_shard.h"

namespace titan::parallel::pipeline {

std::string Action::str() const {
  return std::to_string(stage) + static_cast<char>(type) + std::to_string(microbatch);
}

Action parse_action(const std::string& text) {
  auto fail = [&]() -> Action {
    throw std::invalid_argument("schedule action '" + text +
                                "' is not <stage><F|B|I|W><micro-batch>, e.g. 0F1 (stage 0, forward of micro-batch 1)");
  };
  size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
  if (i == 0 || i + 1 >= text.size() || std::string("FBIW").find(text[i]) == std::string::npos) return fail();
  for (size_t j = i + 1; j < text.size(); ++j)
    if (!std::isdigit(static_cast<unsigned char>(text[j]))) return fail();
  if (i > 6 || text.size() - i - 1 > 9) return fail();  // no overflow: stages and micro-batches are small
  Action a;
  a.stage = std::stoi(text.substr(0, i));
  a.type = static_cast<ActionType>(text[i]);
  a.microbatch = std::stoll(text.substr(i + 1));
  return a;
}

std::vector<Action> single_stage_actions(int64_t microbatches) {
  std::vector<Action> actions;
  for (int64_t m = 0; m < microbatches; ++m) {
    actions.push_back({0, ActionType::kForward, m});
    actions.push_back({0, ActionType::kBackward, m});
  }
  return actions;
}

SingleStageSchedule::SingleStageSchedule(model::Transformer& model, MicrobatchHooks& hooks, const comm::DeviceMesh& mesh,
                                         int64_t microbatches, c10::Device device)
    : model_(model), hooks_(hooks), mesh_(mesh), microbatches_(microbatches), device_(device) {
  if (microbatches < 1)
    throw std::invalid_argument("a schedule needs at least one micro-batch, got " + std::to_string(microbatches));
  actions_ = single_stage_actions(microbatches);
}

std::string SingleStageSchedule::describe() const {
  std::ostringstream os;
  os << "schedule: gradient accumulation (one stage), " << microbatches_ << " micro-batch"
     << (microbatches_ == 1 ? "" : "es") << ":";
  const size_t shown = std::min<size_t>(actions_.size(), 8);
  for (size_t i = 0; i < shown; ++i) os << " " << actions_[i].str();
  if (shown < actions_.size()) os << " ... " << actions_.back().str();
  return os.str();
}

double SingleStageSchedule::step(const at::Tensor& inputs, const at::Tensor& labels, double global_tokens) {
  TORCH_CHECK(inputs.size(0) % microbatches_ == 0, "schedule: ", inputs.size(0), " rows do not split into ",
              microbatches_, " micro-batches");
  const int64_t rows = inputs.size(0) / microbatches_;
  std::vector<at::Tensor> losses(static_cast<size_t>(microbatches_));  // a forward's loss until its backward
  double loss_sum = 0;
  for (const Action& action : actions_) {
    at::Tensor& loss = losses[static_cast<size_t>(action.microbatch)];
    TORCH_CHECK(action.type == ActionType::kForward || action.type == ActionType::kBackward,
                "the single-stage schedule runs F and B actions only, got ", action.str());
    if (action.type == ActionType::kForward) {
      const int64_t first = action.microbatch * rows;
      loss = forward(inputs.narrow(0, first, rows), labels.narrow(0, first, rows));
    } else {
      backward(loss, global_tokens);
      loss_sum += loss.item<double>();  // in micro-batch order: the same sum for every split of the work
      loss = at::Tensor();              // its graph is gone after backward; drop the scalar too
    }
  }
  return loss_sum;
}

double SingleStageSchedule::evaluate(const at::Tensor& inputs, const at::Tensor& labels) {
  at::NoGradGuard no_grad;
  return forward(inputs, labels).item<double>();
}

at::Tensor SingleStageSchedule::forward(const at::Tensor& inputs, const at::Tensor& labels) {
  const context_parallel::SequenceShard shard =
      context_parallel::shard_sequence(mesh_, inputs.to(device_), labels.to(device_), model_.args(),
      model_.rope_table());
  {
    model::NamedScope scope("bind params", model::MemoryCategory::kParameters);
    hooks_.bind_compute_params();  // compute-dtype copies of the masters (not under FSDP)
  }
  model::NamedScope scope("forward", model::MemoryCategory::kActivations);
  at::Tensor logits = model_.forward(shard.inputs, shard.rope, shard.documents);  // [b, S, V] (loss parallel: [b, S, V/tp])
  return hooks_.loss_sum(logits, shard.labels, shard.documents);  // sum over this rank's tokens
}

void SingleStageSchedule::backward(const at::Tensor& loss_sum, double global_tokens) {
  model::NamedScope scope("backward", model::MemoryCategory::kGradients);
  torch::autograd::backward({loss_sum / global_tokens});
  hooks_.after_backward();  // FSDP: any gradient not yet reduce-scattered
}

}  // namespace titan::parallel::pipeline
