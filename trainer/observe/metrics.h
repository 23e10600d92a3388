// trainer/observe/metrics.h — the per-step line and its JSONL twin (the same fields as torchtitan's).
//
//   step: 20  loss:  8.4931  grad_norm:  1.2345  memory: 0.41GiB(1.71%)  tps: 5,760  tflops: 0.01  mfu: 6.73%
//
// loss: global token-average loss of the step. memory: peak since the previous line (see
// memory.h for what is measured on each device). tps: tokens per second per device since the
// previous line, divided by the non-data-parallel degree. tflops = FLOPs per token * tps / 1e12,
// where a token's FLOPs are the dense matmuls' plus attention's (model::flops_per_token), the
// attention part scaled by the fraction of the causal square a block-causal step computed;
// mfu = 100 * tflops / peak TFLOP/s.
//
// Every JSONL line and TensorBoard record is written whole or not at all; a failed write does
// not stop the step but the run then ends with "metrics lost from step N" (Note [Lost metrics]).
#pragma once

#include <memory>

#include "trainer/observe/tensorboard.h"

#include <c10/core/Device.h>

#include <c10/core/ScalarType.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace titan::trainer::observe {

// Achieved GEMM FLOP/s on this CPU in `dtype` (the run's compute dtype: float32 or bfloat16,
// whose GEMMs run at very different rates on CPUs with AVX512-BF16 / AMX) with the current
// intra-op threads: the best of square GEMMs of 512, 1024 and 2048 (a short probe, ~0.5 s), used
// as the CPU "peak" for mfu when metrics.peak_flops is not given.
double probe_cpu_matmul_flops(at::ScalarType dtype = at::kFloat);
// Dense bf16 peak of a known GPU from its name, 0 if unknown (never guessed).
double known_gpu_peak_flops(const std::string& device_name);

// The FLOP/s that mfu divides by, and a few words saying where it came from (for the log).
struct PeakFlops {
  double flops_per_second = 0;  // 0 = unknown: the metrics line prints "mfu: n/a"
  std::string source;
};
// In order: `configured_peak_flops` (metrics.peak_flops) if > 0; on a CUDA device, the dense
// bf16 tensor-core peak of the device found by its name (torchtitan's mfu basis, used whatever
// the compute dtype, so float32 / float8 / int8 runs compare with torchtitan's numbers); on the
// CPU, probe_cpu_matmul_flops(compute_dtype) with the current threads (float8 / int8 linears are
// emulated there, so their mfu counts against the compute dtype's GEMMs, torchtitan's
// convention of counting low-precision runs against the high-precision peak).
// `low_precision_linears` names them in the source. A CUDA device in a build without
// TITAN_WITH_CUDA, or a GPU missing from the table, gives 0.
PeakFlops peak_flops_for_mfu(double configured_peak_flops, c10::Device device, at::ScalarType compute_dtype = at::kFloat,
                             const std::string& low_precision_linears = "");

struct StepMetrics {
  int64_t step = 0;
  double loss = 0;
  double grad_norm = 0;
  double lr = 0;
  double comm_seconds = -1;  // time inside collectives since the last line; < 0 = not distributed
  // Of comm_seconds, the time the training thread was blocked waiting on a collective (what
  // overlap does not hide); < 0 = not distributed.
  double comm_exposed_seconds = -1;
  // Of comm_seconds, per mesh dimension ("ep": expert parallelism's all-to-alls, "dp_shard":
  // FSDP, ...; DeviceMesh::comm_seconds_by_dim). JSONL only.
  std::map<std::string, double> comm_seconds_by_dim;
  int64_t skipped_steps = 0;  // non-finite steps skipped so far (training.skip_nonfinite_steps)
  // MoE models: each MoE layer's max / mean tokens per expert in the logged step (1 = balanced);
  // the line shows the worst layer ("expert_load"), the JSONL record every layer.
  std::vector<double> expert_load;
  // Multi-token prediction (model.mtp_layers): the mean over the depths of their cross entropy
  // per main token (what loss adds model.mtp_loss_weight times); < 0: none.
  double mtp_loss = -1;
  // Note [Straggler report]: every rank's compute seconds in this window (empty: report off or
  // one process), and the rank named slow (-1: none).
  std::vector<double> compute_seconds_by_rank;
  int straggler_rank = -1;
  double straggler_ratio = 0;  // the slowest rank's compute over the median's
};

class MetricsLogger {
 public:
  // flops_per_token: model::flops_per_token; attention_flops_per_token: its attention term.
  MetricsLogger(c10::Device device, double flops_per_token, double attention_flops_per_token, double peak_flops,
                int64_t non_data_parallel_size, const std::string& jsonl_path);

  // Counts tokens processed by this rank since the last line; `attention_work`: the fraction of
  // attention's FLOPs they cost (block-causal: model::attention_work_fraction; causal: 1).
  void add_tokens(int64_t tokens, double attention_work = 1.0) {
    tokens_since_last_ += tokens;
    flops_since_last_ += static_cast<double>(tokens) *
                         (flops_per_token_ - attention_flops_per_token_ * (1.0 - attention_work));
  }
  // Prints the line (through the log) and appends the JSONL record; resets the window.
  void log(const StepMetrics& m);
  // One validation (trainer/validate.h): the line "validate step: N  loss: ...  perplexity: ...
  // tokens: ...  time: ...s", a metrics.jsonl record and TensorBoard scalars under torchtitan's
  // names (validation_metrics/loss, validation_metrics/perplexity). Its time is left out of the
  // next training line's throughput.
  void log_validation(int64_t step, double loss, double perplexity, int64_t tokens, double seconds);
  // metrics.enable_tensorboard: every logged step also goes to this writer (torchtitan's tags).
  void set_tensorboard(std::unique_ptr<TensorBoardWriter> writer) { tensorboard_ = std::move(writer); }
  // A run resumed from a checkpoint of `step`: the metrics file keeps its lines up to that step
  // and continues after them (call before the first log).
  void resume_after(int64_t step) { resume_step_ = step; }
  // Resets the window without logging (e.g. after start-up work that should not count).
  void reset_window();
  // Wall seconds since the window began (the next line's elapsed_s).
  double window_seconds() const;
  // "" when every metrics record (JSONL line, TensorBoard events) was written; else "metrics
  // lost from step N (...)". A failed write does not stop the step (Note [Lost metrics]).
  std::string lost_metrics() const;
  ~MetricsLogger();

 private:
  c10::Device device_;
  double flops_per_token_;
  double attention_flops_per_token_;
  double peak_flops_;
  int64_t non_data_parallel_size_;
  int64_t tokens_since_last_ = 0;
  double flops_since_last_ = 0;
  std::chrono::steady_clock::time_point window_start_;
  void open_jsonl();
  std::string jsonl_path_;
  int64_t resume_step_ = 0;
  int jsonl_fd_ = -1;  // O_APPEND; each line goes in with one write (util::append_whole_record)
  int64_t first_lost_step_ = -1;
  int64_t lost_records_ = 0;
  void record_loss(int64_t step, const std::string& what);
  std::unique_ptr<TensorBoardWriter> tensorboard_;
};

// 5760 -> "5,760"
std::string with_thousands(int64_t value);

}  // namespace titan::trainer::observe
