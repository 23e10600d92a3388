// trainer/config/job_config.h — titan's job configuration: torchtitan's TOML sections and key names.
//
// Values come from three layers, later ones winning:
//   1. the defaults written in the structs below,
//   2. the TOML file named by `--job.config_file PATH`,
//   3. command-line overrides `--section.key value` / `--section.key=value`.
// Booleans are flags (`--float8.enable_float8_linear`) and are switched off with
// `--section.no_key`, `--section.key=false` or `--section.key false`; list keys take "a,b,c".
//
// Every key is declared once, in the table in keys.cpp: parsing, validation, `--help`
// and the printed config (`--job.print_args`) are all generated from that table. To add a key,
// add the struct field here (its initializer is the default) and one row there.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <map>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace titan::trainer::config {

// Any bad input: unknown key, wrong type, value out of range, unreadable or invalid TOML.
// Each problem is one line that names the key (and file:line where there is one), the
// offending value, and what would have been accepted; parse_job_config reports every problem
// of a config at once, one line each. The app prints them and exits with status 2.
struct ConfigError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The value of a key that titan accepts from torchtitan's schema without a struct member of its
// own (keys.cpp: accepted(...) rows); the alternative matches the key's type.
using ConfigValue = std::variant<bool, int64_t, double, std::string, std::vector<std::string>>;

// What the machine offers, for the defaults that depend on it (training.device and
// training.mixed_precision_param follow torchtitan on a GPU machine).
struct MachineFacts {
  bool cuda_available = false;
  int hardware_threads = 0;  // std::thread::hardware_concurrency(); 0 = unknown (no check)
  static MachineFacts detect();  // asks LibTorch whether a CUDA device is visible
};

struct JobSection {
  std::string config_file;  // command line only: a config file cannot name another one
  std::string dump_folder = "./outputs";
  std::string description = "default job";
  bool print_args = false;
  bool print_pipeline_schedule = false;  // each rank's timeline of the last step (pipeline parallel)
  bool plan = false;  // run the layout planner (planner/) for this config and [plan]'s cluster, train nothing
};

struct MetricsSection {
  int64_t log_freq = 10;
  bool disable_color_printing = false;
  bool enable_tensorboard = false;
  std::string save_tb_folder = "tb";  // under job.dump_folder
  bool save_for_all_ranks = false;    // TensorBoard: every rank writes, else rank 0 only
  double peak_flops = 0;  // 0 = measure with a GEMM probe at start-up (CPU) or use the known
                          // device peak
  // Note [Straggler report]: a rank whose compute time over the log window exceeds the median
  // rank's by this factor is named on the log line; 0 = no report.
  double straggler_factor = 1.5;
};

struct ModelSection {
  std::string name = "llama3";        // choices: llama3, qwen3 (model/flavors.h)
  std::string flavor = "debugmodel";  // a flavor of `name`
  std::string tokenizer_path;         // "" = byte-level tokenizer; else a tiktoken-format BPE file
  std::string hf_assets_path;         // folder with tokenizer.json (+ tokenizer_config.json)
  std::vector<std::string> converters;  // model rewrites applied after build; choices: float8, mx, quantize.grouped_mm.*
  std::string attn_mask_type = "causal";  // causal | block_causal (attention within each document)
  bool moe_force_load_balance = false;    // MoE: round-robin expert choice (torchtitan's debug switch)
  double load_balance_coeff = 1e-3;       // MoE: the expert_bias step per optimizer step; 0 = off
  int64_t mtp_layers = 0;                 // multi-token prediction depths (model/mtp.h); 0 = off
  double mtp_loss_weight = 0.3;           // their loss's weight (torchtitan's MTPLoss mtp_scale)
};

struct OptimizerSection {
  std::string name = "AdamW";  // choices: AdamW, Adam
  double lr = 8e-4;
  double eps = 1e-8;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double weight_decay = 0.1;
};

struct LrSchedulerSection {
  int64_t warmup_steps = 200;
  double decay_ratio = -1;  // -1 = none: decay over all steps after warmup; else in [0,1]
  std::string decay_type = "linear";  // linear|sqrt|cosine
  double min_lr_factor = 0.0;         // [0,1]
};

