// trainer/build.cpp — the Trainer's construction, one function per part, called in order by
// the constructor (trainer/train.cpp): device, mesh, data, model (and its schedule), optimizer,
// checkpoints, metrics.
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <sstream>

#include "float8/recipe.h"
#include "model/flavors.h"
#include "model/linear.h"
#include "model/scope.h"
#include "parallel/comm/comm_trace.h"
#include "parallel/comm/mesh.h"
#include "parallel/comm/process_group.h"
#include "parallel/parallelize.h"
#include "parallel/pipeline/schedule.h"
#include "trainer/config/agreement.h"
#include "trainer/config/parallel_options.h"
#include "trainer/converters.h"
#include "trainer/determinism.h"
#include "trainer/fault_injection.h"
#include "trainer/observe/memory.h"
#include "trainer/train.h"
#include "util/logging.h"

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

}  // namespace

void Trainer::init_device() {
  const auto& t = cfg_.training;
  if (t.device == "cuda") {
#ifndef TITAN_WITH_CUDA
    throw config::ConfigError(
        "training.device = cuda, but this titan was built without CUDA "
        "(build the CUDA variant: TITAN_CUDA=1 scripts/setup.sh)");
#else
    device_ = c10::Device(c10::kCUDA, 0);
#endif
  }
  if (t.num_threads > 0) at::set_num_threads(static_cast<int>(t.num_threads));
  model::set_cpu_float32_gemm(config::cpu_float32_gemm_of(cfg_));
  // Before any cuBLAS handle exists: cuBLAS reads CUBLAS_WORKSPACE_CONFIG when it creates one.
  apply_determinism(t.deterministic);
  compute_dtype_ = config::dtype_from_name(t.mixed_precision_param, "training.mixed_precision_param");
  for (const auto& w : cfg_.warnings) util::log_warn(w);
  for (const auto& n : cfg_.notes) util::log_info("config: " + n);
  util::log_info("device: " + device_.str() + " (training.device = " + t.device + ")");
  util::log_info("dtypes: compute " + t.mixed_precision_param + ", master weights and optimizer state "
                 "float32, gradient reduction " + t.mixed_precision_reduce +
                 (t.cpu_float32_gemm == "onednn" ? "; float32 CPU GEMMs through oneDNN (training.cpu_float32_gemm)" : ""));
  observe::set_cpu_memory_limit(static_cast<int64_t>(t.cpu_memory_limit_gib * double(1ll << 30)));
  // Before the model exists, so that a memory snapshot's record includes the parameters.
  profiler_ = std::make_unique<observe::StepProfiler>(cfg_.profiling, cfg_.job.dump_folder, env_rank(), device_);
}

void Trainer::init_mesh() {
  try {
    world_ = launcher::world_from_env();
  } catch (const std::runtime_error& e) {
    throw config::ConfigError(std::string("distributed environment: ") + e.what());
  }
  // Test-only faults exist only when asked for (trainer/fault_injection.h).
  if (auto hook = fault_injection_hook(cfg_.comm, world_.rank, world_.world_size))
    before_step_hooks_.push_back(std::move(hook));
  // Config errors now, before any rank connects (the layout planner runs the same checks).
  const parallel::comm::ParallelDims dims = config::check_layout(cfg_, world_.world_size).dims;
  std::unique_ptr<parallel::comm::Comm> world;  // a single process needs none
  if (world_.world_size > 1) {
#ifdef TITAN_WITH_CUDA
    if (device_.is_cuda()) device_ = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(world_.local_rank));
#endif
    parallel::comm::CommOptions opts;
    opts.init_timeout = std::chrono::seconds(cfg_.comm.init_timeout_seconds);
    opts.timeout = std::chrono::seconds(cfg_.comm.train_timeout_seconds);
    opts.backend = device_.is_cuda() ? "nccl" : "gloo";
    opts.debug_link_latency_ms = cfg_.comm.debug_link_latency_ms;
    opts.debug_link_bytes_per_second = cfg_.comm.debug_link_bytes_per_second;
    parallel::comm::comm_trace().configure(static_cast<size_t>(cfg_.comm.trace_buf_size),
                                     (std::filesystem::path(cfg_.job.dump_folder) / "comm_trace" /
                                      ("rank" + std::to_string(world_.rank) + ".json")).string(),
                                     world_.rank);
    util::log_info("distributed: " + launcher::describe(world_) + ", " + opts.backend + ", mesh " + dims.describe());
    world = parallel::comm::init_process_group({world_.rank, world_.world_size,
                                                world_.local_world_size == world_.world_size, world_.master_addr,
                                                world_.master_port},
                                               opts);
    // Before any collective whose size depends on the config (trainer/config/agreement.h).
    config::check_config_agreement(*world, cfg_, device_);
  }
  mesh_ = std::make_unique<parallel::comm::DeviceMesh>(std::move(world), dims);
}

