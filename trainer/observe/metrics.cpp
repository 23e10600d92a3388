#include "trainer/observe/metrics.h"

#include <algorithm>
#include <ATen/Parallel.h>
#include <ATen/ops/randn.h>
#include <c10/core/ScalarType.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#ifdef TITAN_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include "model/linear.h"
#include "trainer/observe/memory.h"
#include "util/atomic_file.h"
#include "util/logging.h"

namespace titan::trainer::observe {

std::string with_thousands(int64_t value) {
  std::string digits = std::to_string(value < 0 ? -value : value);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return value < 0 ? "-" + out : out;
}

double probe_cpu_matmul_flops(at::ScalarType dtype) {
  // Several sizes, the best rate wins: a small GEMM underrates what the model's larger ones
  // reach (an mfu above 100% is the symptom), and a bf16 GEMM's rate depends on its kernel's
  // blocking more than float32's. The product is the linears' own (model::times_transposed: the
  // library training.cpu_float32_gemm names), so the peak is the one the step's GEMMs can reach.
  double best = 0;
  for (const int64_t n : {512, 1024, 2048}) {
    at::Tensor a = at::randn({n, n}).to(dtype), b = at::randn({n, n}).to(dtype);
    model::times_transposed(a, b);  // warm-up: thread pool, caches, the kernel's packing buffers
    for (int trial = 0; trial < 3; ++trial) {
      const auto start = std::chrono::steady_clock::now();
      int reps = 0;
      double elapsed = 0;
      do {
        model::times_transposed(a, b);
        ++reps;
        elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      } while (elapsed < 0.04);
      best = std::max(best, 2.0 * static_cast<double>(n * n * n) * reps / elapsed);
    }
  }
  return best;
}

double known_gpu_peak_flops(const std::string& name) {
  // Dense (no sparsity) bf16 peaks from the vendors' data sheets, the table of torchtitan's
  // get_peak_flops (torchtitan/tools/utils.py, v0.2.2) without its A100 fallback for unknown
  // names. The first key found in the name wins, so "H100 NVL" precedes "H100" and "H200"
  // precedes "H20".
  const std::pair<const char*, double> table[] = {
      {"H100 NVL", 835e12}, {"H100 PCIe", 756e12}, {"H100", 989e12},   {"H200", 989e12},
      {"H20", 148e12},      {"A100", 312e12},      {"B200", 2.25e15},  {"MI355X", 2500e12},
      {"MI300X", 1300e12},  {"MI325X", 1300e12},   {"MI250X", 191.5e12}, {"L40S", 362e12}};
  for (const auto& [key, peak] : table)
    if (name.find(key) != std::string::npos) return peak;
  return 0;
}

PeakFlops peak_flops_for_mfu(double configured_peak_flops, c10::Device device, at::ScalarType compute_dtype,
                             const std::string& low_precision_linears) {
  if (configured_peak_flops > 0) return {configured_peak_flops, "metrics.peak_flops"};
  const std::string counted =
      low_precision_linears.empty() ? "" : "; " + low_precision_linears + " GEMMs count against it, as in torchtitan";
  if (device.is_cuda()) {
#ifdef TITAN_WITH_CUDA
    cudaDeviceProp properties{};
    const int index = device.has_index() ? device.index() : 0;
    if (cudaGetDeviceProperties(&properties, index) != cudaSuccess) {
      cudaGetLastError();  // consume the error so that the next CUDA call does not report it
      return {0, "CUDA device " + std::to_string(index) + " (its properties could not be read)"};
    }
    const std::string name = properties.name;
    const double peak = known_gpu_peak_flops(name);
    return {peak, "dense bf16 peak of " + name + (peak > 0 ? counted : " (not in titan's table)")};
#else
    return {0, "a CUDA device in a build without CUDA"};
#endif
  }
  return {probe_cpu_matmul_flops(compute_dtype),
          std::string(c10::toString(compute_dtype)) + " GEMM probe on this CPU (" +
              std::to_string(at::get_num_threads()) + " threads, best of 512^3 .. 2048^3)" +
              (low_precision_linears.empty() ? "" : "; " + low_precision_linears + " GEMMs are emulated in it")};
}

MetricsLogger::MetricsLogger(c10::Device device, double flops_per_token, double attention_flops_per_token,
                             double peak_flops, int64_t non_data_parallel_size, const std::string& jsonl_path)
    : device_(device),
      flops_per_token_(flops_per_token),
      attention_flops_per_token_(attention_flops_per_token),
      peak_flops_(peak_flops),
      non_data_parallel_size_(non_data_parallel_size) {
  jsonl_path_ = jsonl_path;
  if (!jsonl_path.empty()) std::filesystem::create_directories(std::filesystem::path(jsonl_path).parent_path());
  reset_window();
}

double MetricsLogger::window_seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - window_start_).count();
}

