// trainer/validate.h — the validation loop (torchtitan's components/validate, [validation]).
//
// Note [Validation]: every `validation.freq` training steps (and after the last one) the model
// runs forward only over the validation data FROM ITS BEGINNING, in the training layout (the
// schedule's evaluate(): FSDP gathers, TP, async TP, float8 / int8 / MX computes, pipeline
// stages, context-parallel attention), under no autograd: no gradient, no activation
// checkpointing, no optimizer state and no float8 scaling state is touched, so a run's training
// losses are the same bits with and without validation. The loss is the exact global token mean:
// every data-parallel rank's sum of token losses, summed (over dp x cp), divided by the global
// token count of the batches evaluated — not a mean of per-rank means. Validation data is read
// like training data (the same readers, packing and per-rank rows of each global batch of
// local_batch_size x dp rows), restarting at its first batch every time, so a resumed run
// validates exactly as the uninterrupted one. `steps` = -1 evaluates every whole global batch of
// one pass over the set (the windows of a last, partial batch are left out and the log says how
// many); a larger `steps` than the set holds is said once and capped.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "data/loader.h"
#include "data/tokenizer.h"
#include "trainer/config/job_config.h"

namespace titan::parallel {
class ParallelModel;
namespace pipeline {
class Schedule;
}
}  // namespace titan::parallel

namespace titan::trainer {

struct ValidationResult {
  int64_t step = 0;      // the training step it followed
  double loss = 0;       // global token mean
  double perplexity = 0;  // exp(loss)
  int64_t tokens = 0;    // global tokens evaluated
  int64_t batches = 0;   // global batches evaluated
  double seconds = 0;
};

class Validator {
 public:
  // Opens the validation dataset (a missing or empty one throws ConfigError naming the keys)
  // for this rank's rows: data-parallel rank `dp_rank` of `dp_degree`.
  Validator(const config::JobConfig& cfg, const data::Tokenizer& tokenizer, int dp_rank, int dp_degree);

  // Whether to validate after training step `step` of `last_step`.
  bool due(int64_t step, int64_t last_step) const;
  // One validation: forward over the configured batches through the training schedule's
  // `evaluate`, the loss summed over dp x cp by the model parts; every rank of the mesh calls it.
  ValidationResult run(parallel::pipeline::Schedule& schedule, parallel::ParallelModel& model, int64_t step);
  std::string describe() const;

 private:
  config::ValidationSection cfg_;
  std::unique_ptr<data::DataLoader> loader_;
  std::string start_state_;  // the reader at the first batch: every validation restarts there
  int64_t global_batch_ = 0;
  int64_t batches_ = 0;      // global batches per validation
  bool capped_said_ = false;
};

}  // namespace titan::trainer