void Trainer::init_data() {
  const auto& t = cfg_.training;
  // Data: the global batch is what one optimizer step consumes; this process takes its rows in
  // micro-batches of local_batch_size (gradient accumulation when there are several).
  const int64_t dp_degree = mesh_->dims().dp();
  global_batch_size_ = config::global_batch_size(cfg_, mesh_->dims());

  tokenizer_ = data::make_tokenizer(cfg_.model.tokenizer_path);
  data::DataConfig data_cfg;
  data_cfg.dataset = t.dataset;
  data_cfg.dataset_path = t.dataset_path;
  data_cfg.seq_len = t.seq_len;
  data_cfg.global_batch_size = global_batch_size_;
  data_cfg.seed = t.seed;
  data_cfg.dp_rank = mesh_->local_rank(parallel::comm::MeshDim::kDp);
  data_cfg.dp_degree = dp_degree;
  loader_ = std::make_unique<data::DataLoader>(data_cfg, *tokenizer_);
  util::log_info("tokenizer: " + tokenizer_->describe());
  util::log_info("dataset: " + loader_->describe());
  if (cfg_.validation.enable) {
    // The layout's checks (sequence-parallel and context-parallel splits, the pipeline's
    // boundary tensors) were made for training.seq_len.
    const parallel::comm::ParallelDims& dims = mesh_->dims();
    if ((dims.tp > 1 || dims.cp > 1 || dims.pp > 1) && cfg_.validation.seq_len != t.seq_len)
      throw config::ConfigError("validation.seq_len = " + std::to_string(cfg_.validation.seq_len) +
                                " must equal training.seq_len = " + std::to_string(t.seq_len) +
                                " under tensor, context or pipeline parallelism (their splits are made for it)");
    validator_ = std::make_unique<Validator>(cfg_, *tokenizer_, data_cfg.dp_rank, static_cast<int>(dp_degree));
    util::log_info("validation: " + validator_->describe());
  }

}

void Trainer::check_memory_fits() {
  // See Note [Memory shortfall]: a run whose estimate is far above the machine would fail at its
  // first large allocation with only the allocator's byte count; the estimate says which key.
  const std::string shortfall =
      observe::memory_shortfall(cfg_, mesh_->local_rank(parallel::comm::MeshDim::kPp), kRefuseAboveEstimate);
  if (!shortfall.empty()) throw config::ConfigError(shortfall);
}

