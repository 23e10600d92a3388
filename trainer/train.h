// trainer/train.h — the training loop: build, then step until done (torchtitan's Trainer).
//
// The Trainer owns the step's parts as torchtitan's Trainer does: the model parts
// (parallel::ParallelModel: this rank's masters and their gradient finish), the schedule that
// runs the micro-batches through them (parallel::pipeline::Schedule, built beside the model
// parts), the optimizer and LR schedule, the data, the metrics and the checkpoints.
// Construction (trainer/build.cpp) does, in order: device and threads, the device mesh (every
// run has one; a single process's has no communicator), data, the model on the meta device,
// converters (float8/int8/MX), parallelize_model (TP, CP, AC, FSDP: each a no-op at degree 1),
// init of this rank's masters, the schedule, optimizer, LR schedule, checkpoints (resume or
// initial weights), metrics. `train()` (trainer/train.cpp) then runs `train_step` for every step.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "data/loader.h"
#include "data/tokenizer.h"
#include "launcher/world.h"
#include "model/transformer.h"
#include "trainer/checkpoint/checkpointer.h"
#include "trainer/config/job_config.h"
#include "trainer/observe/metrics.h"
#include "trainer/observe/memory_estimate.h"
#include "trainer/observe/stragglers.h"
#include "trainer/observe/profiling.h"
#include "trainer/optim/optimizer.h"
#include "trainer/validate.h"

namespace titan::parallel {
class ParallelModel;
namespace comm {
class DeviceMesh;
}
namespace pipeline {
class Schedule;
}
}  // namespace titan::parallel

namespace titan::trainer {

struct TrainResult {
  std::vector<double> losses;       // one per completed step
  std::vector<std::pair<int64_t, double>> validation_losses;  // (step, loss) per validation
  std::vector<double> grad_norms;   // one per completed step
  int64_t steps_completed = 0;
  bool stopped_by_signal = false;
};

class Trainer {
 public:
  explicit Trainer(config::JobConfig cfg);
  ~Trainer();
  TrainResult train();

  model::Transformer& model() { return *model_; }
  const std::vector<std::string>& param_names() const;
  // This rank's float32 master parameters (all of them for a single process).
  const std::vector<at::Tensor>& master_params() const;
  // The step the run resumed from (0 = a fresh start).
  int64_t start_step() const { return start_step_; }
  const checkpoint::Checkpointer& checkpointer() const { return *checkpointer_; }

 private:
  // Construction, in order (trainer/build.cpp).
  void init_device();     // device, threads, determinism, dtypes, CPU memory limit, profiler
  void init_mesh();       // the world process group when WORLD_SIZE > 1, and always the mesh
  void init_data();       // tokenizer, this rank's loader, the validator
  // Refuses a run whose memory estimate exceeds the machine by more than 1.25x (Note [Memory
  // shortfall]), before any large allocation.
  void check_memory_fits();
  static constexpr double kRefuseAboveEstimate = 1.25;  // the estimate is within ~15% of peaks
  void build_model();     // meta model, converters, parallelize_model, init, the schedule
  void init_optimizer();  // AdamW over the masters, the LR schedule
  void init_metrics();    // the mfu peak, the metrics logger and TensorBoard

  // One optimizer step over one global batch; returns (global loss, grad norm).
  std::pair<double, double> train_step(int64_t step);
  // The step's forward and backward over this rank's rows through the schedule, and the
  // finished gradients; returns the global loss sum. The step and the non-finite re-run share it.
  double forward_backward(const data::Batch& batch);
  // A step whose all-reduced loss or grad norm is not finite (trainer/nonfinite_step.cpp): skips
  // it (training.skip_nonfinite_steps) or throws, naming the step and the first module whose
  // output or gradient is not finite (found by re-running the step's forward + backward).
  void on_nonfinite_step(int64_t step, const data::Batch& batch, double loss, double grad_norm);

  config::JobConfig cfg_;
  c10::Device device_{c10::kCPU};
  at::ScalarType compute_dtype_ = at::kFloat;
  std::string low_precision_linears_;  // "float8", "MX (mxfp8_cublas)", "int8", or "" (for the mfu log)
  std::unique_ptr<data::Tokenizer> tokenizer_;
  std::unique_ptr<data::DataLoader> loader_;
  std::unique_ptr<Validator> validator_;  // validation.enable (trainer/validate.h)
  double last_mtp_loss_ = -1;  // multi-token prediction's loss of the last step (< 0: none)
  std::vector<double> last_expert_load_;  // MoE: the last step's max / mean tokens per expert, per layer
  std::unique_ptr<model::Transformer> model_;
  std::unique_ptr<optim::AdamW> optimizer_;
  optim::LrSchedule lr_schedule_{};
  std::unique_ptr<observe::MetricsLogger> metrics_;
  std::unique_ptr<observe::StragglerDetector> stragglers_;  // distributed with metrics.straggler_factor on
  std::unique_ptr<observe::StepProfiler> profiler_;  // traces + memory snapshots ([profiling])
  int64_t global_batch_size_ = 0;
  launcher::WorldInfo world_;                                  // from the environment (torchrun-style)
  std::unique_ptr<parallel::comm::DeviceMesh> mesh_;           // every run; size-1 dims have no Comm
  std::unique_ptr<parallel::ParallelModel> parallel_;          // the model parts: masters, loss, gradient finish
  std::unique_ptr<parallel::pipeline::Schedule> schedule_;     // runs the micro-batches through them
  double comm_seconds_logged_ = 0;   // mesh comm time at the last metrics line
  double comm_exposed_logged_ = 0;   // of which exposed (waited for), at the last metrics line
  std::map<std::string, double> comm_by_dim_logged_;  // per mesh dimension, at the last metrics line
  std::unique_ptr<checkpoint::Checkpointer> checkpointer_;
  // Debug hooks run before each step, installed at start-up only when their keys are set (the
  // fault tests' comm.debug_fail_* / comm.debug_stall_*, trainer/fault_injection.h); a
  // production run has none.
  std::vector<std::function<void(int64_t)>> before_step_hooks_;
  // Run after each step's backward, only with training.debug_nonfinite_at_step (the NaN of the
  // non-finite tests); empty in a production run.
  std::function<void(int64_t)> after_backward_hook_;
  int64_t start_step_ = 0;                             // resumed from this step
  int64_t skipped_steps_ = 0;                          // non-finite steps skipped (whole run)
  int64_t consecutive_skipped_steps_ = 0;
};

}  // namespace titan::trainer
