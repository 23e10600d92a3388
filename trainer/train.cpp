#include "trainer/train.h"

#include <ATen/Parallel.h>
#include <ATen/core/Reduction.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>

#include <ATen/ops/tensor.h>

#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include "float8/recipe.h"
#include "model/scope.h"
#include "parallel/activation_checkpoint.h"
#include "parallel/comm_trace.h"
#include "parallel/mesh.h"
#include "parallel/parallelize.h"
#include "parallel/process_group.h"
#include "trainer/checkpoint/hf_weights.h"
#include "trainer/checkpoint/safetensors.h"
#include "trainer/checkpoint/weights_check.h"
#include "trainer/config/agreement.h"
#include "trainer/config/pipeline_keys.h"
#include "trainer/converters.h"
#include "trainer/determinism.h"
#include "trainer/observe/memory.h"
#include "trainer/signals.h"
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

// A dtype config value (training.mixed_precision_param, checkpoint.export_dtype); `key` names it
// in the error. The key table already restricts each key to the names it accepts.
at::ScalarType dtype_from_name(const std::string& name, const char* key) {
  if (name == "float32") return at::kFloat;
  if (name == "bfloat16") return at::kBFloat16;
  if (name == "float16") return at::kHalf;
  throw config::ConfigError(std::string(key) + " '" + name + "' (valid: float32, bfloat16, float16)");
}

}  // namespace

parallel::ParallelDims parallel_dims(const config::JobConfig& cfg, int world_size) {
  const auto& p = cfg.parallelism;
  try {
    return parallel::resolve_parallel_dims(p.data_parallel_replicate_degree, p.data_parallel_shard_degree,
                                           p.tensor_parallel_degree, p.pipeline_parallel_degree,
                                           p.context_parallel_degree, world_size);
  } catch (const std::invalid_argument& e) {
    throw config::ConfigError(e.what());
  }
}

std::optional<parallel::PipelinePlan> pipeline_plan(const config::JobConfig& cfg, const parallel::ParallelDims& dims) {
  if (dims.pp <= 1) return std::nullopt;
  const parallel::PipelineConfig pc = config::pipeline_config(cfg);
  try {
    const int64_t n_layers = model::llama3_flavor(cfg.model.flavor).n_layers;
    return parallel::plan_pipeline(pc, dims.pp, n_layers, cfg.training.local_batch_size);
  } catch (const std::invalid_argument& e) {
    throw config::ConfigError(std::string("pipeline parallel: ") + e.what());
  }
}

parallel::CpRotateMethod context_parallel_method(const config::JobConfig& cfg, const parallel::ParallelDims& dims) {
  try {
    const parallel::CpRotateMethod method =
        parallel::cp_rotate_method_from_name(cfg.parallelism.context_parallel_rotate_method);
    parallel::check_cp_degree(model::llama3_flavor(cfg.model.flavor), dims.cp, dims.tp, cfg.training.seq_len, method);
    return method;
  } catch (const std::invalid_argument& e) {
    throw config::ConfigError(e.what());
  }
}

int64_t global_batch_size(const config::JobConfig& cfg, const parallel::ParallelDims& dims) {
  const auto& t = cfg.training;
  const int64_t dp_degree = dims.dp();
  const int64_t global = t.global_batch_size > 0 ? t.global_batch_size : t.local_batch_size * dp_degree;
  if (global % (t.local_batch_size * dp_degree) != 0)
    throw config::ConfigError("training.global_batch_size (" + std::to_string(global) +
                              ") must be a multiple of training.local_batch_size (" +
                              std::to_string(t.local_batch_size) + ") x data-parallel degree (" +
                              std::to_string(dp_degree) + ")");
  return global;
}