void Trainer::build_model() {
  model::ModelArgs args = model::trained_model_args(cfg_.model.name, cfg_.model.flavor, tokenizer_->vocab_size());
  args.eos_id = tokenizer_->eos_id();  // ends a document (block-causal attention)
  args.block_causal = config::block_causal_attention(cfg_);
  if (args.moe) {
    args.moe->force_load_balance = cfg_.model.moe_force_load_balance;
    args.moe->load_balance_coeff = cfg_.model.load_balance_coeff;  // 0: the bias exists and never moves
  }
  args.mtp_layers = cfg_.model.mtp_layers;
  args.mtp_loss_weight = cfg_.model.mtp_loss_weight;
  args.max_seq_len = cfg_.training.seq_len;  // the RoPE table's length
  if (cfg_.validation.enable) args.max_seq_len = std::max(args.max_seq_len, cfg_.validation.seq_len);
  model_ = std::make_unique<model::Transformer>(args);  // meta device: nothing allocated yet
  const model::ParamCount count = model::count_params(args);
  util::log_info("model " + cfg_.model.name + " " + cfg_.model.flavor + ": " + std::to_string(args.n_layers) +
                 " layers, dim " + std::to_string(args.dim) + ", vocab " + std::to_string(args.vocab_size) +
           ", " + observe::with_thousands(count.total) + " parameters, " +
           observe::with_thousands(static_cast<int64_t>(model::flops_per_token(args, cfg_.training.seq_len))) +
           " FLOPs/token");
  // Converters before parallelization: TP then wraps the float8/int8 computes.
  const ConvertedModel converted = apply_model_converters(*model_, cfg_, device_);
  if (converted.float8)
    low_precision_linears_ = cfg_.float8.recipe_name == float8::kBlockwiseRecipeName ? "blockwise float8" : "float8";
  else if (converted.mx)
    low_precision_linears_ = "MX (" + cfg_.mx.recipe_name + ")";
  else if (converted.int8)
    low_precision_linears_ = "int8";
  if (converted.float8 && cfg_.float8.enable_fsdp_float8_all_gather && mesh_->size(parallel::comm::MeshDim::kDpShardCp) == 1)
    util::log_info("float8: enable_fsdp_float8_all_gather has no effect without FSDP "
                   "(parallelism.data_parallel_shard_degree 1): each linear casts its own weight");

  try {
    parallel::check_block_scaled_tp(*model_, mesh_->dims().tp);
  } catch (const std::invalid_argument& e) {
    throw config::ConfigError(e.what());
  }
  const parallel::ParallelOptions popt = config::parallel_options(cfg_, args, mesh_->dims(), device_, converted.float8);
  // Sharded or not, only this rank's shards are ever allocated: the plan runs on meta.
  model::NamedScope scope("model init", model::MemoryCategory::kParameters);
  parallel_ = parallel::parallelize_model(*model_, *mesh_, popt);
  parallel_->init_weights(static_cast<uint64_t>(cfg_.training.seed));
  for (const std::string& line : parallel_->describe()) util::log_info("parallel: " + line);
  after_backward_hook_ = nonfinite_gradient_hook(cfg_.training.debug_nonfinite_at_step, *parallel_);  // tests only

  int64_t param_bytes = 0;
  for (const auto& p : master_params()) param_bytes += p.nbytes();
  util::log_info(std::string("memory: ") + (world_.world_size > 1 ? "this rank's shards: " : "") + "parameters " +
                 gib(param_bytes) + " (float32 masters, compute in " +
                 cfg_.training.mixed_precision_param + "), gradients " + gib(param_bytes) +
           ", AdamW state " + gib(2 * param_bytes) + "; process RSS " + gib(observe::process_rss_bytes()));
  // The schedule, beside the model parts: the trainer owns both (See Note [What a schedule sees
  // of the model] in parallel/pipeline/schedule.h).
  schedule_ = parallel::build_schedule(*model_, *parallel_, *mesh_, popt);
  util::log_info("parallel: " + schedule_->describe());
}

void Trainer::init_optimizer() {
  const auto& t = cfg_.training;
  optim::AdamWOptions opt;
  opt.name = cfg_.optimizer.name;
  opt.beta1 = cfg_.optimizer.beta1;
  opt.beta2 = cfg_.optimizer.beta2;
  opt.eps = cfg_.optimizer.eps;
  opt.weight_decay = cfg_.optimizer.weight_decay;
  {
    model::NamedScope scope("optimizer", model::MemoryCategory::kOptimizerState);
    optimizer_ = std::make_unique<optim::AdamW>(master_params(), opt, parallel_->compute_copies());
  }
  {
    int64_t param_bytes = 0;
    for (const auto& p : master_params()) param_bytes += p.nbytes();
    // Exact bytes of this rank's training state (scripts/bench_parallel.sh reads this line).
    util::log_info("memory bytes: parameters " + std::to_string(param_bytes) + ", gradients " +
                   std::to_string(param_bytes) + ", optimizer state " + std::to_string(optimizer_->state_bytes()));
  }
  lr_schedule_ = optim::LrSchedule{t.steps, cfg_.lr_scheduler.warmup_steps, cfg_.lr_scheduler.decay_ratio,
                                   cfg_.lr_scheduler.decay_type, cfg_.lr_scheduler.min_lr_factor};
}

