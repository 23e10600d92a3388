// trainer/train.h — the training loop: build, then step until done (torchtitan's Trainer).
//
// Construction does, in order: device and threads, tokenizer, data loader, model on the meta
// device, (converters: float8/int8 — later), materialize + init on the device, optional initial
// weights, optimizer, LR schedule, metrics. `train()` then runs `train_step` for every step.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>
#include <string>
#include <vector>

#include "model/llama.h"
#include "parallel/world.h"
#include "trainer/config.h"
#include "trainer/converters.h"
#include "trainer/data/loader.h"
#include "trainer/data/tokenizer.h"
#include "trainer/metrics.h"
#include "trainer/optimizer.h"
#include "trainer/profiling.h"

namespace titan::parallel {
class DeviceMesh;
class ParallelModel;
}  // namespace titan::parallel

namespace titan::trainer {

struct TrainResult {
  std::vector<double> losses;       // one per completed step
  std::vector<double> grad_norms;   // one per completed step
  int64_t steps_completed = 0;
  bool stopped_by_signal = false;
};

class Trainer {
 public:
  explicit Trainer(JobConfig cfg);
  ~Trainer();
  TrainResult train();

  model::Llama& model() { return *model_; }
  const std::vector<std::string>& param_names() const { return param_names_; }
  const std::vector<at::Tensor>& master_params() const { return master_params_; }
  // Writes the float32 master weights (in checkpoint.export_dtype) as safetensors.
  void export_weights(const std::string& path) const;

 private:
  void build_model();
  void load_initial_weights(const std::string& path);
  // One optimizer step over one global batch; returns (global loss, grad norm).
  std::pair<double, double> train_step(int64_t step);
  // Points the model's parameter slots at compute copies of the masters (a differentiable cast
  // for bf16 compute, the masters themselves for float32).
  void bind_compute_params();
  // WORLD_SIZE > 1: process group, device mesh (parallelism.* degrees); see parallel/.
  void init_distributed();

  JobConfig cfg_;
  c10::Device device_{c10::kCPU};
  at::ScalarType compute_dtype_ = at::kFloat;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<DataLoader> loader_;
  std::unique_ptr<model::Llama> model_;
  ConvertedModel converted_;  // which float8/int8 computes the linears use
  std::vector<std::string> param_names_;
  std::vector<at::Tensor*> param_slots_;    // the model's own tensors, in parameter order
  std::vector<at::Tensor> master_params_;   // float32, requires_grad, in parameter order
  std::unique_ptr<AdamW> optimizer_;
  LrSchedule lr_schedule_{};
  std::unique_ptr<MetricsLogger> metrics_;
  std::unique_ptr<StepProfiler> profiler_;  // traces + memory snapshots ([profiling])
  int64_t global_batch_size_ = 0;
  int64_t grad_accumulation_steps_ = 1;
  parallel::WorldInfo world_;                          // from the environment (torchrun-style)
  std::unique_ptr<parallel::DeviceMesh> mesh_;         // null when single-process
  std::unique_ptr<parallel::ParallelModel> parallel_;  // null when single-process
  double comm_seconds_logged_ = 0;                     // mesh comm time at the last metrics line
};

}  // namespace titan::trainer