parallel::ParallelOptions parallel_options(const config::JobConfig& cfg, const model::ModelArgs& args,
                                           const parallel::ParallelDims& dims, c10::Device device, bool float8) {
  const int tp_degree = dims.tp;
  parallel::ParallelOptions popt;
  popt.microbatches = global_batch_size(cfg, dims) / (cfg.training.local_batch_size * dims.dp());
  popt.reshard_after_forward = cfg.parallelism.fsdp_reshard_after_forward;
  popt.loss_parallel = !cfg.parallelism.disable_loss_parallel;
  popt.compute_dtype = dtype_from_name(cfg.training.mixed_precision_param, "training.mixed_precision_param");
  popt.device = device;
  popt.seq_len = cfg.training.seq_len;
  popt.fsdp_overlap = cfg.parallelism.fsdp_overlap;
  popt.async_tp = cfg.parallelism.enable_async_tensor_parallel;
  popt.async_tp_chunks = cfg.parallelism.async_tp_chunks;
  popt.float8_fsdp_all_gather = float8 && cfg.float8.enable_fsdp_float8_all_gather;
  popt.float8_precompute_fsdp_scales = float8 && cfg.float8.precompute_float8_dynamic_scale_for_fsdp;
  popt.float8_tp_input_all_gather = cfg.float8.tp_input_all_gather;
  popt.pipeline = pipeline_plan(cfg, dims);
  // The user's choices are checked here, as config errors (exit 2); anything parallelize_llama
  // throws after that is a bug, reported as such.
  try {
    popt.ac = parallel::parse_ac_options(cfg.activation_checkpoint.mode,
                                         cfg.activation_checkpoint.selective_ac_option);
    popt.cp_rotate_method = context_parallel_method(cfg, dims);
    // Under context parallelism the sequence-parallel share is checked with the cp split.
    if (tp_degree > 1) parallel::check_tp_degree(args, tp_degree, dims.cp > 1 ? 0 : cfg.training.seq_len);
  } catch (const std::invalid_argument& e) {
    throw config::ConfigError(e.what());
  }
  return popt;
}