void Trainer::init_metrics() {
  const auto& t = cfg_.training;
  // Peak FLOP/s for mfu: the config, else the CUDA device's dense bf16 peak, else a GEMM probe
  // on this CPU in the compute dtype.
  const observe::PeakFlops peak =
      observe::peak_flops_for_mfu(cfg_.metrics.peak_flops, device_, compute_dtype_, low_precision_linears_);
  if (peak.flops_per_second > 0)
    util::log_info("mfu peak: " + std::to_string(peak.flops_per_second / 1e12).substr(0, 6) + " TFLOP/s from " +
                   peak.source);
  else
    util::log_warn("mfu: peak FLOP/s unknown (" + peak.source + "); set metrics.peak_flops to see mfu");

  const double fpt = model::flops_per_token(model_->args(), t.seq_len);
  // Distributed: every rank writes metrics_rank<R>.jsonl; metrics.jsonl links to rank 0's.
  const bool distributed = world_.world_size > 1;
  const auto dump = std::filesystem::path(cfg_.job.dump_folder);
  const std::string jsonl =
      (dump / (distributed ? "metrics_rank" + std::to_string(world_.rank) + ".jsonl" : "metrics.jsonl")).string();
  metrics_ = std::make_unique<observe::MetricsLogger>(device_, fpt, model::attention_flops_per_token(model_->args(), t.seq_len),
                                                      peak.flops_per_second,
                                                      mesh_->dims().non_data_parallel_size(), jsonl);
  if (start_step_ > 0) metrics_->resume_after(start_step_);  // the file continues the run
  if (parallel::comm::Comm* world = mesh_->world(); world && cfg_.metrics.straggler_factor > 0)
    stragglers_ = std::make_unique<observe::StragglerDetector>(*world, world_.group_rank, cfg_.metrics.straggler_factor);
  if (cfg_.metrics.enable_tensorboard && (cfg_.metrics.save_for_all_ranks || world_.rank == 0)) {
    // torchtitan's layout: <dump_folder>/<save_tb_folder>/<start time>[/rank_<R>].
    char stamp[32];
    const std::time_t now = std::time(nullptr);
    std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M", std::localtime(&now));
    auto tb = dump / cfg_.metrics.save_tb_folder / stamp;
    if (cfg_.metrics.save_for_all_ranks) tb /= "rank_" + std::to_string(world_.rank);
    metrics_->set_tensorboard(std::make_unique<observe::TensorBoardWriter>(tb.string()));
    util::log_info("tensorboard: event files in " + tb.string());
  }
  if (distributed && world_.rank == 0) {
    std::error_code ec;
    std::filesystem::remove(dump / "metrics.jsonl", ec);
    std::filesystem::create_symlink("metrics_rank0.jsonl", dump / "metrics.jsonl", ec);
  }
  // "gradient accumulation steps" as torchtitan says it: the passes of local_batch_size rows per
  // optimizer step (a pipeline's own micro-batches, within each pass, are in its schedule line).
  const int64_t accumulation_steps = global_batch_size_ / (t.local_batch_size * mesh_->dims().dp());
  util::log_info("training " + std::to_string(t.steps) + " steps: global batch " + std::to_string(global_batch_size_) +
                 " x seq_len " + std::to_string(t.seq_len) + ", " + std::to_string(accumulation_steps) +
                 " gradient accumulation step(s) of local batch " + std::to_string(t.local_batch_size) +
                 ", metrics -> " + jsonl);
}

}  // namespace titan::trainer
