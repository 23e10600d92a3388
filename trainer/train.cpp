// trainer/train.cpp — the Trainer: its construction as a list of parts (each in
// trainer/build.cpp), the step and the loop.
#include "trainer/train.h"

#include "model/attention_masks.h"

#include <c10/util/Exception.h>

#include <cmath>
#include <tuple>

#include "model/scope.h"
#include "parallel/comm/mesh.h"
#include "parallel/parallel_model.h"
#include "parallel/pipeline/schedule.h"
#include "trainer/signals.h"
#include "util/logging.h"

namespace titan::trainer {

Trainer::Trainer(config::JobConfig cfg) : cfg_(std::move(cfg)) {
  init_device();     // device, threads, determinism, dtypes, CPU memory limit, profiler
  init_mesh();       // the world process group (WORLD_SIZE > 1) and the device mesh
  check_memory_fits();  // the memory estimate against the machine, before allocating
  init_data();       // tokenizer, this rank's loader, the validator
  build_model();     // meta model, converters, parallelize_model, init, the schedule
  init_optimizer();  // AdamW over the masters, the LR schedule
  // Resume, else the initial weights, else the random init; the seed checkpoint when asked.
  checkpointer_ = std::make_unique<checkpoint::Checkpointer>(cfg_, *model_, *parallel_, *optimizer_, *loader_, *mesh_,
                                                             world_.rank, world_.world_size, device_);
  start_step_ = checkpointer_->start();
  init_metrics();    // the mfu peak, metrics logger, TensorBoard
}

Trainer::~Trainer() = default;

const std::vector<std::string>& Trainer::param_names() const { return parallel_->param_names(); }
const std::vector<at::Tensor>& Trainer::master_params() const { return parallel_->master_params(); }

double Trainer::forward_backward(const data::Batch& batch) {
  // Every micro-batch's backward runs on its loss sum / global_tokens (See Note [Loss scaling]).
  const double global_tokens = static_cast<double>(global_batch_size_) * cfg_.training.seq_len;
  const double local_loss_sum = schedule_->step(batch.inputs, batch.labels, global_tokens);
  return parallel_->finish_gradients(local_loss_sum);  // the global batch's loss sum
}

// The phases of one optimizer step, in order; no phase depends on the layout (a stage of degree 1
// is a no-op inside ParallelModel, and the schedule runs the micro-batches, See Note [Schedules as
// data] in parallel/pipeline/schedule.h).
std::pair<double, double> Trainer::train_step(int64_t step) {
  const auto& t = cfg_.training;
  const double lr = cfg_.optimizer.lr * lr_schedule_.factor(step);
  optimizer_->zero_grad();

  data::Batch batch = loader_->next_batch();  // this rank's rows of the global batch, [rows, S]
  const double loss_sum = forward_backward(batch);  // schedule + gradient finish (FSDP, TP, HSDP, dp x cp)
  if (after_backward_hook_) after_backward_hook_(step);  // training.debug_nonfinite_at_step only
  // Block-causal and chunked steps compute part of attention's square: the mfu counts what was done.
  const model::ModelArgs& args = model_->args();
  last_mtp_loss_ = args.mtp_layers > 0 ? parallel_->take_mtp_loss_sum() /
                                             (static_cast<double>(global_batch_size_) * t.seq_len)
                                       : -1;
  metrics_->add_tokens(batch.inputs.numel(),
                       model::attention_work(args, batch.inputs));
  model::NamedScope scope("optimizer", model::MemoryCategory::kOptimizerState);
  const double global_tokens = static_cast<double>(global_batch_size_) * t.seq_len;
  const parallel::ParallelModel::ClippedNorm clipped = parallel_->clip_grad_norm(t.max_norm);  // one all-reduce
  const double grad_norm = clipped.norm;
  // Both are all-reduced, so every rank takes the same branch (Note [Non-finite steps]).
  if (!std::isfinite(loss_sum) || !std::isfinite(grad_norm)) {
    on_nonfinite_step(step, batch, loss_sum / global_tokens, grad_norm);  // throws unless skipping
    // Skipped: no optimizer update, and the MoE load balancing and float8 delayed scaling as they
    // were (the step's token counts and amaxes dropped, no bias moved, no load to report).
    parallel_->discard_step_statistics();
    last_expert_load_.clear();
    return {loss_sum / global_tokens, grad_norm};
  }
  consecutive_skipped_steps_ = 0;
  last_expert_load_ = parallel_->balance_experts();  // MoE: the bias update, before the optimizer step
  optimizer_->step(lr, clipped.copy_grad_scale);  // also rewrites the bf16 compute copies
  parallel_->after_optimizer_step();  // float8: next FSDP scales, delayed amax histories
  return {loss_sum / global_tokens, grad_norm};
}

TrainResult Trainer::train() {
  TrainResult result;
  if (cfg_.checkpoint.create_seed_checkpoint) return result;  // written at start-up
  set_stop_at_step_boundary(true);  // from here a signal stops at the next step boundary
  if (start_step_ >= cfg_.training.steps)
    util::log_info("checkpoint step " + std::to_string(start_step_) + " >= training.steps " +
                   std::to_string(cfg_.training.steps) + ": nothing left to train");
  metrics_->reset_window();
  for (int64_t step = start_step_ + 1; step <= cfg_.training.steps; ++step) {
    if (stop_requested()) {
      util::log_warn("received signal " + std::to_string(stop_signal()) + ": stopping after step " +
                     std::to_string(step - 1));
      result.stopped_by_signal = true;
      break;
    }
    profiler_->step_begin(step);
    double loss = 0, grad_norm = 0;
    for (const auto& hook : before_step_hooks_) hook(step);  // debug keys only; none by default
    try {
      std::tie(loss, grad_norm) = train_step(step);
    } catch (const c10::OutOfMemoryError&) {
      profiler_->on_out_of_memory(step);  // the snapshot of the failing step, then exit
      throw;
    } catch (const c10::Error& e) {  // the CPU allocator's failure: say which key and what fits
      const std::string what = e.what_without_backtrace();
      if (what.find("can't allocate memory") == std::string::npos) throw;
      const std::string advice = observe::memory_shortfall(cfg_, mesh_->local_rank(parallel::comm::MeshDim::kPp), 0);
      throw std::runtime_error("out of memory at step " + std::to_string(step) + ": " + what.substr(0, what.find('\n')) +
                               (advice.empty() ? "" : "; " + advice));
    }
    profiler_->step_end(step);
    if (cfg_.job.print_pipeline_schedule && (step == start_step_ + 2 || step == cfg_.training.steps))
      for (const std::string& line : schedule_->timeline()) util::log_info(line);
    result.losses.push_back(loss);
    result.grad_norms.push_back(grad_norm);
    result.steps_completed = step;
    if (step == 1 || step % cfg_.metrics.log_freq == 0 || step == cfg_.training.steps)
    {
      observe::StepMetrics m;
      m.step = step;
      m.loss = loss;
      m.grad_norm = grad_norm;
      m.lr = cfg_.optimizer.lr * lr_schedule_.factor(step);
      m.skipped_steps = skipped_steps_;
      m.expert_load = last_expert_load_;
      m.mtp_loss = last_mtp_loss_;
      const std::map<std::string, double> by_dim = mesh_->comm_seconds_by_dim();
      if (world_.world_size > 1) {
        m.comm_seconds = mesh_->comm_seconds() - comm_seconds_logged_;
        m.comm_exposed_seconds = mesh_->comm_exposed_seconds() - comm_exposed_logged_;
        for (const auto& [dim, seconds] : by_dim) m.comm_seconds_by_dim[dim] = seconds - comm_by_dim_logged_[dim];
      }
      comm_seconds_logged_ = mesh_->comm_seconds();
      comm_exposed_logged_ = mesh_->comm_exposed_seconds();
      comm_by_dim_logged_ = by_dim;
      if (stragglers_) {  // See Note [Straggler report]: one all-gather, at log steps only
        const observe::StragglerReport r =
            stragglers_->observe(metrics_->window_seconds() - std::max(0.0, m.comm_exposed_seconds));
        m.compute_seconds_by_rank = r.compute_seconds;
        m.straggler_ratio = r.ratio;
        if (r.named) {
          m.straggler_rank = r.slowest_rank;
          util::log_warn(r.describe());
        }
      }
      metrics_->log(m);
    }
    if (validator_ && validator_->due(step, cfg_.training.steps)) {
      const ValidationResult v = validator_->run(*schedule_, *parallel_, step);  // See Note [Validation]
      metrics_->log_validation(v.step, v.loss, v.perplexity, v.tokens, v.seconds);
      result.validation_losses.emplace_back(step, v.loss);
    }
    if (checkpointer_->should_save(step)) checkpointer_->save(step);
  }
  checkpointer_->wait();  // the last (async) save is complete before the run ends
  if (!cfg_.checkpoint.export_path.empty()) checkpointer_->export_weights(cfg_.checkpoint.export_path);
  if (const std::string lost = metrics_->lost_metrics(); !lost.empty()) throw std::runtime_error(lost);
  return result;
}

}  // namespace titan::trainer