Trainer::Trainer(config::JobConfig cfg) : cfg_(std::move(cfg)) {
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
  // Before any cuBLAS handle exists: cuBLAS reads CUBLAS_WORKSPACE_CONFIG when it creates one.
  apply_determinism(t.deterministic);
  compute_dtype_ = dtype_from_name(t.mixed_precision_param, "training.mixed_precision_param");
  for (const auto& w : cfg_.warnings) util::log_warn(w);
  for (const auto& n : cfg_.notes) util::log_info("config: " + n);
  util::log_info("device: " + device_.str() + " (training.device = " + t.device + ")");
  util::log_info("dtypes: compute " + t.mixed_precision_param + ", master weights and optimizer state "
                 "float32, gradient reduction " + t.mixed_precision_reduce);
  observe::set_cpu_memory_limit(static_cast<int64_t>(t.cpu_memory_limit_gib * double(1ll << 30)));
  // Before the model exists, so that a memory snapshot's record includes the parameters.
  profiler_ = std::make_unique<observe::StepProfiler>(cfg_.profiling, cfg_.job.dump_folder, env_rank(), device_);
  init_mesh();

  // Data: the global batch is what one optimizer step consumes; this process takes its rows in
  // micro-batches of local_batch_size (gradient accumulation when there are several).
  const int64_t dp_degree = mesh_->dims().dp();
  global_batch_size_ = global_batch_size(cfg_, mesh_->dims());

  tokenizer_ = data::make_tokenizer(cfg_.model.tokenizer_path);
  data::DataConfig data_cfg;
  data_cfg.dataset = t.dataset;
  data_cfg.dataset_path = t.dataset_path;
  data_cfg.seq_len = t.seq_len;
  data_cfg.global_batch_size = global_batch_size_;
  data_cfg.seed = t.seed;
  data_cfg.dp_rank = mesh_->local_rank(parallel::MeshDim::kDp);
  data_cfg.dp_degree = dp_degree;
  loader_ = std::make_unique<data::DataLoader>(data_cfg, *tokenizer_);
  util::log_info("tokenizer: " + tokenizer_->describe());
  util::log_info("dataset: " + loader_->describe());
  if (cfg_.validation.enable) {
    // The layout's checks (sequence-parallel and context-parallel splits, the pipeline's
    // boundary tensors) were made for training.seq_len.
    const parallel::ParallelDims& dims = mesh_->dims();
    if ((dims.tp > 1 || dims.cp > 1 || dims.pp > 1) && cfg_.validation.seq_len != t.seq_len)
      throw config::ConfigError("validation.seq_len = " + std::to_string(cfg_.validation.seq_len) +
                                " must equal training.seq_len = " + std::to_string(t.seq_len) +
                                " under tensor, context or pipeline parallelism (their splits are made for it)");
    validator_ = std::make_unique<Validator>(cfg_, *tokenizer_, data_cfg.dp_rank, static_cast<int>(dp_degree));
    util::log_info("validation: " + validator_->describe());
  }

  build_model();

  optim::AdamWOptions opt;
  opt.name = cfg_.optimizer.name;
  opt.beta1 = cfg_.optimizer.beta1;
  opt.beta2 = cfg_.optimizer.beta2;
  opt.eps = cfg_.optimizer.eps;
  opt.weight_decay = cfg_.optimizer.weight_decay;
  {
    model::NamedScope scope("optimizer", model::MemoryCategory::kOptimizerState);
    optimizer_ = std::make_unique<optim::AdamW>(master_params(), opt);
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
  init_checkpointing();

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
  metrics_ = std::make_unique<observe::MetricsLogger>(device_, fpt, peak.flops_per_second,
                                                      mesh_->dims().non_data_parallel_size(), jsonl);
  if (start_step_ > 0) metrics_->resume_after(start_step_);  // the file continues the run
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
  util::log_info("training " + std::to_string(t.steps) + " steps: global batch " +
                 std::to_string(global_batch_size_) + " x seq_len " + std::to_string(t.seq_len) + " (" +
                 std::to_string(global_batch_size_ / (t.local_batch_size * mesh_->dims().dp())) +
                 " micro-batch(es) of " +
                 std::to_string(t.local_batch_size) + "), metrics -> " + jsonl);
}

void Trainer::build_model() {
  model::ModelArgs args = model::llama3_flavor(cfg_.model.flavor);
  args.vocab_size = tokenizer_->vocab_size();
  args.max_seq_len = cfg_.training.seq_len;  // the RoPE table's length
  if (cfg_.validation.enable) args.max_seq_len = std::max(args.max_seq_len, cfg_.validation.seq_len);
  model_ = std::make_unique<model::Llama>(args);  // meta device: nothing allocated yet
  const model::ParamCount count = model::count_params(args);
  util::log_info("model llama3 " + cfg_.model.flavor + ": " + std::to_string(args.n_layers) +
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
  if (converted.float8 && cfg_.float8.enable_fsdp_float8_all_gather && mesh_->size(parallel::MeshDim::kDpShardCp) == 1)
    util::log_info("float8: enable_fsdp_float8_all_gather has no effect without FSDP "
                   "(parallelism.data_parallel_shard_degree 1): each linear casts its own weight");

  try {
    parallel::check_block_scaled_tp(model_->linears(), mesh_->dims().tp);
  } catch (const std::invalid_argument& e) {
    throw config::ConfigError(e.what());
  }
  const parallel::ParallelOptions popt = parallel_options(cfg_, args, mesh_->dims(), device_, converted.float8);
  // Sharded or not, only this rank's shards are ever allocated: the plan runs on meta.
  model::NamedScope scope("model init", model::MemoryCategory::kParameters);
  parallel_ = parallel::parallelize_llama(*model_, *mesh_, popt);
  parallel_->init_weights(static_cast<uint64_t>(cfg_.training.seed));
  for (const std::string& line : parallel_->describe()) util::log_info("parallel: " + line);

  int64_t param_bytes = 0;
  for (const auto& p : master_params()) param_bytes += p.nbytes();
  util::log_info(std::string("memory: ") + (world_.world_size > 1 ? "this rank's shards: " : "") + "parameters " +
                 gib(param_bytes) + " (float32 masters, compute in " +
                 cfg_.training.mixed_precision_param + "), gradients " + gib(param_bytes) +
           ", AdamW state " + gib(2 * param_bytes) + "; process RSS " + gib(observe::process_rss_bytes()));
}

const std::vector<std::string>& Trainer::param_names() const { return parallel_->param_names(); }
const std::vector<at::Tensor>& Trainer::master_params() const { return parallel_->master_params(); }

void Trainer::load_initial_weights(const std::string& path) {
  namespace fs = std::filesystem;
  if (!fs::exists(path)) throw std::runtime_error("checkpoint.initial_load_path '" + path + "' does not exist");
  if (fs::is_directory(path) && fs::exists(fs::path(path) / "manifest.json")) {  // a titan step-N folder
    checkpoint::CheckpointReader reader(path);
    checkpoint::ModelState weights(*parallel_);
    checkpoint::CheckpointManager::load(reader, {{"model", &weights}}, model_shape(), {});
    util::log_info("loaded initial weights from titan checkpoint " + path + " (" + std::to_string(reader.bytes_read()) +
                   " bytes read by this rank)");
    return;
  }
  const bool hf = checkpoint::is_hf_checkpoint(path);
  auto load = [&](const std::string& name, const at::Tensor& full) {
    if (parallel_->holds_param(name)) parallel_->load_full(name, full);  // under pp: this rank's stages
  };
  checkpoint::load_weights_file(path, model_->args(), parallel_->all_param_names(), load);
  util::log_info(std::string("loaded initial weights from ") + (hf ? "Hugging Face checkpoint " : "") + path);
}

// The phases of one optimizer step, in order; no phase depends on the layout (a stage of degree 1
// is a no-op inside ParallelModel, and the schedule runs the micro-batches, See Note [Schedules as
// data] in parallel/schedule.h).
std::pair<double, double> Trainer::train_step(int64_t step) {
  const auto& t = cfg_.training;
  const double lr = cfg_.optimizer.lr * lr_schedule_.factor(step);
  optimizer_->zero_grad();

  data::Batch batch = loader_->next_batch();  // this rank's rows of the global batch, [rows, S]
  // Every micro-batch's backward runs on its loss sum / global_tokens (See Note [Loss scaling]).
  const double global_tokens = static_cast<double>(global_batch_size_) * t.seq_len;
  double loss_sum = parallel_->schedule().step(batch.inputs, batch.labels, global_tokens);
  metrics_->add_tokens(batch.inputs.numel());
  model::NamedScope scope("optimizer", model::MemoryCategory::kOptimizerState);
  parallel_->reduce_grads();                              // TP-replicated weights, HSDP replicas
  loss_sum = parallel_->sum_over_dp_cp(loss_sum);         // the global batch's loss sum
  const double grad_norm = parallel_->clip_grad_norm(t.max_norm);  // one all-reduce
  // Both are all-reduced, so every rank takes the same branch (Note [Non-finite steps]).
  if (!std::isfinite(loss_sum) || !std::isfinite(grad_norm)) {
    on_nonfinite_step(step, batch, loss_sum / global_tokens, grad_norm);  // throws unless skipping
    return {loss_sum / global_tokens, grad_norm};                         // no optimizer update
  }
  consecutive_skipped_steps_ = 0;
  optimizer_->step(lr);
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
    try {
      faults_->before_step(step);  // test-only (comm.debug_*); nothing by default
      std::tie(loss, grad_norm) = train_step(step);
    } catch (const c10::OutOfMemoryError&) {
      profiler_->on_out_of_memory(step);  // the snapshot of the failing step, then exit
      throw;
    }
    profiler_->step_end(step);
    if (cfg_.job.print_pipeline_schedule && (step == start_step_ + 2 || step == cfg_.training.steps))
      for (const std::string& line : parallel_->schedule().timeline()) util::log_info(line);
    result.losses.push_back(loss);
    result.grad_norms.push_back(grad_norm);
    result.steps_completed = step;
    if (step == 1 || step % cfg_.metrics.log_freq == 0 || step == cfg_.training.steps)
    {
      observe::StepMetrics m{step, loss, grad_norm, cfg_.optimizer.lr * lr_schedule_.factor(step)};
      m.skipped_steps = skipped_steps_;
      if (world_.world_size > 1) {
        m.comm_seconds = mesh_->comm_seconds() - comm_seconds_logged_;
        m.comm_exposed_seconds = mesh_->comm_exposed_seconds() - comm_exposed_logged_;
      }
      comm_seconds_logged_ = mesh_->comm_seconds();
      comm_exposed_logged_ = mesh_->comm_exposed_seconds();
      metrics_->log(m);
    }
    if (validator_ && validator_->due(step, cfg_.training.steps)) {
      const ValidationResult v = validator_->run(*parallel_, step);  // See Note [Validation]
      metrics_->log_validation(v.step, v.loss, v.perplexity, v.tokens, v.seconds);
      result.validation_losses.emplace_back(step, v.loss);
    }
    if (checkpointer_->should_save(step, cfg_.training.steps)) save_checkpoint(step);
  }
  checkpointer_->wait();  // the last (async) save is complete before the run ends
  if (!cfg_.checkpoint.export_path.empty()) export_weights(cfg_.checkpoint.export_path);
  if (const std::string lost = metrics_->lost_metrics(); !lost.empty()) throw std::runtime_error(lost);
  return result;
}

Trainer::~Trainer() = default;

void Trainer::init_mesh() {
  try {
    world_ = parallel::world_from_env();
  } catch (const std::runtime_error& e) {
    throw config::ConfigError(std::string("distributed environment: ") + e.what());
  }
  faults_ = std::make_unique<FaultInjection>(cfg_.comm, world_.rank, world_.world_size);
  const parallel::ParallelDims dims = parallel_dims(cfg_, world_.world_size);
  pipeline_plan(cfg_, dims);  // config errors now, before any rank connects
  context_parallel_method(cfg_, dims);
  std::unique_ptr<parallel::Comm> world;  // a single process needs none
  if (world_.world_size > 1) {
#ifdef TITAN_WITH_CUDA
    if (device_.is_cuda()) device_ = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(world_.local_rank));
#endif
    parallel::CommOptions opts;
    opts.init_timeout = std::chrono::seconds(cfg_.comm.init_timeout_seconds);
    opts.timeout = std::chrono::seconds(cfg_.comm.train_timeout_seconds);
    opts.backend = device_.is_cuda() ? "nccl" : "gloo";
    opts.debug_link_latency_ms = cfg_.comm.debug_link_latency_ms;
    opts.debug_link_bytes_per_second = cfg_.comm.debug_link_bytes_per_second;
    parallel::comm_trace().configure(static_cast<size_t>(cfg_.comm.trace_buf_size),
                                     (std::filesystem::path(cfg_.job.dump_folder) / "comm_trace" /
                                      ("rank" + std::to_string(world_.rank) + ".json")).string(),
                                     world_.rank);
    util::log_info("distributed: " + parallel::describe(world_) + ", " + opts.backend + ", mesh " + dims.describe());
    world = parallel::init_process_group(world_, opts);
    // Before any collective whose size depends on the config (trainer/config/agreement.h).
    config::check_config_agreement(*world, cfg_, device_);
  }
  mesh_ = std::make_unique<parallel::DeviceMesh>(std::move(world), dims);
}