void MetricsLogger::reset_window() {
  tokens_since_last_ = 0;
  flops_since_last_ = 0;
  window_start_ = std::chrono::steady_clock::now();
  reset_peak_memory(device_);
}

// A fresh run starts the file; a resumed one keeps the lines of the steps it resumed after
// (rewritten whole or not at all, util/atomic_file.h) and appends, so the file reads as one run.
void MetricsLogger::open_jsonl() {
  namespace fs = std::filesystem;
  if (resume_step_ > 0 && fs::exists(jsonl_path_)) {
    std::string kept;
    std::ifstream in(jsonl_path_);
    std::string line;
    while (std::getline(in, line)) {
      const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!j.is_discarded() && j.contains("step") && j["step"].get<int64_t>() <= resume_step_) kept += line + '\n';
    }
    util::write_file_atomic(jsonl_path_, kept);
  }
  const int flags = O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (resume_step_ > 0 ? 0 : O_TRUNC);
  jsonl_fd_ = ::open(jsonl_path_.c_str(), flags, 0644);
  if (jsonl_fd_ < 0)
    throw std::runtime_error("cannot write metrics file '" + jsonl_path_ + "': " + std::strerror(errno));
}

MetricsLogger::~MetricsLogger() {
  if (jsonl_fd_ >= 0) ::close(jsonl_fd_);
}

// Note [Lost metrics]: the step goes on (a full disk should not kill a long run over a log
// line), a warning names the file and the errno text, and the run ends with an error naming the
// first lost step (Trainer::train checks lost_metrics()), so a run whose record has holes never
// reports success.
void MetricsLogger::record_loss(int64_t step, const std::string& what) {
  util::log_warn("metrics of step " + std::to_string(step) + " lost: " + what);
  if (first_lost_step_ < 0) first_lost_step_ = step;
  ++lost_records_;
}

std::string MetricsLogger::lost_metrics() const {
  if (first_lost_step_ < 0) return "";
  return "metrics lost from step " + std::to_string(first_lost_step_) + " (" + std::to_string(lost_records_) +
         " write(s) failed; the warnings above name the file and the error)";
}

void MetricsLogger::log_validation(int64_t step, double loss, double perplexity, int64_t tokens, double seconds) {
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%svalidate step: %2lld  %sloss: %7.4f  %sperplexity: %.3f  %stokens: %s  %stime: %.2fs%s",
                util::color_code("yellow"), static_cast<long long>(step), util::color_code("green"), loss,
                util::color_code("cyan"), perplexity, util::color_code("blue"), with_thousands(tokens).c_str(),
                util::color_code("yellow"), seconds, util::color_code("reset"));
  util::log_info(buf);
  window_start_ += std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds));
  if (!jsonl_path_.empty() && jsonl_fd_ < 0) open_jsonl();
  if (jsonl_fd_ >= 0) {
    const nlohmann::json record = {{"step", step},
                                   {"validation_metrics/loss", loss},
                                   {"validation_metrics/perplexity", perplexity},
                                   {"validation_metrics/tokens", tokens},
                                   {"validation_metrics/time_s", seconds}};
    try {
      util::append_whole_record(jsonl_fd_, record.dump() + '\n', jsonl_path_);
    } catch (const std::runtime_error& e) {
      record_loss(step, e.what());
    }
  }
  if (tensorboard_) try {
      tensorboard_->add_scalar("validation_metrics/loss", loss, step);
      tensorboard_->add_scalar("validation_metrics/perplexity", perplexity, step);
      tensorboard_->flush();
    } catch (const std::runtime_error& e) {
      record_loss(step, e.what());
    }
}