struct TrainingSection {
  std::string dataset = "fortunes";  // choices: fortunes, text, jsonl, c4, c4_test, tokens
  std::string dataset_path;          // "" = the dataset's default location
  int64_t local_batch_size = 8;
  int64_t global_batch_size = -1;  // -1 = local_batch_size x data-parallel degree
  int64_t seq_len = 2048;
  double max_norm = 1.0;  // > 0; gradient clipping cannot be switched off
  int64_t steps = 10000;
  std::string mixed_precision_param = "float32";   // bfloat16|float32; parsing makes it
                                                   // bfloat16 when the device is CUDA
  std::string mixed_precision_reduce = "float32";  // float32
  bool compile = false;  // accepted for torchtitan command lines, ignored with a warning
  int64_t seed = 0;
  bool deterministic = false;
  bool skip_nonfinite_steps = false;  // a non-finite loss/grad norm skips the update instead of stopping
  // Fault injection for tests: every rank's first gradient is NaN after the backward of this
  // step (0 = never), so the step's non-finite check fires (trainer/fault_injection.h).
  int64_t debug_nonfinite_at_step = 0;
  std::string device = "cpu";  // cpu|cuda; parsing makes it cuda when a GPU is visible
  int64_t num_threads = 0;     // intra-op threads, 0 = all cores
  std::string cpu_float32_gemm = "aten";  // aten|onednn (Note [float32 GEMMs on the CPU] in model/linear.h)
  double cpu_memory_limit_gib = 0;  // CPU tensor memory limit (out-of-memory error above); 0 = none
};

// Saving and resuming runs, initial weights, exported weights; see docs/checkpoint.md.
struct CheckpointSection {
  bool enable_checkpoint = false;  // save every `interval` steps and at the last; resume at start
  std::string folder = "checkpoint";  // under job.dump_folder (an absolute path stays as is)
  int64_t interval = 500;             // steps between saves
  int64_t keep_latest_k = 10;         // complete checkpoints kept; 0 = all
  std::string async_mode = "disabled";  // disabled|async|async_with_pinned_mem
  int64_t load_step = -1;               // -1 = the latest complete checkpoint
  // The LAST save holds only the model, in export_dtype; true as torchtitan v0.2.2's
  // last_save_model_only (its early-2025 model_weights_only was false).
  bool model_weights_only = true;
  std::vector<std::string> exclude_from_loading;  // model|optimizer|dataloader|float8
  std::string initial_load_path;  // weights to start from when there is no checkpoint to resume
  bool initial_load_model_only = true;  // false: initial_load_path is a full titan checkpoint, resumed from
  bool initial_load_in_hf = false;  // initial weights are a Hugging Face folder (initial_load_path or model.hf_assets_path)
  bool last_save_in_hf = false;     // the last save is a Hugging Face folder (needs model_weights_only)
  bool create_seed_checkpoint = false;  // write step-0 from the initial weights and exit
  bool enable_first_step_checkpoint = false;  // also save after step 1
  bool load_only = false;                     // resume or load as configured, but never save
  int64_t commit_timeout_seconds = 1800;  // rank 0 waits this long for every rank's shards
  std::string export_path;              // write final weights here ("" = none)
  std::string export_format = "torchtitan";  // torchtitan (one file, titan names) | hf (folder)
  std::string export_dtype = "float32";  // float32|bfloat16|float16
};

// Keys of these sections are declared by later work; the sections exist now so that files
// naming them get "unknown key" errors rather than "unknown section".
struct ProfilingSection {
  bool enable_profiling = false;
  std::string save_traces_folder = "profile_traces";  // under job.dump_folder
  int64_t profile_freq = 10;  // traces AND memory snapshots every this many steps
  int64_t profiler_warmup = 3;  // steps before the traced ones in each cycle (torch.profiler)
  int64_t profiler_active = 1;  // steps traced in each cycle
  bool enable_memory_snapshot = false;
  std::string save_memory_snapshot_folder = "memory_snapshot";  // under job.dump_folder
};