int64_t Trainer::write_hf_weights(const std::string& dir) {
  const at::ScalarType dtype = dtype_from_name(cfg_.checkpoint.export_dtype, "checkpoint.export_dtype");
  const std::vector<std::string> names = parallel_->all_param_names();
  std::vector<std::vector<int64_t>> shapes;
  for (const auto& name : names) shapes.push_back(parallel_->full_shape(name));
  return checkpoint::write_hf_folder(dir, names, shapes, model_->args(), dtype,
                                     [&](const std::string& fqn) { return parallel_->full_param(fqn); },
                                     world_.rank == 0);
}

void Trainer::export_weights(const std::string& path) {
  const at::ScalarType dtype = dtype_from_name(cfg_.checkpoint.export_dtype, "checkpoint.export_dtype");
  if (cfg_.checkpoint.export_format == "hf") {
    const int64_t bytes = write_hf_weights(path);
    if (world_.rank == 0)
      util::log_info("exported weights in Hugging Face's layout to " + path + " (" + std::to_string(bytes) + " bytes)");
    return;
  }
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const std::string& name : parallel_->all_param_names()) {
    // Every rank joins the gathers of each full parameter; rank 0 writes the file.
    at::Tensor full = parallel_->full_param(name);
    if (world_.rank == 0) tensors.emplace_back(name, full.to(at::kCPU).to(dtype));
  }
  if (world_.rank != 0) return;
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  checkpoint::save_safetensors(path, tensors, {{"format", "pt"}, {"flavor", cfg_.model.flavor}});
  util::log_info("exported weights to " + path);
}

