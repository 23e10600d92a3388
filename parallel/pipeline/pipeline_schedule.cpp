// parallel/pipeline/pipeline_schedule.cpp — see pipeline_schedule.h.
#include "parallel/pipeline/pipeline_schedule.h"

#include <ATen/core/grad_mode.h>

#include <ATen/ops/empty.h>
#include <ATen/ops/tensor.h>
#include <torch/csrc/autograd/autograd.h>

#include <map>
#include <memory>
#include <sstream>
#include <tuple>

#include "model/linear.h"
#include "model/scope.h"
#include "parallel/comm/mesh.h"
#include "parallel/context_parallel/sequence_shard.h"

namespace titan::parallel::pipeline {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

struct PipelineSchedule::MicrobatchState {
  at::Tensor input;        // tokens on the first stage, else a leaf of the received hidden states
  at::Tensor output;       // hidden states; on the last stage the loss sum / global_tokens
  // What a split I left for its W: the linears' weight gradients (Note [Deferred weight gradients]).
  std::unique_ptr<model::DeferredWeightGrads> deferred;
};

struct PipelineSchedule::Pass {
  struct Incoming {
    at::Tensor buffer;
    comm::CommWork work;  // empty for a hand-over between stages of this rank
  };
  struct Outgoing {
    comm::CommWork work;
    at::Tensor tensor;  // alive until the send completed
    Action from;
    int to_stage;
    bool gradient;
    int to_rank;
    size_t consumed_at;  // the receiving action's index in to_rank's order (Note [Retiring sends])
  };
  const std::vector<Action>* actions = nullptr;  // what this pass runs: the schedule's, or validation's
  bool evaluate = false;      // forward only, no autograd: nothing is kept for a backward
  at::Tensor inputs, labels;  // this pass's rows
  double global_tokens = 0;
  std::map<std::pair<int, int64_t>, MicrobatchState> states;        // (stage, micro-batch)
  std::map<std::tuple<int, int64_t, bool>, Incoming> incoming;     // (to stage, micro-batch, gradient)
  std::vector<Outgoing> outgoing;
  std::vector<double> losses;  // per micro-batch, on the last stage
};

// Note [Retiring sends]: a send completes once its receiver took the tensor, and until then it
// holds the tensor: a stage's output after its backward freed the rest of the micro-batch, an
// input gradient after the stage is done with it. Kept to the end of the pass, those are two
// [rows, seq, dim] tensors per micro-batch on every middle stage (torch's schedules keep theirs
// so too): at 32 micro-batches more than a stage's saved activations under 1F1B. A rank cannot
// ask Gloo whether a send is done without waiting on it, but it can know: when a tensor arrives
// from the peer made by an action at or after the one that takes this rank's tensor in the
// peer's order, that action has taken it, and waiting on the send returns at once. Each received
// tensor retires the sends it proves taken; the rest are waited for at the end of the pass.

PipelineSchedule::PipelineSchedule(model::Transformer& model, MicrobatchHooks& hooks, comm::DeviceMesh& mesh,
                                   PipelinePlan plan, c10::Device device, at::ScalarType boundary_dtype,
                                   int64_t boundary_seq, bool split_backward_weights)
    : model_(model),
      hooks_(hooks),
      mesh_(mesh),
      plan_(std::move(plan)),
      device_(device),
      boundary_dtype_(boundary_dtype),
      boundary_seq_(boundary_seq),
      split_backward_weights_(split_backward_weights),
      pp_rank_(mesh.local_rank(comm::MeshDim::kPp)) {
  TORCH_CHECK(mesh.size(comm::MeshDim::kPp) == plan_.pp, "the pipeline plan is for ", plan_.pp, " ranks, the mesh has ",
              mesh.size(comm::MeshDim::kPp));
  for (const auto& slot : (*plan_.order)[static_cast<size_t>(pp_rank_)])
    if (slot) actions_.push_back(*slot);
  for (const auto& rank_order : *plan_.order) {
    size_t index = 0;
    for (const auto& slot : rank_order) {
      if (!slot) continue;
      if (slot->type != ActionType::kBackwardWeight)
        position_.emplace(std::make_tuple(slot->stage, slot->microbatch, slot->type != ActionType::kForward), index);
      ++index;
    }
  }
}

size_t PipelineSchedule::position(int stage, int64_t microbatch, bool backward) const {
  auto it = position_.find(std::make_tuple(stage, microbatch, backward));
  TORCH_CHECK(it != position_.end(), "pipeline: no ", backward ? "backward" : "forward", " of micro-batch ", microbatch,
              " on stage ", stage, " in the plan's order");
  return it->second;
}

void PipelineSchedule::wait_send(Pass& pass, size_t index) const {
  Pass::Outgoing& out = pass.outgoing[index];
  try {
    out.work.wait();
  } catch (const comm::CommError& e) {
    throw comm::CommError(where(out.from) + ": sending the " + (out.gradient ? "input gradient" : "activations") +
                          " of micro-batch " + std::to_string(out.from.microbatch) + " to stage " +
                          std::to_string(out.to_stage) + " (pp rank " + std::to_string(out.to_rank) +
                          ") failed: " + e.what());
  }
}

std::string PipelineSchedule::describe() const {
  std::ostringstream os;
  os << "schedule: pipeline " << plan_.schedule_name << ", pp rank " << pp_rank_ << " runs " << actions_.size()
     << " actions per pass:";
  const size_t shown = std::min<size_t>(actions_.size(), 12);
  for (size_t i = 0; i < shown; ++i) os << " " << actions_[i].str();
  if (shown < actions_.size()) os << " ... " << actions_.back().str();
  return os.str();
}

int PipelineSchedule::tag(int stage, int64_t microbatch, bool gradient) const {
  return static_cast<int>((microbatch * plan_.num_stages() + stage) * 2 + (gradient ? 1 : 0));
}

std::string PipelineSchedule::where(const Action& a) const {
  return "pipeline: pp rank " + std::to_string(pp_rank_) + " (global rank " +
         std::to_string(mesh_.comm(comm::MeshDim::kPp) ? mesh_.comm(comm::MeshDim::kPp)->global_rank() : 0) + "), stage " +
         std::to_string(a.stage) + ", action " + a.str();
}

double PipelineSchedule::step(const at::Tensor& inputs, const at::Tensor& labels, double global_tokens) {
  const int64_t pass_rows = plan_.microbatches * plan_.microbatch_rows;
  TORCH_CHECK(inputs.size(0) % pass_rows == 0, "pipeline: ", inputs.size(0), " rows do not split into passes of ",
              plan_.microbatches, " micro-batches of ", plan_.microbatch_rows, " rows");
  timings_.clear();
  step_start_ = Clock::now();
  double loss_sum = 0;
  const bool last_stage_here = plan_.stage_rank.back() == pp_rank_;
  // Gradient accumulation on top of the pipeline: one pass per local batch.
  for (int64_t first = 0; first < inputs.size(0); first += pass_rows) {
    Pass pass;
    pass.inputs = inputs.narrow(0, first, pass_rows);
    pass.labels = labels.narrow(0, first, pass_rows);
    pass.actions = &actions_;
    pass.global_tokens = global_tokens;
    pass.losses.assign(static_cast<size_t>(plan_.microbatches), 0.0);
    run_pass(pass);
    // In micro-batch order, as the one-stage schedule adds them: the same double for every split.
    if (last_stage_here)
      for (double l : pass.losses) loss_sum += l;
  }
  hooks_.after_backward();  // FSDP: the step's one reduce-scatter per group
  if (comm::Comm* pp = mesh_.comm(comm::MeshDim::kPp)) {  // only the last stage has the loss; x + 0 is exact
    at::Tensor t = at::tensor({last_stage_here ? loss_sum : 0.0}, at::TensorOptions().dtype(at::kDouble)).to(device_);
    pp->all_reduce(t, comm::ReduceOp::kSum);
    loss_sum = t.item<double>();
  }
  step_seconds_ = seconds_between(step_start_, Clock::now());
  return loss_sum;
}

// Note [Pipeline timeline]: one row of 100 columns spans this rank's last step; each action
// fills the columns of its time with its type letter (F, B, I, W; lower case for odd
// micro-batches so neighbours stay apart), '.' is idle (waiting for a neighbour, or the step's
// final reductions). The measured idle fraction is 1 - (time computing actions, after their
// inputs arrived) / (step time); the theoretical bubble is the schedule's in the model of equal
// forward and backward slots: (p - 1) / (m + p - 1) for one stage per rank, (p - 1) / (v m +
// p - 1) for v stages per rank.
std::vector<std::string> PipelineSchedule::timeline() const {
  if (timings_.empty() || step_seconds_ <= 0) return {};
  constexpr int kColumns = 100;
  std::string row(kColumns, '.');
  double busy = 0;
  for (const ActionTiming& t : timings_) {
    busy += t.end_seconds - t.start_seconds;
    const int from = static_cast<int>(t.start_seconds / step_seconds_ * kColumns);
    const int to = std::max(from + 1, static_cast<int>(t.end_seconds / step_seconds_ * kColumns));
    char c = static_cast<char>(t.action.type);
    if (t.action.microbatch % 2) c = static_cast<char>(c - 'A' + 'a');
    for (int i = from; i < std::min(to, kColumns); ++i) row[static_cast<size_t>(i)] = c;
  }
  const int p = plan_.pp;
  const int64_t v = plan_.num_stages() / p, m = plan_.microbatches;
  const double theory = static_cast<double>(p - 1) / static_cast<double>(v * m + p - 1);
  std::ostringstream head;
  head.precision(3);
  head << "pipeline timeline, pp rank " << pp_rank_ << " (" << plan_.schedule_name << ", " << timings_.size()
       << " actions in " << step_seconds_ * 1e3 << " ms): idle " << 100.0 * (1.0 - busy / step_seconds_)
       << "% measured, bubble " << 100.0 * theory << "% in theory ((p-1)/(" << (v > 1 ? "v m" : "m") << "+p-1), p "
       << p << (v > 1 ? ", v " + std::to_string(v) : std::string()) << ", m " << m << ")";
  std::string order = "  order:";
  for (const ActionTiming& t : timings_) order += " " + t.action.str();
  return {head.str(), "  |" + row + "|", order};
}

double PipelineSchedule::evaluate(const at::Tensor& inputs, const at::Tensor& labels) {
  at::NoGradGuard no_grad;
  const int64_t rows = plan_.microbatch_rows;
  TORCH_CHECK(inputs.size(0) % rows == 0, "pipeline validation: ", inputs.size(0),
              " rows do not split into micro-batches of ", rows, " rows");
  Pass pass;
  std::vector<Action> actions;
  const int64_t microbatches = inputs.size(0) / rows;
  for (int64_t m = 0; m < microbatches; ++m)
    for (int stage = 0; stage < plan_.num_stages(); ++stage)
      if (plan_.stage_rank[static_cast<size_t>(stage)] == pp_rank_) actions.push_back({stage, ActionType::kForward, m});
  pass.actions = &actions;
  pass.evaluate = true;
  pass.inputs = inputs;
  pass.labels = labels;
  pass.global_tokens = 1;  // unused without a backward
  pass.losses.assign(static_cast<size_t>(microbatches), 0.0);
  const std::vector<ActionTiming> step_timings = timings_;  // the timeline shows training steps
  step_start_ = Clock::now();
  run_pass(pass);
  timings_ = step_timings;
  const bool last_stage_here = plan_.stage_rank.back() == pp_rank_;
  double loss_sum = 0;
  if (last_stage_here)
    for (double l : pass.losses) loss_sum += l;
  if (comm::Comm* pp = mesh_.comm(comm::MeshDim::kPp)) {
    at::Tensor t = at::tensor({last_stage_here ? loss_sum : 0.0}, at::TensorOptions().dtype(at::kDouble)).to(device_);
    pp->all_reduce(t, comm::ReduceOp::kSum);
    loss_sum = t.item<double>();
  }
  return loss_sum;
}

void PipelineSchedule::run_pass(Pass& pass) {
  const std::vector<Action>& actions = *pass.actions;
  for (size_t i = 0; i < actions.size(); ++i) {
    post_receives(pass, i);
    const Action& a = actions[i];
    const auto start = Clock::now();
    waited_seconds_ = 0;
    // A named range per action: profiler traces show each rank's schedule as run, memory
    // snapshots attribute each micro-batch's tensors to the action that made them.
    model::NamedScope scope("pipeline " + a.str());
    if (a.type == ActionType::kForward)
      forward(pass, a);
    else
      backward(pass, a);
    // The action's compute starts once its input arrived: the wait counts as idle.
    timings_.push_back({a, seconds_between(step_start_, start) + waited_seconds_,
                        seconds_between(step_start_, Clock::now())});
  }
  for (size_t i = 0; i < pass.outgoing.size(); ++i) wait_send(pass, i);
  pass.outgoing.clear();
  TORCH_CHECK(pass.states.empty() && pass.incoming.empty(), "pipeline: pp rank ", pp_rank_, " ended a pass with ",
              pass.states.size(), " micro-batches not run backward and ", pass.incoming.size(),
              " tensors not consumed: the schedule is not complete");
}

void PipelineSchedule::post_receives(Pass& pass, size_t from) {
  comm::Comm* pp = mesh_.comm(comm::MeshDim::kPp);
  int posted = 0;
  const std::vector<Action>& actions = *pass.actions;
  for (size_t j = from; j < actions.size() && posted < 2; ++j) {
    const Action& a = actions[j];
    bool gradient;
    int peer_stage;
    if (a.type == ActionType::kForward && a.stage > 0) {
      gradient = false;
      peer_stage = a.stage - 1;
    } else if ((a.type == ActionType::kBackward || a.type == ActionType::kBackwardInput) &&
               a.stage < plan_.num_stages() - 1) {
      gradient = true;
      peer_stage = a.stage + 1;
    } else {
      continue;
    }
    const int peer = plan_.stage_rank[static_cast<size_t>(peer_stage)];
    if (peer == pp_rank_) continue;  // handed over in memory
    ++posted;
    const auto key = std::make_tuple(a.stage, a.microbatch, gradient);
    if (pass.incoming.count(key)) continue;
    Pass::Incoming in;
    in.buffer = at::empty({plan_.microbatch_rows, boundary_seq_, model_.args().dim},
                          at::TensorOptions().dtype(boundary_dtype_).device(device_));
    in.work = pp->recv_async(in.buffer, peer, tag(a.stage, a.microbatch, gradient));
    pass.incoming.emplace(key, std::move(in));
  }
}

at::Tensor PipelineSchedule::take_input(Pass& pass, const Action& a, bool gradient) {
  auto it = pass.incoming.find(std::make_tuple(a.stage, a.microbatch, gradient));
  const int peer_stage = gradient ? a.stage + 1 : a.stage - 1;
  TORCH_CHECK(it != pass.incoming.end(), where(a), ": the ", gradient ? "gradient" : "activations",
              " of micro-batch ", a.microbatch, " from stage ", peer_stage,
              " were never produced (the schedule runs this action before its producer)");
  at::Tensor buffer = it->second.buffer;
  const auto wait_start = Clock::now();
  try {
    it->second.work.wait();
  } catch (const comm::CommError& e) {
    throw comm::CommError(where(a) + ": waiting for the " + (gradient ? "gradient" : "activations") + " of micro-batch " +
                    std::to_string(a.microbatch) + " from stage " + std::to_string(peer_stage) + " (pp rank " +
                    std::to_string(plan_.stage_rank[static_cast<size_t>(peer_stage)]) + ") failed: " + e.what());
  }
  waited_seconds_ += seconds_between(wait_start, Clock::now());
  const int peer = plan_.stage_rank[static_cast<size_t>(peer_stage)];
  pass.incoming.erase(it);
  // Validation runs its own order, not the plan's: its sends wait for the end of its pass.
  if (peer != pp_rank_ && !pass.evaluate) {
    const size_t produced_at = position(peer_stage, a.microbatch, gradient);  // the peer's action that sent it
    auto& sends = pass.outgoing;
    size_t kept = 0;
    for (size_t i = 0; i < sends.size(); ++i) {
      if (sends[i].to_rank == peer && sends[i].consumed_at <= produced_at)
        wait_send(pass, i);
      else if (kept != i)
        sends[kept++] = std::move(sends[i]);
      else
        ++kept;
    }
    sends.resize(kept);
  }
  return buffer;
}

void PipelineSchedule::hand_over(Pass& pass, const at::Tensor& tensor, int to_stage, int64_t microbatch,
                                 bool gradient, const Action& from) {
  at::Tensor t = tensor.detach();
  const int dest = plan_.stage_rank[static_cast<size_t>(to_stage)];
  if (dest == pp_rank_) {
    pass.incoming.emplace(std::make_tuple(to_stage, microbatch, gradient), Pass::Incoming{t, comm::CommWork()});
    return;
  }
  const std::vector<int64_t> expected = {plan_.microbatch_rows, boundary_seq_, model_.args().dim};
  TORCH_CHECK(t.sizes().vec() == expected && t.scalar_type() == boundary_dtype_, where(from), ": the ",
              gradient ? "input gradient" : "output", " is ", t.scalar_type(), " ", t.sizes(), ", but stage ",
              to_stage, " expects ", boundary_dtype_, " ", c10::IntArrayRef(expected));
  t = t.contiguous();
  Pass::Outgoing out{mesh_.comm(comm::MeshDim::kPp)->send_async(t, dest, tag(to_stage, microbatch, gradient)), t, from,
                     to_stage, gradient, dest, pass.evaluate ? 0 : position(to_stage, microbatch, gradient)};
  pass.outgoing.push_back(std::move(out));
}

void PipelineSchedule::forward(Pass& pass, const Action& a) {
  const model::ModelPart& part = plan_.stage_parts[static_cast<size_t>(a.stage)];
  const int64_t rows = plan_.microbatch_rows, first = a.microbatch * rows;
  // Every stage holds the step's tokens, so each finds its micro-batch's documents itself.
  const context_parallel::SequenceShard shard = context_parallel::shard_sequence(
      mesh_, pass.inputs.narrow(0, first, rows).to(device_), pass.labels.narrow(0, first, rows).to(device_),
      model_.args(), model_.rope_table());
  MicrobatchState& st = pass.states[{a.stage, a.microbatch}];
  st.input = part.embedding ? shard.inputs : take_input(pass, a, false).detach().requires_grad_(true);
  {
    model::NamedScope scope("bind params", model::MemoryCategory::kParameters);
    hooks_.bind_compute_params();
  }
  model::NamedScope scope("forward", model::MemoryCategory::kActivations);
  at::Tensor out = model_.forward_part(st.input, shard.rope, part, shard.documents);
  if (part.head) {
    at::Tensor loss = hooks_.loss_sum(out, shard.labels, shard.documents);  // sum over this rank's tokens
    pass.losses[static_cast<size_t>(a.microbatch)] = loss.item<double>();
    st.output = loss / pass.global_tokens;  // See Note [Loss scaling]
  } else {
    st.output = out;
    hand_over(pass, out, a.stage + 1, a.microbatch, false, a);
  }
  if (pass.evaluate) pass.states.erase({a.stage, a.microbatch});  // no backward will read it
}

void PipelineSchedule::backward(Pass& pass, const Action& a) {
  auto it = pass.states.find({a.stage, a.microbatch});
  TORCH_CHECK(it != pass.states.end(), where(a), ": micro-batch ", a.microbatch, " has no forward on this stage");
  MicrobatchState& st = it->second;
  const bool first_stage = a.stage == 0;
  const bool last_stage = a.stage == plan_.num_stages() - 1;
  model::NamedScope scope("backward", model::MemoryCategory::kGradients);
  if (a.type == ActionType::kBackwardWeight) {
    // After a split I: the linears' weight-gradient GEMMs it deferred. After an I that did the
    // whole backward (activation checkpointing) nothing is left.
    if (st.deferred) st.deferred->run();
    pass.states.erase(it);  // the graph the deferred gradients' paths needed goes with it
    return;
  }
  const at::Tensor grad_output = last_stage ? at::Tensor() : take_input(pass, a, true);
  const torch::autograd::variable_list grads =
      grad_output.defined() ? torch::autograd::variable_list{grad_output} : torch::autograd::variable_list{};
  if (a.type == ActionType::kBackwardInput && split_backward_weights_) {
    // The whole backward but the linears' weight GEMMs (See Note [Deferred weight gradients]);
    // the graph is kept for the paths those gradients take to their parameters.
    st.deferred = std::make_unique<model::DeferredWeightGrads>();
    {
      model::DeferWeightGrads defer(*st.deferred);
      torch::autograd::backward({st.output}, grads, /*retain_graph=*/true);
    }
    if (!first_stage) hand_over(pass, st.input.grad(), a.stage - 1, a.microbatch, true, a);
    return;
  }
  torch::autograd::backward({st.output}, grads);
  if (!first_stage) hand_over(pass, st.input.grad(), a.stage - 1, a.microbatch, true, a);
  if (a.type == ActionType::kBackward)
    pass.states.erase(it);
  else
    st.output = at::Tensor();  // an I that did it all: its W has nothing left
}

}  // namespace titan::parallel::pipeline