// The parallel layout; see docs/parallelism.md. The product of the degrees must equal
// WORLD_SIZE (data_parallel_shard_degree -1 takes what the others leave).
struct ParallelismSection {
  int64_t data_parallel_replicate_degree = 1;
  int64_t data_parallel_shard_degree = -1;  // -1 = WORLD_SIZE / (replicate x tp)
  int64_t tensor_parallel_degree = 1;
  std::string fsdp_reshard_after_forward = "default";  // default|always|never
  bool disable_loss_parallel = false;
  bool fsdp_overlap = true;                 // prefetch gathers, defer reduce-scatter waits
  bool enable_async_tensor_parallel = false;  // chunked all-gather/GEMM and GEMM/reduce-scatter
  int64_t async_tp_chunks = 2;              // chunks per sequence shard under async TP
  int64_t pipeline_parallel_degree = 1;
  std::string pipeline_parallel_schedule = "1F1B";
  std::string pipeline_parallel_schedule_csv;  // "" = generated from the schedule name
  int64_t pipeline_parallel_microbatch_size = 1;
  int64_t num_pp_microbatches = 0;  // 0 = local_batch_size / pipeline_parallel_microbatch_size
  int64_t pipeline_parallel_layers_per_stage = 0;  // 0 = unset
  int64_t pipeline_parallel_first_stage_less_layers = 1;
  int64_t pipeline_parallel_last_stage_less_layers = 1;
  std::string pipeline_parallel_stage_balance = "layers";  // layers|flops
  std::vector<std::string> pipeline_parallel_split_points;
  // One item per stage: its module names separated by spaces (TOML: a list of lists).
  std::vector<std::string> module_fqns_per_model_part;
  int64_t context_parallel_degree = 1;
  std::string context_parallel_rotate_method = "allgather";  // allgather|alltoall|titan_ulysses
  int64_t expert_parallel_degree = 1;         // EP: borrowed from dp_shard x cp (x tp when etp = 1)
  int64_t expert_tensor_parallel_degree = 1;  // 1 or tensor_parallel_degree (when EP > 1)
};

struct ActivationCheckpointSection {
  std::string mode = "none";              // none|full|selective
  std::string selective_ac_option = "2";  // "op" or an integer N (every N-th block)
};
struct Float8Section {
  bool enable_float8_linear = false;
  std::string recipe_name = "tensorwise";
  std::vector<std::string> filter_fqns = {"output"};
  bool auto_filter_small_kn = false;
  bool emulate = false;  // the CPU always emulates; on CUDA this forces the emulated GEMM
  bool enable_fsdp_float8_all_gather = false;
  bool precompute_float8_dynamic_scale_for_fsdp = false;
  bool tp_input_all_gather = true;  // tensorwise under TP: gather module inputs in float8
  int64_t amax_history_len = 16;  // tensorwise_delayed only
};

// The validation loop (torchtitan v0.2's [validation]): every `freq` steps and after the last,
// forward only over the validation data from its beginning.
struct ValidationSection {
  bool enable = false;
  std::string dataset = "c4_validation";  // any training dataset; c4_validation = c4 over dataset_path
  std::string dataset_path;
  int64_t local_batch_size = 8;  // rows per data-parallel rank per validation step
  int64_t seq_len = 2048;
  int64_t freq = 10;    // validate after every freq-th training step (and after the last)
  int64_t steps = -1;   // validation steps per validation; -1 = the whole validation set once
};

// MX training (torchtitan's [mx] and [quantize.linear.mx]); on with model.converters = ["mx"].
struct MxSection {
  std::string recipe_name = "mxfp8_cublas";
  std::vector<std::string> filter_fqns = {"output"};
  std::string mxfp8_dim1_cast_kernel_choice = "triton";  // "torch": transpose, then the dim0 cast
  bool auto_filter_small_kn = false;  // skip small (K, N) by float8 rowwise's table
  bool emulate = false;  // the CPU always emulates; on CUDA this forces the emulated GEMM
};

// The MoE experts in low precision (torchtitan's [quantize.grouped_mm.float8] and
// [quantize.grouped_mm.mx]); on with model.converters listing quantize.grouped_mm.float8 / .mx.
struct GroupedFloat8Section {
  std::vector<std::string> fqns;         // entries contained in "<moe>.experts" select that layer
  std::string recipe_name = "rowwise";   // rowwise | blockwise (float8/grouped_experts.h)
  bool float8_dispatch = false;          // EP sends the routed rows in float8 (rowwise only)
};
struct GroupedMxSection {
  std::vector<std::string> fqns;
  std::string recipe_name = "mxfp8";     // mxfp8 (= mxfp8_rceil) | mxfp8_rceil | mxfp8_floor
};

struct Int8Section {
  bool enable_int8_linear = false;
  std::vector<std::string> filter_fqns = {"output"};
  bool output_gemm = true;       // y = x W^T in int8
  bool grad_input_gemm = true;   // dx = dy W in int8
  bool grad_weight_gemm = true;  // dW = dy^T x in int8
};

