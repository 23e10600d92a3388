#include "trainer/train.h"

#include <ATen/Parallel.h>
#include <ATen/core/Reduction.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>

#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <tuple>

#include "model/scope.h"
#include "parallel/activation_checkpoint.h"
#include "parallel/mesh.h"
#include "parallel/parallelize.h"
#include "parallel/process_group.h"
#include "float8/float8_linear.h"
#include "trainer/converters.h"
#include "trainer/logging.h"
#include "trainer/memory.h"
#include "trainer/safetensors.h"
#include "trainer/signals.h"

namespace titan::trainer {
namespace {

std::string gib(int64_t bytes) {
  std::ostringstream s;
  s.precision(3);
  s << std::fixed << bytes / double(1ull << 30) << " GiB";
  return s.str();
}

// This process's rank for file names (RANK from the launcher; 0 when run alone).
int env_rank() {
  const char* r = std::getenv("RANK");
  return r ? std::atoi(r) : 0;
}

at::ScalarType dtype_from_name(const std::string& name) {
  if (name == "float32") return at::kFloat;
  if (name == "bfloat16") return at::kBFloat16;
  throw ConfigError("training.mixed_precision_param '" + name + "' (valid: bfloat16, float32)");
}

}  // namespace

Trainer::Trainer(JobConfig cfg) : cfg_(std::move(cfg)) {
  const auto& t = cfg_.training;
  if (t.device == "cuda") {
#ifndef TITAN_WITH_CUDA
    throw ConfigError(
        "training.device = cuda, but this titan was built without CUDA "
        "(build the CUDA variant: TITAN_CUDA=1 scripts/setup.sh)");
#else
    device_ = c10::Device(c10::kCUDA, 0);
#endif
  }
  if (t.num_threads > 0) at::set_num_threads(static_cast<int>(t.num_threads));
  compute_dtype_ = dtype_from_name(t.mixed_precision_param);
  for (const auto& w : cfg_.warnings) log_warn(w);
  set_cpu_memory_limit(static_cast<int64_t>(t.cpu_memory_limit_gib * double(1ll << 30)));
  // Before the model exists, so that a memory snapshot's record includes the parameters.
  profiler_ = std::make_unique<StepProfiler>(cfg_.profiling, cfg_.job.dump_folder, env_rank(), device_);
  init_distributed();

  // Data: the global batch is what one optimizer step consumes; this process takes its rows in
  // micro-batches of local_batch_size (gradient accumulation when there are several).
  const int64_t dp_degree = mesh_ ? mesh_->dims().dp() : 1;
  global_batch_size_ = t.global_batch_size > 0 ? t.global_batch_size : t.local_batch_size * dp_degree;
  if (global_batch_size_ % (t.local_batch_size * dp_degree) != 0)
    throw ConfigError("training.global_batch_size (" + std::to_string(global_batch_size_) +
                      ") must be a multiple of training.local_batch_size (" +
                      std::to_string(t.local_batch_size) + ") x data-parallel degree (" +
                      std::to_string(dp_degree) + ")");
  grad_accumulation_steps_ = global_batch_size_ / (t.local_batch_size * dp_degree);

  tokenizer_ = make_tokenizer(cfg_.model.tokenizer_path);
  DataConfig data_cfg;
  data_cfg.dataset = t.dataset;
  data_cfg.dataset_path = t.dataset_path;
  data_cfg.seq_len = t.seq_len;
  data_cfg.global_batch_size = global_batch_size_;
  data_cfg.seed = t.seed;
  if (mesh_) {
    data_cfg.dp_rank = mesh_->local_rank(parallel::MeshDim::kDp);
    data_cfg.dp_degree = dp_degree;
  }
  loader_ = std::make_unique<DataLoader>(data_cfg, *tokenizer_);
  log_info("tokenizer: " + tokenizer_->describe() + "; dataset: " + loader_->describe());

  build_model();

  AdamWOptions opt;
  opt.name = cfg_.optimizer.name;
  opt.beta1 = cfg_.optimizer.beta1;
  opt.beta2 = cfg_.optimizer.beta2;
  opt.eps = cfg_.optimizer.eps;
  opt.weight_decay = cfg_.optimizer.weight_decay;
  {
    model::NamedScope scope("optimizer", model::MemoryCategory::kOptimizerState);
    optimizer_ = std::make_unique<AdamW>(master_params_, opt);
  }
  {
    int64_t param_bytes = 0;
    for (const auto& p : master_params_) param_bytes += p.nbytes();
    // Exact bytes of this rank's training state (scripts/bench_parallel.sh reads this line).
    log_info("memory bytes: parameters " + std::to_string(param_bytes) + ", gradients " +
             std::to_string(param_bytes) + ", optimizer state " + std::to_string(optimizer_->state_bytes()));
  }
  lr_schedule_ = LrSchedule{t.steps, cfg_.lr_scheduler.warmup_steps, cfg_.lr_scheduler.decay_ratio,
                            cfg_.lr_scheduler.decay_type, cfg_.lr_scheduler.min_lr_factor};

  // Peak FLOP/s for mfu: the config, else a known GPU, else a GEMM probe on this CPU.
  double peak = cfg_.metrics.peak_flops;
  std::string peak_source = "metrics.peak_flops";
  if (peak <= 0 && device_.is_cpu()) {
    peak = probe_cpu_matmul_flops();
    peak_source = "float32 GEMM probe on this CPU (" + std::to_string(at::get_num_threads()) + " threads)";
  }
  if (peak > 0)
    log_info("mfu peak: " + std::to_string(peak / 1e12).substr(0, 6) + " TFLOP/s from " + peak_source);
  else
    log_warn("mfu: peak FLOP/s of this device is unknown; set metrics.peak_flops to see mfu");

  const double fpt = model::flops_per_token(model_->args(), t.seq_len);
  // Distributed: every rank writes metrics_rank<R>.jsonl; metrics.jsonl links to rank 0's.
  const auto dump = std::filesystem::path(cfg_.job.dump_folder);
  const std::string jsonl =
      (dump / (mesh_ ? "metrics_rank" + std::to_string(world_.rank) + ".jsonl" : "metrics.jsonl")).string();
  metrics_ = std::make_unique<MetricsLogger>(
      device_, fpt, peak, mesh_ ? mesh_->dims().non_data_parallel_size() : 1, jsonl);
  if (mesh_ && world_.rank == 0) {
    std::error_code ec;
    std::filesystem::remove(dump / "metrics.jsonl", ec);
    std::filesystem::create_symlink("metrics_rank0.jsonl", dump / "metrics.jsonl", ec);
  }
  log_info("training " + std::to_string(t.steps) + " steps: global batch " +
           std::to_string(global_batch_size_) + " x seq_len " + std::to_string(t.seq_len) + " (" +
           std::to_string(grad_accumulation_steps_) + " micro-batch(es) of " +
           std::to_string(t.local_batch_size) + "), metrics -> " + jsonl);
}

void Trainer::build_model() {
  model::ModelArgs args = model::llama3_flavor(cfg_.model.flavor);
  args.vocab_size = tokenizer_->vocab_size();
  args.max_seq_len = cfg_.training.seq_len;
  model_ = std::make_unique<model::Llama>(args);  // meta device: nothing allocated yet
  const model::ParamCount count = model::count_params(args);
  log_info("model llama3 " + cfg_.model.flavor + ": " + std::to_string(args.n_layers) +
           " layers, dim " + std::to_string(args.dim) + ", vocab " + std::to_string(args.vocab_size) +
           ", " + with_thousands(count.total) + " parameters, " +
           with_thousands(static_cast<int64_t>(model::flops_per_token(args, cfg_.training.seq_len))) +
           " FLOPs/token");
  // Converters before parallelization: TP then wraps the float8/int8 computes.
  converted_ = apply_model_converters(*model_, cfg_, device_);
  const bool fsdp = mesh_ && mesh_->size(parallel::MeshDim::kDpShard) > 1;
  if (converted_.fsdp_float8_all_gather && !fsdp)
    log_info("float8: enable_fsdp_float8_all_gather has no effect without FSDP "
             "(parallelism.data_parallel_shard_degree 1): each linear casts its own weight");

  if (mesh_) {
    // Sharded: parallelize on meta (TP, FSDP), then only this rank's shards are allocated.
    parallel::ParallelOptions popt;
    popt.reshard_after_forward = cfg_.parallelism.fsdp_reshard_after_forward;
    popt.loss_parallel = !cfg_.parallelism.disable_loss_parallel;
    popt.compute_dtype = compute_dtype_;
    popt.device = device_;
    popt.seq_len = cfg_.training.seq_len;
    popt.float8_tp_input_all_gather = cfg_.float8.tp_input_all_gather;
    if (converted_.fsdp_float8_all_gather && fsdp)
      popt.float8_all_gather_weights = use_fsdp_float8_all_gather(*model_);
    try {
      model::NamedScope scope("model init", model::MemoryCategory::kParameters);
      parallel_ = parallel::parallelize_llama(*model_, *mesh_, popt);
    } catch (const std::invalid_argument& e) {
      throw ConfigError(e.what());
    }
    model::NamedScope scope("model init", model::MemoryCategory::kParameters);
    parallel_->init_weights(static_cast<uint64_t>(cfg_.training.seed));
    param_names_ = parallel_->param_names();
    master_params_ = parallel_->master_params();
    log_info("parallel: " + parallel_->describe());
  } else {
    model::NamedScope scope("model init", model::MemoryCategory::kParameters);
    model_->materialize(device_, at::kFloat);
    model_->init_weights(static_cast<uint64_t>(cfg_.training.seed));
  }
  // Activation checkpointing wraps whatever block runner is installed (See Note [AC composes
  // outermost] in parallel/activation_checkpoint.h), so it is applied after parallelization.
  parallel::AcOptions ac;
  try {
    ac = parallel::parse_ac_options(cfg_.activation_checkpoint.mode,
                                    cfg_.activation_checkpoint.selective_ac_option);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(e.what());
  }
  parallel::apply_activation_checkpointing(*model_, ac);
  log_info("activation checkpointing: " + parallel::describe_ac(ac));
  if (!mesh_) model_->visit_params([&](const std::string& name, at::Tensor& p) {
    param_names_.push_back(name);
    param_slots_.push_back(&p);
    p.requires_grad_(true);
    master_params_.push_back(p);
  });
  if (!cfg_.checkpoint.initial_load_path.empty()) load_initial_weights(cfg_.checkpoint.initial_load_path);

  int64_t param_bytes = 0;
  for (const auto& p : master_params_) param_bytes += p.nbytes();
  log_info(std::string("memory: ") + (mesh_ ? "this rank's shards: " : "") + "parameters " +
           gib(param_bytes) + " (float32 masters, compute in " +
           cfg_.training.mixed_precision_param + "), gradients " + gib(param_bytes) +
           ", AdamW state " + gib(2 * param_bytes) + "; process RSS " + gib(process_rss_bytes()));
}

void Trainer::load_initial_weights(const std::string& path) {
  auto tensors = load_safetensors(path);
  at::NoGradGuard no_grad;
  if (parallel_) {  // every rank reads the file and keeps its shards
    for (const auto& name : param_names_) {
      auto it = tensors.find(name);
      if (it == tensors.end())
        throw std::runtime_error("checkpoint.initial_load_path '" + path + "' has no tensor '" + name + "'");
      parallel_->load_full(name, it->second);
    }
    log_info("loaded initial weights from " + path);
    return;
  }
  for (size_t i = 0; i < param_names_.size(); ++i) {
    auto it = tensors.find(param_names_[i]);
    if (it == tensors.end())
      throw std::runtime_error("checkpoint.initial_load_path '" + path + "' has no tensor '" +
                               param_names_[i] + "'");
    if (it->second.sizes() != master_params_[i].sizes()) {
      std::ostringstream msg;
      msg << "checkpoint.initial_load_path '" << path << "': tensor '" << param_names_[i]
          << "' has shape " << it->second.sizes() << " but the model expects "
          << master_params_[i].sizes();
      throw std::runtime_error(msg.str());
    }
    master_params_[i].copy_(it->second);
    tensors.erase(it);
  }
  if (!tensors.empty())
    throw std::runtime_error("checkpoint.initial_load_path '" + path + "' has " +
                             std::to_string(tensors.size()) + " tensor(s) the model lacks, e.g. '" +
                             tensors.begin()->first + "'");
  log_info("loaded initial weights from " + path);
}

void Trainer::bind_compute_params() {
  model::NamedScope scope("bind params", model::MemoryCategory::kParameters);
  if (parallel_) return parallel_->bind_compute_params();
  for (size_t i = 0; i < param_slots_.size(); ++i)
    *param_slots_[i] = compute_dtype_ == at::kFloat ? master_params_[i]
                                                    : master_params_[i].to(compute_dtype_);
}

std::pair<double, double> Trainer::train_step(int64_t step) {
  const auto& t = cfg_.training;
  const double lr = cfg_.optimizer.lr * lr_schedule_.factor(step);
  if (cfg_.comm.debug_fail_at_step == step && cfg_.comm.debug_fail_rank == world_.rank)
    throw std::runtime_error("rank " + std::to_string(world_.rank) + " fails on purpose at step " +
                             std::to_string(step) + " (comm.debug_fail_at_step)");
  optimizer_->zero_grad();

  Batch batch = loader_->next_batch();  // this rank's rows of the global batch, [rows, S]
  // Loss scaling: every micro-batch contributes sum(token losses) / (global batch tokens), so
  // the accumulated gradient is that of the global token-mean loss, whatever the split.
  const double global_tokens = static_cast<double>(global_batch_size_) * t.seq_len;
  double loss_sum = 0;
  for (int64_t micro = 0; micro < grad_accumulation_steps_; ++micro) {
    at::Tensor inputs = batch.inputs.narrow(0, micro * t.local_batch_size, t.local_batch_size).to(device_);
    at::Tensor labels = batch.labels.narrow(0, micro * t.local_batch_size, t.local_batch_size).to(device_);
    bind_compute_params();
    at::Tensor loss;
    {
      model::NamedScope scope("forward", model::MemoryCategory::kActivations);
      at::Tensor logits = model_->forward(inputs);  // [b, S, V] (loss parallel: [b, S, V/tp])
      loss = parallel_ ? parallel_->loss_sum(logits, labels)
                       : at::cross_entropy_loss(logits.flatten(0, 1).to(at::kFloat), labels.flatten(),
                                                /*weight=*/std::nullopt, at::Reduction::Sum);
    }
    {
      model::NamedScope scope("backward", model::MemoryCategory::kGradients);
      torch::autograd::backward({loss / global_tokens});
      if (parallel_) parallel_->after_backward();
    }
    loss_sum += loss.item<double>();
    metrics_->add_tokens(inputs.numel());
  }
  model::NamedScope scope("optimizer", model::MemoryCategory::kOptimizerState);
  if (parallel_) {
    // Gradients are sums over data-parallel ranks (FSDP reduce-scatters them during backward);
    // TP-replicated weights and HSDP replicas are summed here; the norm is one all-reduce.
    parallel_->reduce_grads();
    loss_sum = parallel_->sum_over_dp(loss_sum);
  }
  const double grad_norm = parallel_ ? parallel_->clip_grad_norm(t.max_norm)
                                     : clip_grad_norm(master_params_, t.max_norm);
  optimizer_->step(lr);
  if (converted_.precompute_fsdp_float8_scales && parallel_) parallel_->precompute_float8_scales();
  if (converted_.delayed_scaling) {
    // tensorwise_delayed: every linear's amax history advances once per step, with ONE
    // all-reduce(max) over all ranks so every replica scales identically.
    std::function<void(at::Tensor&)> all_reduce_max;
    if (mesh_) all_reduce_max = [this](at::Tensor& t) { mesh_->world().all_reduce(t, parallel::ReduceOp::kMax); };
    float8::sync_amax_history(converted_.float8_computes, all_reduce_max);
  }
  return {loss_sum / global_tokens, grad_norm};
}

TrainResult Trainer::train() {
  TrainResult result;
  metrics_->reset_window();
  for (int64_t step = 1; step <= cfg_.training.steps; ++step) {
    if (stop_requested()) {
      log_warn("received signal " + std::to_string(stop_signal()) + ": stopping after step " +
               std::to_string(step - 1));
      result.stopped_by_signal = true;
      break;
    }
    profiler_->step_begin(step);
    double loss = 0, grad_norm = 0;
    try {
      std::tie(loss, grad_norm) = train_step(step);
    } catch (const c10::OutOfMemoryError&) {
      profiler_->on_out_of_memory(step);  // the snapshot of the failing step, then exit
      throw;
    }
    profiler_->step_end(step);
    result.losses.push_back(loss);
    result.grad_norms.push_back(grad_norm);
    result.steps_completed = step;
    if (!std::isfinite(loss))
      throw std::runtime_error("loss is " + std::to_string(loss) + " at step " + std::to_string(step) +
                               " (diverged): lower optimizer.lr or check the data");
    if (step == 1 || step % cfg_.metrics.log_freq == 0 || step == cfg_.training.steps)
    {
      StepMetrics m{step, loss, grad_norm, cfg_.optimizer.lr * lr_schedule_.factor(step)};
      if (mesh_) {
        m.comm_seconds = mesh_->comm_seconds() - comm_seconds_logged_;
        comm_seconds_logged_ = mesh_->comm_seconds();
      }
      metrics_->log(m);
    }
  }
  if (!cfg_.checkpoint.export_path.empty()) export_weights(cfg_.checkpoint.export_path);
  return result;
}

Trainer::~Trainer() = default;

void Trainer::init_distributed() {
  const auto& p = cfg_.parallelism;
  try {
    world_ = parallel::world_from_env();
  } catch (const std::runtime_error& e) {
    throw ConfigError(std::string("distributed environment: ") + e.what());
  }
  parallel::ParallelDims dims;
  try {
    dims = parallel::resolve_parallel_dims(p.data_parallel_replicate_degree, p.data_parallel_shard_degree,
                                           p.tensor_parallel_degree, p.pipeline_parallel_degree,
                                           p.context_parallel_degree, world_.world_size);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(e.what());
  }
  if (world_.world_size == 1) return;
#ifdef TITAN_WITH_CUDA
  if (device_.is_cuda()) device_ = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(world_.local_rank));
#endif
  parallel::CommOptions opts;
  opts.init_timeout = std::chrono::seconds(cfg_.comm.init_timeout_seconds);
  opts.timeout = std::chrono::seconds(cfg_.comm.train_timeout_seconds);
  opts.backend = device_.is_cuda() ? "nccl" : "gloo";
  log_info("distributed: " + parallel::describe(world_) + ", " + opts.backend + ", mesh " + dims.describe());
  mesh_ = std::make_unique<parallel::DeviceMesh>(parallel::init_process_group(world_, opts), dims);
}

void Trainer::export_weights(const std::string& path) const {
  const at::ScalarType dtype = cfg_.checkpoint.export_dtype == "bfloat16" ? at::kBFloat16 : at::kFloat;
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (size_t i = 0; i < param_names_.size(); ++i) {
    // Sharded: every rank joins the gathers of each full parameter; rank 0 writes the file.
    at::Tensor full = parallel_ ? parallel_->full_param(param_names_[i]) : master_params_[i].detach();
    if (world_.rank == 0) tensors.emplace_back(param_names_[i], full.to(at::kCPU).to(dtype));
  }
  if (world_.rank != 0) return;
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  save_safetensors(path, tensors, {{"format", "pt"}, {"flavor", cfg_.model.flavor}});
  log_info("exported weights to " + path);
}

}  // namespace titan::trainer
