// trainer/train.h — the training loop: build, then step until done (torchtitan's Trainer).
//
// Construction does, in order: device and threads, the device mesh (every run has one; a single
// process's has no communicator), tokenizer, data loader, model on the meta device, converters
// (float8/int8), parallelize_llama (TP, AC, FSDP: each a no-op at degree 1), init of this rank's
// master parameters, optional initial weights, optimizer, LR schedule, metrics. `train()` then
// runs `train_step` for every step.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/loader.h"
#include "data/tokenizer.h"
#include "model/llama.h"
#include "parallel/pipeline_plan.h"
#include "parallel/world.h"
#include "trainer/checkpoint/manager.h"
#include "trainer/config/job_config.h"
#include "trainer/fault_injection.h"
#include "trainer/observe/metrics.h"
#include "trainer/observe/profiling.h"
#include "trainer/optim/optimizer.h"
#include "trainer/validate.h"

namespace titan::parallel {
class DeviceMesh;
class ParallelModel;
struct ParallelOptions;
}  // namespace titan::parallel

namespace titan::trainer {

struct TrainResult {
  std::vector<double> losses;       // one per completed step
  std::vector<std::pair<int64_t, double>> validation_losses;  // (step, loss) per validation
  std::vector<double> grad_norms;   // one per completed step
  int64_t steps_completed = 0;
  bool stopped_by_signal = false;
};

// The parallelization options the config asks for, its choices checked as config errors
// (exit 2). `dims`: the mesh's degrees; `float8`: whether the converters made float8 linears.
// The Trainer and the dry run (apps/dry_run.h) build their plans from it.
parallel::ParallelOptions parallel_options(const config::JobConfig& cfg, const model::ModelArgs& args,
                                           const parallel::ParallelDims& dims, c10::Device device, bool float8);

// The rows one optimizer step consumes over all data-parallel ranks: training.global_batch_size,
// or local_batch_size x dp when unset; not a multiple of local_batch_size x dp is a config error.
int64_t global_batch_size(const config::JobConfig& cfg, const parallel::ParallelDims& dims);

// The pipeline plan (parallel/pipeline_plan.h) from the config's pipeline keys when
// pipeline_parallel_degree > 1, else nullopt; an impossible one is a config error (exit 2). Pure:
// the trainer checks it before any process group starts.
std::optional<parallel::PipelinePlan> pipeline_plan(const config::JobConfig& cfg, const parallel::ParallelDims& dims);
// parallelism.context_parallel_rotate_method, after checking that the context-parallel degree can
// split this model's sequences (parallel/context_parallel.h); throws ConfigError naming the keys.
parallel::CpRotateMethod context_parallel_method(const config::JobConfig& cfg, const parallel::ParallelDims& dims);

// The config's parallelism degrees resolved for `world_size` ranks (data_parallel_shard_degree
// -1 = the rest); an impossible layout is a config error (exit 2) saying why.
parallel::ParallelDims parallel_dims(const config::JobConfig& cfg, int world_size);

class Trainer {
 public:
  explicit Trainer(config::JobConfig cfg);
  ~Trainer();
  TrainResult train();

  model::Llama& model() { return *model_; }
  const std::vector<std::string>& param_names() const;
  // This rank's float32 master parameters (all of them for a single process).
  const std::vector<at::Tensor>& master_params() const;
  // Writes the full float32 master weights (in checkpoint.export_dtype) as one safetensors file
  // (export_format torchtitan) or a Hugging Face folder (hf); every rank joins the gathers (one
  // parameter at a time), rank 0 writes.
  void export_weights(const std::string& path);
  // The step the run resumed from (0 = a fresh start).
  int64_t start_step() const { return start_step_; }
  const checkpoint::CheckpointManager& checkpointer() const { return *checkpointer_; }

 private:
  void build_model();
  void load_initial_weights(const std::string& path);
  // Resume (checkpoint.enable_checkpoint), else the initial weights, else the random init; the
  // seed checkpoint when asked. Every rank agrees on success before training starts.
  void init_checkpointing();
  // The training state's holders, in save/load order (See trainer/checkpoint/state.h).
  checkpoint::Holders state_holders();
  nlohmann::json model_shape() const;  // what a checkpoint's model must match
  void save_checkpoint(int64_t step);
  // The full weights as a Hugging Face folder in checkpoint.export_dtype: every rank joins the
  // gathers, rank 0 writes; returns the bytes written (export_weights, last_save_in_hf).
  int64_t write_hf_weights(const std::string& dir);
  // One optimizer step over one global batch; returns (global loss, grad norm).
  std::pair<double, double> train_step(int64_t step);
  // A step whose all-reduced loss or grad norm is not finite (trainer/nonfinite_step.cpp): skips
  // it (training.skip_nonfinite_steps) or throws, naming the step and the first module whose
  // output or gradient is not finite (found by re-running the step's forward + backward).
  void on_nonfinite_step(int64_t step, const data::Batch& batch, double loss, double grad_norm);
  // The process group when WORLD_SIZE > 1, and always the device mesh (parallelism.* degrees).
  void init_mesh();

  config::JobConfig cfg_;
  c10::Device device_{c10::kCPU};
  at::ScalarType compute_dtype_ = at::kFloat;
  std::string low_precision_linears_;  // "float8", "MX (mxfp8_cublas)", "int8", or "" (for the mfu log)
  std::unique_ptr<data::Tokenizer> tokenizer_;
  std::unique_ptr<data::DataLoader> loader_;
  std::unique_ptr<Validator> validator_;  // validation.enable (trainer/validate.h)
  std::unique_ptr<model::Llama> model_;
  std::unique_ptr<optim::AdamW> optimizer_;
  optim::LrSchedule lr_schedule_{};
  std::unique_ptr<observe::MetricsLogger> metrics_;
  std::unique_ptr<observe::StepProfiler> profiler_;  // traces + memory snapshots ([profiling])
  int64_t global_batch_size_ = 0;
  parallel::WorldInfo world_;                          // from the environment (torchrun-style)
  std::unique_ptr<parallel::DeviceMesh> mesh_;         // every run; size-1 dims have no Comm
  std::unique_ptr<parallel::ParallelModel> parallel_;  // masters, loss, grad reduction, clipping
  double comm_seconds_logged_ = 0;   // mesh comm time at the last metrics line
  double comm_exposed_logged_ = 0;   // of which exposed (waited for), at the last metrics line
  std::unique_ptr<checkpoint::CheckpointManager> checkpointer_;
  std::vector<std::unique_ptr<checkpoint::Stateful>> holders_;  // the Stateful adapters state_holders() names
  std::unique_ptr<FaultInjection> faults_;  // test-only faults between steps (comm.debug_*)
  int64_t start_step_ = 0;                             // resumed from this step
  int64_t skipped_steps_ = 0;                          // non-finite steps skipped (whole run)
  int64_t consecutive_skipped_steps_ = 0;
};

}  // namespace titan::trainer