struct CommSection {
  int64_t init_timeout_seconds = 300;   // rendezvous: waiting for every rank to join
  int64_t train_timeout_seconds = 100;  // one collective during training
  // Fault injection for tests: rank debug_fail_rank throws at the start of step
  // debug_fail_at_step (0 = never).
  int64_t debug_fail_at_step = 0;
  int64_t debug_fail_rank = 0;
  // The collective flight recorder (parallel/comm/comm_trace.h): entries kept; 0 = off.
  int64_t trace_buf_size = 20000;
  // Fault injection for tests: rank debug_stall_rank sleeps (an hour) at the start of step
  // debug_stall_at_step (0 = never), as a stopped rank would.
  int64_t debug_stall_at_step = 0;
  int64_t debug_stall_rank = 0;
  // Fault injection for tests: rank debug_slow_rank sleeps this long at the start of every step
  // (0 = never), a slow GPU or host the straggler report should name.
  double debug_slow_seconds = 0;
  int64_t debug_slow_rank = 0;
  // A simulated slower network (overlap tests and benchmarks): see CommOptions::debug_link_*.
  double debug_link_latency_ms = 0;
  double debug_link_bytes_per_second = 0;
};

// The layout planner's cluster and search (planner/, docs/planner.md). 0 = the device table's
// value (data sheets) or, for device cpu, this machine's probe.
struct PlanSection {
  int64_t nodes = 1;
  int64_t gpus_per_node = 8;        // ranks per node (device cpu: processes on this machine)
  std::string device = "h100";      // h100, h200, b200, a100, cpu
  double peak_tflops_bf16 = 0;      // dense, per GPU
  double peak_tflops_fp8 = 0;
  double memory_gib = 0;            // per GPU
  double hbm_tbps = 0;              // memory bandwidth, TB/s per GPU
  double intra_node_gbps = 0;       // GB/s per GPU and direction inside a node (NVLink)
  double inter_node_gbps = 0;       // GB/s per GPU and direction across nodes (the NIC)
  double gemm_efficiency = 0;       // fraction of the peak large GEMMs reach
  double link_efficiency = 0;       // fraction of a link's bandwidth collectives reach
  std::vector<std::string> precisions = {"bf16"};  // bf16, tensorwise, rowwise: which to consider
  std::vector<std::string> ac_modes = {"none", "selective", "full"};
  int64_t top = 10;                 // rows of the table
  std::string explain;              // a layout (as the table prints it): its prediction term by term
  bool exhaustive = false;          // predict every fitting layout, the dominated ones too
};

struct JobConfig {
  JobSection job;
  ProfilingSection profiling;
  MetricsSection metrics;
  ModelSection model;
  OptimizerSection optimizer;
  LrSchedulerSection lr_scheduler;
  TrainingSection training;
  ParallelismSection parallelism;
  CheckpointSection checkpoint;
  ActivationCheckpointSection activation_checkpoint;
  Float8Section float8;
  Int8Section int8;
  MxSection mx;
  GroupedFloat8Section grouped_float8;
  GroupedMxSection grouped_mx;
  ValidationSection validation;
  CommSection comm;
  PlanSection plan;
  // torchtitan keys accepted without an effect (their value asks for nothing titan lacks),
  // by dotted name; filled with the key's default on first use.
  std::map<std::string, ConfigValue> torchtitan_values;
  std::vector<std::string> warnings;  // one line each, for the app to log (e.g. ignored keys)
  std::vector<std::string> notes;     // one line each: torchtitan names read as titan keys
  bool help_requested = false;        // -h / --help: print config_help() and exit 0
};

// Parses defaults < TOML file < command line and validates every key. `args` excludes
// argv[0]. Throws ConfigError on any bad input; writes nothing. With -h/--help anywhere,
// returns the defaults with help_requested set and reads no file.
// The defaults of training.device and training.mixed_precision_param depend on `machine`
// (cuda + bfloat16 with a GPU, as torchtitan; cpu + float32 without).
JobConfig parse_job_config(const std::vector<std::string>& args);
JobConfig parse_job_config(const std::vector<std::string>& args, const MachineFacts& machine);
JobConfig parse_job_config(int argc, const char* const* argv);

// The effective config as TOML, every key with its help as a comment. Parsing the output as
// a config file gives back the same config (job.config_file is printed as a comment only).
std::string config_to_toml(const JobConfig& cfg);

// The effective config as (dotted key, value as TOML) in table order, for comparing ranks
// (trainer/config/agreement.h): every key except those that may differ per rank,
// job.config_file (the path; its values are compared) and job.print_args.
std::vector<std::pair<std::string, std::string>> config_entries_for_agreement(const JobConfig& cfg);

// The `--help` text: usage, then every key with its type, default, allowed values and help.
std::string config_help();
// The help of one section alone ("plan": what titan-plan --help prints of the cluster's keys).
std::string config_help_of(const std::string& section_name);

}  // namespace titan::trainer::config
