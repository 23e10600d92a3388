#include "trainer/validate.h"

#include <chrono>
#include <cmath>
#include <stdexcept>

#include "model/moe/moe.h"
#include "parallel/parallel_model.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/schedule.h"
#include "util/logging.h"

namespace titan::trainer {

Validator::Validator(const config::JobConfig& cfg, const data::Tokenizer& tokenizer, int dp_rank, int dp_degree)
    : cfg_(cfg.validation) {
  data::DataConfig data_cfg;
  // torchtitan's c4_validation is C4's validation split: titan reads it as c4 from a local copy.
  data_cfg.dataset = cfg_.dataset == "c4_validation" ? "c4" : cfg_.dataset;
  data_cfg.dataset_path = cfg_.dataset_path;
  data_cfg.seq_len = cfg_.seq_len;
  global_batch_ = cfg_.local_batch_size * dp_degree;
  data_cfg.global_batch_size = global_batch_;
  data_cfg.seed = cfg.training.seed;
  data_cfg.dp_rank = dp_rank;
  data_cfg.dp_degree = dp_degree;
  try {
    loader_ = std::make_unique<data::DataLoader>(data_cfg, tokenizer);
  } catch (const std::exception& e) {
    throw config::ConfigError("validation.dataset = " + cfg_.dataset + " (validation.dataset_path '" +
                              cfg_.dataset_path + "'): " + e.what());
  }
  const int64_t available = loader_->windows_per_epoch() / global_batch_;
  if (available == 0)
    throw config::ConfigError("validation.dataset = " + cfg_.dataset + " holds " +
                              std::to_string(loader_->windows_per_epoch()) + " sequences of validation.seq_len + 1 = " +
                              std::to_string(cfg_.seq_len + 1) + " tokens: fewer than one validation batch of " +
                              std::to_string(global_batch_) + " (validation.local_batch_size " +
                              std::to_string(cfg_.local_batch_size) + " x data-parallel degree " +
                              std::to_string(dp_degree) + ")");
  batches_ = available;
  if (cfg_.steps > available) {
    util::log_warn("validation.steps = " + std::to_string(cfg_.steps) + " is more than the validation set holds (" +
                   std::to_string(available) + " batches of " + std::to_string(global_batch_) +
                   " sequences): every validation evaluates those " + std::to_string(available));
  } else if (cfg_.steps > 0) {
    batches_ = cfg_.steps;
  }
  start_state_ = loader_->state_dict();
}

bool Validator::due(int64_t step, int64_t last_step) const {
  return cfg_.enable && (step % cfg_.freq == 0 || step == last_step);
}

std::string Validator::describe() const {
  const int64_t windows = loader_->windows_per_epoch();
  const int64_t left_out = cfg_.steps < 0 ? windows - batches_ * global_batch_ : 0;
  return loader_->describe() + "; every " + std::to_string(cfg_.freq) + " steps: " + std::to_string(batches_) +
         " batch(es) of " + std::to_string(global_batch_) + " x " + std::to_string(cfg_.seq_len) + " tokens" +
         (left_out > 0 ? " (the last " + std::to_string(left_out) + " sequence(s), less than a batch, are left out)"
                       : "");
}

ValidationResult Validator::run(parallel::pipeline::Schedule& schedule, parallel::ParallelModel& model,
                               int64_t step) {
  const auto start = std::chrono::steady_clock::now();
  loader_->load_state_dict(start_state_);  // See Note [Validation]: always from the first batch
  double loss_sum = 0;
  for (int64_t b = 0; b < batches_; ++b) {
    const data::Batch batch = loader_->next_batch();  // this rank's rows of the global batch
    model::moe::UncountedForward uncounted;  // validation tokens are no step's load (Note [Counted tokens])
    loss_sum += schedule.evaluate(batch.inputs, batch.labels);
  }
  loss_sum = model.sum_over_dp_cp(loss_sum);  // every token of every data-parallel rank
  ValidationResult r;
  r.step = step;
  r.batches = batches_;
  r.tokens = batches_ * global_batch_ * cfg_.seq_len;
  r.loss = loss_sum / static_cast<double>(r.tokens);
  r.perplexity = std::exp(r.loss);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

}  // namespace titan::trainer