void MetricsLogger::log(const StepMetrics& m) {
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - window_start_).count();
  const double tps = tokens_since_last_ / (elapsed * non_data_parallel_size_);
  const double tflops = flops_since_last_ / (elapsed * non_data_parallel_size_) / 1e12;
  const double mfu = peak_flops_ > 0 ? 100.0 * tflops * 1e12 / peak_flops_ : 0.0;
  const MemoryStats mem = memory_stats(device_);
  const double gib = mem.peak_bytes / double(1ull << 30);
  const double pct = mem.device_capacity > 0 ? 100.0 * mem.peak_bytes / mem.device_capacity : 0;

  char mfu_text[32] = "n/a";
  if (peak_flops_ > 0) std::snprintf(mfu_text, sizeof(mfu_text), "%.2f%%", mfu);
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "%sstep: %2lld  %sloss: %7.4f  %sgrad_norm: %7.4f  %smemory: %5.2fGiB(%.2f%%)  "
                "%stps: %s  %stflops: %.2f  %smfu: %s%s",
                util::color_code("red"), static_cast<long long>(m.step), util::color_code("green"), m.loss,
                util::color_code("cyan"), m.grad_norm, util::color_code("yellow"), gib, pct,
                util::color_code("blue"), with_thousands(std::llround(tps)).c_str(), util::color_code("cyan"),
                tflops, util::color_code("green"), mfu_text, util::color_code("reset"));
  std::string line(buf);
  if (m.mtp_loss >= 0) {
    char mtp[48];
    std::snprintf(mtp, sizeof(mtp), "  mtp_loss: %7.4f", m.mtp_loss);
    line += mtp;
  }
  if (!m.expert_load.empty()) {
    char load[48];
    std::snprintf(load, sizeof(load), "  expert_load: %.2f", *std::max_element(m.expert_load.begin(), m.expert_load.end()));
    line += load;
  }
  if (m.skipped_steps > 0) line += "  skipped: " + std::to_string(m.skipped_steps);
  util::log_info(line);

  if (!jsonl_path_.empty() && jsonl_fd_ < 0) open_jsonl();
  if (jsonl_fd_ >= 0) {
    nlohmann::json record = {{"step", m.step},         {"loss", m.loss},
                             {"grad_norm", m.grad_norm}, {"lr", m.lr},
                             {"memory_peak_bytes", mem.peak_bytes},
                             {"memory_peak_pct", pct},  {"tps", tps},
                             {"peak_rss_bytes", process_peak_rss_bytes()},
                             {"tokens", tokens_since_last_},
                             {"tflops", tflops},        {"mfu_pct", mfu},
                             {"elapsed_s", elapsed}};
    if (m.comm_seconds >= 0) record["comm_s"] = m.comm_seconds;
    if (m.comm_exposed_seconds >= 0) record["comm_exposed_s"] = m.comm_exposed_seconds;
    if (!m.comm_seconds_by_dim.empty()) record["comm_s_by_dim"] = m.comm_seconds_by_dim;
    if (m.skipped_steps > 0) record["skipped_steps"] = m.skipped_steps;
    if (!m.expert_load.empty()) record["expert_load"] = m.expert_load;  // per MoE layer, max / mean
    if (m.mtp_loss >= 0) record["mtp_loss"] = m.mtp_loss;
    if (!m.compute_seconds_by_rank.empty()) {
      record["compute_s_by_rank"] = m.compute_seconds_by_rank;
      record["straggler_ratio"] = m.straggler_ratio;
      if (m.straggler_rank >= 0) record["straggler_rank"] = m.straggler_rank;
    }
    try {
      util::append_whole_record(jsonl_fd_, record.dump() + '\n', jsonl_path_);  // whole line or none
    } catch (const std::runtime_error& e) {
      record_loss(m.step, e.what());
    }
  }
  if (tensorboard_) try {
    tensorboard_->add_scalar("loss_metrics/global_avg_loss", m.loss, m.step);
    tensorboard_->add_scalar("grad_norm", m.grad_norm, m.step);
    tensorboard_->add_scalar("lr", m.lr, m.step);
    tensorboard_->add_scalar("memory/max_reserved(GiB)", gib, m.step);
    tensorboard_->add_scalar("memory/max_reserved(%)", pct, m.step);
    tensorboard_->add_scalar("throughput(tps)", tps, m.step);
    tensorboard_->add_scalar("tflops", tflops, m.step);
    tensorboard_->add_scalar("mfu(%)", mfu, m.step);
    if (!m.compute_seconds_by_rank.empty()) {
      tensorboard_->add_scalar("stragglers/slowest_over_median", m.straggler_ratio, m.step);
      for (size_t r = 0; r < m.compute_seconds_by_rank.size(); ++r)
        tensorboard_->add_scalar("stragglers/compute_s_rank" + std::to_string(r), m.compute_seconds_by_rank[r], m.step);
    }
    tensorboard_->flush();
  } catch (const std::runtime_error& e) {
    record_loss(m.step, e.what());
  }
  reset_window();
}

}  // namespace titan::trainer::observe