nlohmann::json Trainer::model_shape() const {
  const model::ModelArgs& a = model_->args();
  return {{"dim", a.dim},         {"n_layers", a.n_layers},     {"n_heads", a.n_heads},
          {"n_kv_heads", a.kv_heads()}, {"vocab_size", a.vocab_size}, {"ffn_hidden_dim", a.ffn_hidden_dim()}};
}

checkpoint::Holders Trainer::state_holders() {
              holders_.clear();
  holders_.push_back(std::make_unique<checkpoint::ModelState>(*parallel_));
  holders_.push_back(std::make_unique<checkpoint::OptimizerState>(*optimizer_, *parallel_));
  holders_.push_back(std::make_unique<checkpoint::DataLoaderState>(*loader_));
  holders_.push_back(std::make_unique<checkpoint::Float8State>(*model_, device_, world_.rank == 0));
  return {{"model", holders_[0].get()},
          {"optimizer", holders_[1].get()},
          {"dataloader", holders_[2].get()},
          {"float8", holders_[3].get()}};
}

void Trainer::save_checkpoint(int64_t step) {
  const bool model_only = (step == cfg_.training.steps && cfg_.checkpoint.model_weights_only) || step == 0;
  if (step == cfg_.training.steps && cfg_.checkpoint.last_save_in_hf) {
    // torchtitan's last_save_in_hf: the last checkpoint is the model as a Hugging Face folder,
    // step-N under the checkpoint folder, written (files fsync'd, then renamed) by rank 0 while
    // every rank joins the gathers.
    checkpointer_->wait();  // an async save of an earlier step finishes first
    const std::string dir = (std::filesystem::path(checkpointer_->folder()) / ("step-" + std::to_string(step))).string();
    // Written as step-N.tmp and renamed: a save killed midway leaves only a temporary folder,
    // which the next start-up removes.
    const int64_t bytes = write_hf_weights(dir + ".tmp");
    if (world_.rank == 0) {
      std::filesystem::remove_all(dir);
      std::filesystem::rename(dir + ".tmp", dir);
    }
    if (world_.rank == 0)
      util::log_info("checkpoint: step " + std::to_string(step) + " saved as a Hugging Face folder " + dir + " (" +
                     std::to_string(bytes) + " bytes, " + cfg_.checkpoint.export_dtype + ")");
    return;
  }
  checkpoint::Holders holders;
  std::unique_ptr<checkpoint::Stateful> weights;
  if (model_only) {
    const at::ScalarType dtype =
        step > 0 ? dtype_from_name(cfg_.checkpoint.export_dtype, "checkpoint.export_dtype") : at::kFloat;
    weights = std::make_unique<checkpoint::ModelState>(*parallel_, dtype);
    holders = {{"model", weights.get()}};
  } else {
    holders = state_holders();
  }
  const checkpoint::SaveStats stats = checkpointer_->save(step, holders, model_only);
  util::log_info("checkpoint: step " + std::to_string(step) +
                 (cfg_.checkpoint.async_mode == "disabled" ? " saved" : " staged") +
                 " in " + std::to_string(stats.stage_seconds).substr(0, 6) + " s of training time (" +
                 cfg_.checkpoint.async_mode + ")");
}

void Trainer::init_checkpointing() {
  const auto& c = cfg_.checkpoint;
  const parallel::ParallelDims& dims = mesh_->dims();
  nlohmann::json layout = {{"world_size", world_.world_size}, {"dp_replicate", dims.dp_replicate},
                           {"dp_shard", dims.dp_shard},       {"tp", dims.tp}};
  checkpointer_ = std::make_unique<checkpoint::CheckpointManager>(cfg_, world_.rank, world_.world_size, layout,
                                                                  model_shape(), device_);
  if (!c.initial_load_path.empty() && !std::filesystem::exists(c.initial_load_path))
    throw config::ConfigError("checkpoint.initial_load_path '" + c.initial_load_path + "' does not exist");
  if (c.create_seed_checkpoint && !c.enable_checkpoint)
    throw config::ConfigError("checkpoint.create_seed_checkpoint needs checkpoint.enable_checkpoint");

  // Every rank loads; then all agree (one all-reduce) so that no rank trains on while another
  // failed: each reports its own error, the others say that a peer failed.
  std::string error;
  std::optional<std::string> resume;
  const auto start = std::chrono::steady_clock::now();
  int64_t bytes_read = 0;
  try {
    resume = c.create_seed_checkpoint ? std::nullopt : checkpointer_->find_resume();
    if (resume) {
      checkpoint::CheckpointReader reader(*resume);
      checkpoint::CheckpointManager::load(reader, state_holders(), model_shape(), c.exclude_from_loading);
      start_step_ = reader.step();
      bytes_read = reader.bytes_read();
      const auto& ex = c.exclude_from_loading;
      if (std::find(ex.begin(), ex.end(), "dataloader") != ex.end() || !reader.has_holder("dataloader")) {
        auto state = nlohmann::json::parse(loader_->state_dict());  // continue at batch `step`
        state["batches_consumed"] = start_step_;
        loader_->load_state_dict(state.dump());
      }
    } else if (c.initial_load_in_hf) {
      // torchtitan's initial_load_in_hf: initial_load_path, else model.hf_assets_path, which must
      // be a Hugging Face checkpoint (titan would read its other formats; torchtitan would not).
      const std::string path = c.initial_load_path.empty() ? cfg_.model.hf_assets_path : c.initial_load_path;
      const char* key = c.initial_load_path.empty() ? "model.hf_assets_path" : "checkpoint.initial_load_path";
      if (!std::filesystem::exists(path) || !checkpoint::is_hf_checkpoint(path))
        throw std::runtime_error(std::string("checkpoint.initial_load_in_hf = true, but ") + key + " '" + path +
                                 "' is not a Hugging Face checkpoint (a folder with model.safetensors or "
                                 "model.safetensors.index.json)");
      load_initial_weights(path);
    } else if (!c.initial_load_path.empty()) {
      load_initial_weights(c.initial_load_path);
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  int any_failed = error.empty() ? 0 : 1;
  if (parallel::Comm* world = mesh_->world()) {
    at::Tensor flag = at::tensor({static_cast<float>(any_failed)}, at::TensorOptions().dtype(at::kFloat)).to(device_);
    world->all_reduce(flag, parallel::ReduceOp::kMax);
    any_failed = flag.item<float>() > 0 ? 1 : 0;
  }
  if (any_failed)
    throw std::runtime_error(error.empty() ? "another rank failed to load the checkpoint (see its error)" : error);
  // After a resume: FSDP's precomputed float8 scales as the saved step's optimizer step left
  // them (a fresh run's first step measures its scales, as the uninterrupted run did).
  if (resume) parallel_->after_load();
  if (resume)
    util::log_info("checkpoint: resumed from " + *resume + " at step " + std::to_string(start_step_) + " (" +
                   std::to_string(bytes_read) + " bytes read by this rank in " +
                   std::to_string(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count())
                       .substr(0, 6) +
                   " s)");
  checkpointer_->remove_incomplete();
  if (parallel::Comm* world = mesh_->world()) world->barrier();
  if (c.create_seed_checkpoint) {
    save_checkpoint(0);
    checkpointer_->wait();
    util::log_info("checkpoint: wrote the seed checkpoint (step-0); exiting");
  }
}

}  // namespace titan::trainer
