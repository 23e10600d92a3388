// trainer/config/keys.cpp — THE table of config keys: the only place a key is declared.
//
// To add a key: add the field (with its default as the initializer) to its section struct in
// job_config.h, then one row here. Parsing, type checks, range/choice checks, --help and
// --job.print_args all follow from the row. Key names follow torchtitan where it has them.
#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>
#include <stdexcept>

#include "float8/grouped_experts.h"
#include "float8/recipe.h"
#include "model/flavors.h"
#include "trainer/config/key_table.h"

namespace titan::trainer::config::detail {

namespace {

// Canonical recipe names first, then the aliases users of the seed-era PR type.
std::vector<std::string> float8_recipe_choices() {
  std::vector<std::string> names = float8::recipe_names();
  names.insert(names.end(), {"all_axiswise", "lw_axiswise_with_gw_hp", float8::kBlockwiseRecipeName});
  return names;
}

// Every family's flavors, each name once (model.flavor's choices; relations.cpp checks that the
// flavor is one of model.name's).
std::vector<std::string> all_flavor_names() {
  std::vector<std::string> names;
  for (const auto& family : model::model_names())
    for (const auto& f : model::flavor_names(family))
      if (std::find(names.begin(), names.end(), f) == names.end()) names.push_back(f);
  return names;
}

// The layout planner's cluster (job.plan / titan-plan; docs/planner.md).
SectionSpec plan_section() {
  using J = JobConfig;
  return section("plan", &J::plan, "The layout planner's cluster and search (job.plan, titan-plan).", {
      key("nodes", &PlanSection::nodes, "Nodes of the cluster.").count_at_least(1),
      key("gpus_per_node", &PlanSection::gpus_per_node,
          "GPUs per node (device cpu: processes on this machine).").in_closed(1, 1024),
      key("device", &PlanSection::device,
          "The GPU kind, from the planner's data-sheet table; cpu: this machine, measured.")
          .one_of({"h100", "h200", "b200", "a100", "cpu"}),
      key("peak_tflops_bf16", &PlanSection::peak_tflops_bf16, "Dense bf16 TFLOP/s per GPU; 0 = the table's.")
          .in_closed(0, 1e6),
      key("peak_tflops_fp8", &PlanSection::peak_tflops_fp8, "Dense float8 TFLOP/s per GPU; 0 = the table's.")
          .in_closed(0, 1e6),
      key("memory_gib", &PlanSection::memory_gib, "Memory per GPU (GiB); 0 = the table's.").in_closed(0, 1e6),
      key("hbm_tbps", &PlanSection::hbm_tbps, "Memory bandwidth per GPU (TB/s); 0 = the table's.").in_closed(0, 1e3),
      key("intra_node_gbps", &PlanSection::intra_node_gbps,
          "GB/s per GPU and direction inside a node (NVLink); 0 = the table's.").in_closed(0, 1e6),
      key("inter_node_gbps", &PlanSection::inter_node_gbps,
          "GB/s per GPU and direction between nodes; 0 = the table's.").in_closed(0, 1e6),
      key("gemm_efficiency", &PlanSection::gemm_efficiency,
          "Fraction of the peak a large GEMM reaches; 0 = the table's.").in_closed(0, 1),
      key("link_efficiency", &PlanSection::link_efficiency,
          "Fraction of a link's bandwidth a collective reaches; 0 = the table's.").in_closed(0, 1),
      key("precisions", &PlanSection::precisions, "Linear precisions to consider.")
          .one_of({"bf16", "tensorwise", "rowwise"}),
      key("ac_modes", &PlanSection::ac_modes, "Activation checkpointing modes to consider (selective = per-op).")
          .one_of({"none", "selective", "full"}),
      key("top", &PlanSection::top, "Rows of the planner's table.").in_closed(1, 10000),
      key("explain", &PlanSection::explain,
          "One layout as the planner's table names it: its prediction term by term."),
      key("exhaustive", &PlanSection::exhaustive,
          "Check and predict every candidate; false: skip those another fitting one beats by construction "
          "(a larger local batch or a lighter AC mode of the same layout, async TP off)."),
  });
}

std::vector<SectionSpec> build_table() {
  using J = JobConfig;
  return {
      section("job", &J::job, "Job identity and outputs.", {
          key("config_file", &JobSection::config_file,
              "TOML file to read; it overrides the defaults and the command line overrides it.")
              .command_line_only(),
          key("dump_folder", &JobSection::dump_folder, "Folder for the job's outputs.").non_empty(),
          key("description", &JobSection::description, "Free-text description of the run."),
          key("print_args", &JobSection::print_args,
              "Print the effective config as TOML at start-up."),
          key("print_pipeline_schedule", &JobSection::print_pipeline_schedule,
              "Under pipeline parallelism: after the second and the last step, each rank prints the "
              "actions it ran as a timeline, with its measured idle fraction beside the schedule's "
              "theoretical bubble (docs/pipeline.md)."),
          key("plan", &JobSection::plan,
              "Run the layout planner instead of training: every layout of this config on the "
              "[plan] cluster that the trainer accepts and that fits, ranked by predicted step "
              "time (titan-plan does the same; docs/planner.md)."),
      }),
      section("profiling", &J::profiling, "Profiler traces and memory snapshots.", {
          key("enable_profiling", &ProfilingSection::enable_profiling,
              "Write a Chrome/Perfetto trace (Kineto profiler) of one step every profile_freq "
              "steps, per rank."),
          key("save_traces_folder", &ProfilingSection::save_traces_folder,
              "Folder under job.dump_folder for traces: iteration_N/rank{R}_trace.json."),
          key("profile_freq", &ProfilingSection::profile_freq,
              "Profile (and snapshot memory at) every this many steps.").count_at_least(1),
          key("profiler_warmup", &ProfilingSection::profiler_warmup,
              "Steps of each profile_freq cycle run before the traced ones (torch.profiler "
              "schedule: wait = profile_freq - warmup - active).").count_at_least(0),
          key("profiler_active", &ProfilingSection::profiler_active,
              "Steps traced at the end of each profile_freq cycle; the trace holds one "
              "ProfilerStep#N range per step.").count_at_least(1),
          key("enable_memory_snapshot", &ProfilingSection::enable_memory_snapshot,
              "Record every allocation and write a memory snapshot (PyTorch's pickle layout) "
              "plus an HTML picture every profile_freq steps and on out-of-memory."),
          key("save_memory_snapshot_folder", &ProfilingSection::save_memory_snapshot_folder,
              "Folder under job.dump_folder for snapshots: "
              "iteration_N/rank{R}_memory_snapshot.pickle (and .html)."),
      }),
      section("metrics", &J::metrics, "The per-step metrics log line.", {
          key("log_freq", &MetricsSection::log_freq,
              "Log metrics at step 1 and every this many steps.").count_at_least(1),
          key("disable_color_printing", &MetricsSection::disable_color_printing,
              "No ANSI colors in the log (they are only used on a terminal anyway)."),
          key("enable_tensorboard", &MetricsSection::enable_tensorboard,
              "Write TensorBoard event files (loss, grad_norm, lr, memory, tps, tflops, mfu per "
              "logged step) under job.dump_folder/save_tb_folder."),
          key("save_tb_folder", &MetricsSection::save_tb_folder,
              "Folder under job.dump_folder for TensorBoard events (a timestamped subfolder per "
              "run, rank_R inside it when every rank writes)."),
          key("save_for_all_ranks", &MetricsSection::save_for_all_ranks,
              "TensorBoard: every rank writes its own events; false = rank 0 only."),
          key("peak_flops", &MetricsSection::peak_flops,
              "Peak FLOP/s that MFU divides by; 0 = measure it with a GEMM probe at start-up "
              "(CPU) or use the known peak of the GPU.").at_least(0),
          key("straggler_factor", &MetricsSection::straggler_factor,
              "At each log step, name the rank whose compute time (the window's wall time minus "
              "its time blocked in collectives) exceeds the median rank's by this factor; 0 = "
              "no report (one small all-gather per log step when on).")
              .in_closed(1, 1e6).or_exactly(0),
      }),
      section("model", &J::model, "Which model to build and how to tokenize.", {
          key("name", &ModelSection::name,
              "Model family, one of those titan trains (each declared in its own folder, model/<name>/; "
              "the registry: model/families.cpp).")
              .one_of(model::model_names()),
          key("flavor", &ModelSection::flavor,
              "Model size, a flavor of model.name (debugmodel is CPU-sized in every family); llama3's "
              "debugmodel_flex_attn, debugmodel_varlen_attn, 8B_flex and 8B_varlen are their base "
              "flavor with block-causal attention (model.attn_mask_type).")
              .one_of(all_flavor_names()),
          key("attn_mask_type", &ModelSection::attn_mask_type,
              "causal: every token attends to all tokens before it in its row; block_causal: only "
              "to those of its own document. A row packs documents back to back; a document ends "
              "with the tokenizer's EOS token (the next token starts the next one), as torchtitan's "
              "block_causal mask finds them. Positions stay global (RoPE is relative). Every layout "
              "(FSDP, TP, PP, CP) computes the same documents.")
              .one_of({"causal", "block_causal"}),
          key("moe_force_load_balance", &ModelSection::moe_force_load_balance,
              "Mixture-of-experts models only (debug): every token's experts chosen round robin, "
              "(token x top_k + j) mod num_experts, instead of by the router, so every expert gets "
              "the same load (torchtitan's debug.moe_force_load_balance)."),
          key("load_balance_coeff", &ModelSection::load_balance_coeff,
              "Mixture-of-experts models only: auxiliary-loss-free load balancing, once per "
              "optimizer step each layer's expert_bias moves by this much toward its under-loaded "
              "experts (coeff x sign(mean load - load), made zero-mean); 0 = off, every "
              "expert_bias stays zero (torchtitan 0.2.2's Qwen3, which never moves it). titan "
              "balances every MoE flavor at the default.")
              .at_least(0),
          key("mtp_layers", &ModelSection::mtp_layers,
              "Multi-token prediction (DeepSeek-V3's MTP, torchtitan's MTPDecoder): this many more blocks "
              "after the last, each like it, named mtp_layers.<k>; depth k at position t reads the token at "
              "t + k and depth k - 1's hidden state there, and predicts the token at t + k + 1 through the "
              "shared embedding and output projection (docs/moe.md). Not with pipeline or context "
              "parallelism (as torchtitan). 0 = off.")
              .count_at_least(0),
          key("mtp_loss_weight", &ModelSection::mtp_loss_weight,
              "Multi-token prediction's weight in the loss: loss = main + mtp_loss_weight x the mean of the "
              "depths' cross entropies, all over the step's main tokens (torchtitan main's MTPLoss "
              "mtp_scale). The step line and metrics.jsonl show that mean as mtp_loss.")
              .at_least(0),
          key("tokenizer_path", &ModelSection::tokenizer_path,
              "\"\" = byte-level tokenizer; a tiktoken-format BPE file (Llama 3's "
              "original/tokenizer.model), a tokenizer.json or a folder holding one; when not "
              "given, model.hf_assets_path."),
          key("hf_assets_path", &ModelSection::hf_assets_path,
              "Folder of Hugging Face assets with tokenizer.json (+ tokenizer_config.json for "
              "BOS/EOS); used when tokenizer_path is \"\"."),
          key("converters", &ModelSection::converters,
              "Model rewrites applied after the model is built, in order: float8 ([float8]) or mx "
              "(MX block-scaled training, [mx]) for the linears; quantize.grouped_mm.float8 or "
              "quantize.grouped_mm.mx for the MoE experts ([quantize.grouped_mm.float8], "
              "[quantize.grouped_mm.mx]).")
              .one_of({"float8", "mx", "quantize.grouped_mm.float8", "quantize.grouped_mm.mx"})
              .value_alias("quantize.linear.float8", "float8")
              .value_alias("quantize.linear.mx", "mx"),
      }),
      section("optimizer", &J::optimizer, "Optimizer and its hyper-parameters.", {
          key("name", &OptimizerSection::name,
              "AdamW = decoupled weight decay; Adam = weight decay added to the gradient.")
              .one_of({"AdamW", "Adam"}),
          key("lr", &OptimizerSection::lr, "Peak learning rate, reached at the end of warmup.")
              .above(0),
          key("eps", &OptimizerSection::eps, "Added to Adam's denominator.").above(0),
          key("beta1", &OptimizerSection::beta1, "Adam first-moment decay.").in_half_open(0, 1),
          key("beta2", &OptimizerSection::beta2, "Adam second-moment decay.").in_half_open(0, 1),
          key("weight_decay", &OptimizerSection::weight_decay, "Weight decay coefficient.")
              .at_least(0),
      }),
      section("lr_scheduler", &J::lr_scheduler, "Learning-rate warmup, plateau and decay.", {
          key("warmup_steps", &LrSchedulerSection::warmup_steps,
              "Steps of linear warmup up to optimizer.lr.").count_at_least(0),
          key("decay_ratio", &LrSchedulerSection::decay_ratio,
              "Fraction of training.steps spent decaying at the end (warmup-stable-decay); "
              "-1 = decay over all steps after warmup.").in_closed(0, 1).or_exactly(-1),
          key("decay_type", &LrSchedulerSection::decay_type, "Shape of the decay.")
              .one_of({"linear", "sqrt", "cosine"}),
          key("min_lr_factor", &LrSchedulerSection::min_lr_factor,
              "Final learning rate as a fraction of optimizer.lr.").in_closed(0, 1),
      }),
      section("training", &J::training, "Data, batch shape, loop length and numerics.", {
          key("dataset", &TrainingSection::dataset,
              "Dataset to train on: c4 / c4_test stream a local copy at dataset_path (JSON "
              "lines, plain or .json.gz, and Parquet files with a \"text\" column; c4_validation, "
              "C4's validation split, reads as c4); titan ships no third-party data.")
              .one_of({"fortunes", "text", "jsonl", "c4", "c4_test", "tokens"})
              .unimplemented_value("c4_mini", "the c4_mini dataset (use c4 with a local copy)")
              .value_alias("c4_validation", "c4"),  // C4's validation split, a local copy read as c4
          key("dataset_path", &TrainingSection::dataset_path,
              "Where the dataset lives; \"\" = the dataset's default location."),
          key("local_batch_size", &TrainingSection::local_batch_size,
              "Sequences per device per micro-batch.").count_at_least(1),
          key("global_batch_size", &TrainingSection::global_batch_size,
              "Sequences per optimizer step over all data-parallel ranks; -1 = local_batch_size "
              "x data-parallel degree; a multiple of that accumulates gradients.")
              .count_at_least(1).or_exactly(-1),
          key("seq_len", &TrainingSection::seq_len, "Tokens per sequence.").count_at_least(1),
          key("max_norm", &TrainingSection::max_norm,
              "Clip the global gradient L2 norm to this; must be > 0 (clipping is always on, "
              "a huge value makes it a no-op).").above(0),
          key("steps", &TrainingSection::steps, "Optimizer steps to run.").count_at_least(1),
          key("mixed_precision_param", &TrainingSection::mixed_precision_param,
              "dtype parameters are computed in (master weights stay float32); when not given: "
              "bfloat16 if the device is cuda (as torchtitan), float32 on the CPU.")
              .one_of({"bfloat16", "float32"}),
          key("mixed_precision_reduce", &TrainingSection::mixed_precision_reduce,
              "dtype of data-parallel gradient reduction.").one_of({"float32"}),
          key("compile", &TrainingSection::compile,
              "torchtitan's torch.compile switch; accepted, has no effect in titan.")
              .ignored("training.compile is accepted but ignored: titan has no JIT, its "
                       "kernels are compiled ahead of time"),
          key("seed", &TrainingSection::seed, "Random seed for weight init and data order.")
              // Any int64: a negative seed means 2^64 + seed, as torch.manual_seed maps it.
              .in_closed(-9223372036854775808.0, 9223372036854775808.0),
          key("deterministic", &TrainingSection::deterministic,
              "Use deterministic algorithms (slower; reruns are bit-identical)."),
          key("skip_nonfinite_steps", &TrainingSection::skip_nonfinite_steps,
              "A step whose loss or gradient norm is NaN/Inf skips its optimizer update (counted "
              "in the step line and metrics) instead of stopping the run; 10 such steps in a "
              "row still stop it."),
          key("debug_nonfinite_at_step", &TrainingSection::debug_nonfinite_at_step,
              "Fault injection (tests): after the backward of this step every rank's first "
              "gradient is set to NaN, as an overflow would leave it, so the step's non-finite "
              "check fires (and training.skip_nonfinite_steps skips it); 0 = never.")
              .count_at_least(0),
          key("device", &TrainingSection::device,
              "Where to train; when not given: cuda if a GPU is visible, else cpu.")
              .one_of({"cpu", "cuda"}),
          key("num_threads", &TrainingSection::num_threads,
              "Intra-op CPU threads; 0 = all cores.").count_at_least(0),
          key("cpu_float32_gemm", &TrainingSection::cpu_float32_gemm,
              "Library for the high-precision linears' float32 products on the CPU (float8 / int8 "
              "emulation keeps LibTorch's mm): aten = LibTorch's mm (MKL in "
              "the x86 wheels; bit for bit what titan has always computed), onednn = oneDNN's linear "
              "(about 2x MKL's float32 rate on AMD processors, whose AVX-512 MKL does not use; "
              "results differ in the last bits). bf16 and CUDA products are unaffected.")
              .one_of({"aten", "onednn"}),
          key("cpu_memory_limit_gib", &TrainingSection::cpu_memory_limit_gib,
              "Limit on live CPU tensor memory in GiB (the tracked allocator raises an "
              "out-of-memory error above it); 0 = no limit.")
              .in_closed(0, 8589934592.0),  // 2^33 GiB: the limit in bytes fits int64
      }),
      section("parallelism", &J::parallelism, "Data/tensor/pipeline-parallel layout.", {
          key("data_parallel_replicate_degree", &ParallelismSection::data_parallel_replicate_degree,
              "Data-parallel replicas (HSDP's outer dimension: gradients all-reduced across "
              "them).").count_at_least(1),
          key("data_parallel_shard_degree", &ParallelismSection::data_parallel_shard_degree,
              "FSDP degree: parameters, gradients and optimizer state sharded across this many "
              "ranks; -1 = WORLD_SIZE / (replicate x tensor parallel).").count_at_least(1).or_exactly(-1),
          key("tensor_parallel_degree", &ParallelismSection::tensor_parallel_degree,
              "Tensor + sequence parallel degree (must divide n_heads and n_kv_heads).")
              .count_at_least(1),
          key("fsdp_reshard_after_forward", &ParallelismSection::fsdp_reshard_after_forward,
              "Free gathered parameters after forward: default = every group but the last "
              "block and norm+output (torchtitan's choice), always, never.")
              .one_of({"default", "always", "never"}),
          key("disable_loss_parallel", &ParallelismSection::disable_loss_parallel,
              "With tensor parallel: all-gather the logits and compute the loss on the full "
              "vocabulary instead of on vocab shards."),
          key("fsdp_overlap", &ParallelismSection::fsdp_overlap,
              "FSDP issues the next group's all-gather before this group computes and waits for "
              "gradient reduce-scatters while the next group's backward runs; false = wait for "
              "every collective when it is issued (same numbers, all communication exposed)."),
          key("enable_async_tensor_parallel", &ParallelismSection::enable_async_tensor_parallel,
              "Async tensor parallel: the sequence all-gather before column-parallel linears and "
              "the reduce-scatter after row-parallel ones travel in chunks overlapped with the "
              "chunks' GEMMs (torchtitan needs torch.compile for this; titan does it natively)."),
          key("async_tp_chunks", &ParallelismSection::async_tp_chunks,
              "Chunks each sequence shard is split into under async tensor parallel (must divide "
              "seq_len / tensor_parallel_degree).").count_at_least(1),
          key("pipeline_parallel_degree", &ParallelismSection::pipeline_parallel_degree,
              "Pipeline parallel degree: the model's layers split into stages over this many ranks "
              "(docs/pipeline.md).").count_at_least(1),
          key("pipeline_parallel_schedule", &ParallelismSection::pipeline_parallel_schedule,
              "GPipe, 1F1B, Interleaved1F1B, LoopedBFS, InterleavedZeroBubble or ZBVZeroBubble "
              "(case-insensitive, as torch matches them)."),
          key("pipeline_parallel_schedule_csv", &ParallelismSection::pipeline_parallel_schedule_csv,
              "A schedule from a CSV file in torchtitan's format (one row per rank, actions such as "
              "0F1, 1B0, 2I0, 2W0; an empty cell is idle); \"\" = generated from the schedule name."),
          key("pipeline_parallel_microbatch_size", &ParallelismSection::pipeline_parallel_microbatch_size,
              "Rows per pipeline micro-batch: training.local_batch_size / this micro-batches per pass.")
              .count_at_least(1),
          key("num_pp_microbatches", &ParallelismSection::num_pp_microbatches,
              "Pipeline micro-batches per pass (torchtitan main's key); 0 = from "
              "pipeline_parallel_microbatch_size.").count_at_least(0),
          key("pipeline_parallel_layers_per_stage", &ParallelismSection::pipeline_parallel_layers_per_stage,
              "Layers per stage (the embedding and the output count as first/last_stage_less_layers); "
              "0 = one stage per rank for GPipe/1F1B, two for the others.").count_at_least(0),
          key("pipeline_parallel_first_stage_less_layers",
              &ParallelismSection::pipeline_parallel_first_stage_less_layers,
              "Layers the embedding counts as on the first stage.").count_at_least(0),
          key("pipeline_parallel_last_stage_less_layers",
              &ParallelismSection::pipeline_parallel_last_stage_less_layers,
              "Layers the final norm + output count as on the last stage.").count_at_least(0),
          key("pipeline_parallel_stage_balance", &ParallelismSection::pipeline_parallel_stage_balance,
              "How the computed split places the blocks: layers (torchtitan's: stages of equal layers, the "
              "embedding and the output counted by the two keys above) or flops (titan's: every rank's stages, "
              "as the schedule places them, of equal training FLOPs; docs/pipeline.md).")
              .one_of({"layers", "flops"}),
          key("pipeline_parallel_split_points", &ParallelismSection::pipeline_parallel_split_points,
              "torchtitan v0.1's split: each layers.<k> starts a new stage."),
          key("module_fqns_per_model_part", &ParallelismSection::module_fqns_per_model_part,
              "The split module by module: one list per stage (on the command line: stages separated "
              "by commas, modules by spaces)."),
          key("context_parallel_degree", &ParallelismSection::context_parallel_degree,
              "Context parallel degree: ranks that split each sequence (load-balanced chunks, ring "
              "attention; docs/context_parallel.md).").count_at_least(1),
          key("context_parallel_rotate_method", &ParallelismSection::context_parallel_rotate_method,
              "How attention exchanges keys and values under context parallelism: allgather (all at once), "
              "alltoall (passed around the ring), titan_ulysses (titan's own: heads re-sharded by all-to-all).")
              .one_of({"allgather", "alltoall", "titan_ulysses"}),  // parallel::cp_rotate_method_names()
          key("expert_parallel_degree", &ParallelismSection::expert_parallel_degree,
              "Expert parallel degree: ranks over which each MoE layer's experts are sharded, borrowed from "
              "dp_shard x cp (x tp when expert_tensor_parallel_degree = 1); tokens reach their experts by "
              "all-to-all (docs/moe.md). No effect on a dense model.").count_at_least(1),
          key("expert_tensor_parallel_degree", &ParallelismSection::expert_tensor_parallel_degree,
              "Tensor parallel degree of the routed experts when expert_parallel_degree > 1: 1 (EP borrows "
              "the tp ranks too) or tensor_parallel_degree.").count_at_least(1),
      }),
      section("checkpoint", &J::checkpoint,
              "Saving and resuming runs; initial and exported weights (docs/checkpoint.md).", {
          key("enable_checkpoint", &CheckpointSection::enable_checkpoint,
              "Save a checkpoint every `interval` steps and at the last step, and resume from "
              "the latest complete one at start-up."),
          key("folder", &CheckpointSection::folder,
              "Checkpoint folder under job.dump_folder (one step-N/ folder per save)."),
          key("interval", &CheckpointSection::interval, "Steps between checkpoints.").count_at_least(1),
          key("keep_latest_k", &CheckpointSection::keep_latest_k,
              "Keep this many complete checkpoints (older ones are deleted after a new one is "
              "complete); 0 = keep all.").count_at_least(0),
          key("async_mode", &CheckpointSection::async_mode,
              "disabled = training waits for the save; async = shards are copied to host memory "
              "and written by a background thread; async_with_pinned_mem = the same through "
              "pinned host buffers (CUDA).")
              .one_of({"disabled", "async", "async_with_pinned_mem"}),
          key("load_step", &CheckpointSection::load_step,
              "Resume from step-N; -1 = the latest complete checkpoint.").count_at_least(0).or_exactly(-1),
          key("model_weights_only", &CheckpointSection::model_weights_only,
              "The last save holds only the model weights, in export_dtype (torchtitan v0.2.2's "
              "last_save_model_only, true by default as there); a later, longer run resumes from it "
              "with a fresh optimizer. false = the last save is a full checkpoint, resumed from exactly."),
          key("exclude_from_loading", &CheckpointSection::exclude_from_loading,
              "Parts of a checkpoint not restored on resume.")
              .one_of({"model", "optimizer", "dataloader", "float8"}),
          key("initial_load_path", &CheckpointSection::initial_load_path,
              "Weights to start from when there is no checkpoint to resume: a safetensors file "
              "(torchtitan names), a Hugging Face folder or model.safetensors.index.json, or a "
              "titan step-N folder; \"\" = random init. A path that does not exist is an error."),
          key("initial_load_model_only", &CheckpointSection::initial_load_model_only,
              "Load only the model weights from initial_load_path; false = initial_load_path is a "
              "full titan checkpoint (a step-N folder), resumed from as this run's own would be: "
              "model, optimizer, data position and step (torchtitan's reading)."),
          key("initial_load_in_hf", &CheckpointSection::initial_load_in_hf,
              "The initial weights are a Hugging Face folder: initial_load_path, or "
              "model.hf_assets_path when that is \"\" (torchtitan's reading); anything else is an error."),
          key("last_save_in_hf", &CheckpointSection::last_save_in_hf,
              "The last save (model_weights_only, in export_dtype) is a Hugging Face folder "
              "(LlamaForCausalLM, Qwen3ForCausalLM or Qwen3MoeForCausalLM), step-N under the "
              "checkpoint folder."),
          key("create_seed_checkpoint", &CheckpointSection::create_seed_checkpoint,
              "Write step-0 (the initial weights) to the checkpoint folder and exit."),
          key("enable_first_step_checkpoint", &CheckpointSection::enable_first_step_checkpoint,
              "Also save a (full) checkpoint after step 1, to see early that saving works."),
          key("load_only", &CheckpointSection::load_only,
              "Resume (or load the initial weights) as configured, but save no checkpoint and leave "
              "the checkpoint folder as it is."),
          key("commit_timeout_seconds", &CheckpointSection::commit_timeout_seconds,
              "How long rank 0 waits for every rank's shards before it gives up on a save.")
              .in_closed(1, kMaxTimeoutSeconds),
          key("export_path", &CheckpointSection::export_path,
              "Write the final weights here; \"\" = don't export."),
          key("export_format", &CheckpointSection::export_format,
              "torchtitan = one safetensors file with titan/torchtitan names; hf = a Hugging "
              "Face folder of the model's family (its Hugging Face class, e.g. LlamaForCausalLM, "
              "Qwen3MoeForCausalLM, DeepseekV3ForCausalLM: config.json, model.safetensors.index.json, shards).")
              .one_of({"torchtitan", "hf"}),
          key("export_dtype", &CheckpointSection::export_dtype,
              "dtype of exported weights (and of a model_weights_only checkpoint).")
              .one_of({"float32", "bfloat16", "float16"}),
      }),
      section("activation_checkpoint", &J::activation_checkpoint,
              "Recomputing activations in backward to save memory.", {
          key("mode", &ActivationCheckpointSection::mode,
              "none = keep every activation; full = every block keeps only its input and is "
              "recomputed in backward; selective = see selective_ac_option. (torchtitan's default "
              "is selective; every torchtitan config names its mode.)")
              .one_of({"none", "full", "selective"})
              .unimplemented_value("memory_budget", "memory-budget activation checkpointing (torch.compile's partitioner)"),
          key("selective_ac_option", &ActivationCheckpointSection::selective_ac_option,
              "With mode = selective: \"op\" = per-op (keep matrix products except every "
              "second one, attention, reduce-scatters, float8 amax; recompute the rest), or an "
              "integer N = checkpoint every N-th block."),
      }),
      section("float8", &J::float8, "float8 training of the linears (torchao.float8 numerics).", {
          key("enable_float8_linear", &Float8Section::enable_float8_linear,
              "Train the model's linears with float8 GEMMs (emulated on the CPU)."),
          key("recipe_name", &Float8Section::recipe_name,
              "Scaling recipe: tensorwise (e4m3/e4m3/e5m2), rowwise (axiswise e4m3, power-of-2 "
              "scales), rowwise_with_gw_hp (high-precision grad_weight GEMM), tensorwise_delayed "
              "(scale from an amax history), blockwise (DeepSeek-V3: e4m3 with one float32 scale per "
              "1 x 128 activation tile and 128 x 128 weight tile).")
              .one_of(float8_recipe_choices()),
          key("filter_fqns", &Float8Section::filter_fqns,
              "Linears whose fully-qualified name contains one of these stay high precision; the "
              "entry \"auto_filter_small_kn\" (torchtitan 0.2.x) turns on auto_filter_small_kn."),
          key("auto_filter_small_kn", &Float8Section::auto_filter_small_kn,
              "Skip linears whose K/N are too small for float8 to be faster (torchao's table)."),
          key("emulate", &Float8Section::emulate,
              "Emulate the float8 GEMM in float32 (always the case on the CPU)."),
          key("enable_fsdp_float8_all_gather", &Float8Section::enable_fsdp_float8_all_gather,
              "FSDP all-gathers float8 weight shards (tensorwise recipes only)."),
          key("precompute_float8_dynamic_scale_for_fsdp",
              &Float8Section::precompute_float8_dynamic_scale_for_fsdp,
              "Compute every weight scale for the next step in one all-reduce after the "
              "optimizer step (needs enable_fsdp_float8_all_gather)."),
          key("tp_input_all_gather", &Float8Section::tp_input_all_gather,
              "Tensor parallel with a tensorwise recipe: all-gather the sequence shards of the "
              "attention / feed_forward inputs already cast to float8 (one global-amax scale; "
              "torchtitan's PrepareFloat8ModuleInput). false: gather high precision."),
          key("amax_history_len", &Float8Section::amax_history_len,
              "Length of the amax history of tensorwise_delayed.")
              // 2^16: three float32 histories per linear; longer is memory, not smoothing.
              .in_closed(1, 65536),
      }),
      section("mx", &J::mx, "MX block-scaled training of the linears (torchao.prototype.mx_formats "
              "numerics); on with model.converters = [\"mx\"].", {
          key("recipe_name", &MxSection::recipe_name,
              "mxfp8_cublas (e4m3 elements, one E8M0 scale per 32, FLOOR scales), mxfp8_cublas_rceil "
              "(scales rounded up), mxfp8_emulated (FLOOR, emulated GEMM), mxfp4_emulated (e2m1 "
              "elements, emulated GEMM). The CPU emulates every one.")
              .one_of(float8::mx_recipe_names())
              .value_alias("mxfp8", "mxfp8_cublas")
              .unimplemented_value("mxfp4_cutlass", "the MXFP4 hardware GEMM (mxfp4_emulated has its numerics)"),
          key("filter_fqns", &MxSection::filter_fqns,
              "Linears whose fully-qualified name contains one of these stay high precision."),
          key("mxfp8_dim1_cast_kernel_choice", &MxSection::mxfp8_dim1_cast_kernel_choice,
              "How a CUDA run casts the transposed (dim1) operands: cuda/triton = titan's fused "
              "cast-and-transpose kernel (so are torchao's cutedsl and flydsl), torch = transpose, then "
              "the dim0 cast. The same bits either way.")
              .one_of({"cuda", "triton", "cutedsl", "flydsl", "torch"}),
          key("auto_filter_small_kn", &MxSection::auto_filter_small_kn,
              "Skip linears whose K/N are too small for MX to be faster (torchao has no MX table: "
              "float8 rowwise's, whose per-row scales cost what MX's per-block ones do)."),
          key("emulate", &MxSection::emulate,
              "Emulate the MX GEMM (always the case on the CPU; the *_emulated recipes always do)."),
      }),
      section("quantize.grouped_mm.float8", &J::grouped_float8,
              "float8 MoE experts (torchtitan's Float8GroupedMMConverter, torchao's grouped GEMM numerics); on "
              "with model.converters listing quantize.grouped_mm.float8 (docs/low_precision.md \"Experts\").", {
          key("fqns", &GroupedFloat8Section::fqns,
              "MoE modules whose routed experts train in float8: an entry contained in \"<layer>.moe.experts\" "
              "selects that layer (\"experts\" selects every one); each entry must select one."),
          key("recipe_name", &GroupedFloat8Section::recipe_name,
              "rowwise (torchao's MoE recipe: e4m3, power-of-2 scales per row of the activations and "
              "gradients, per expert column of the weights, per group column in the weight gradient) or "
              "blockwise (DeepSeek-V3's 1 x 128 / 128 x 128 tiles per expert; not in torchtitan).")
              .one_of(float8::grouped_float8_recipe_names()),
          key("float8_dispatch", &GroupedFloat8Section::float8_dispatch,
              "Expert parallelism with the rowwise recipe: each routed row travels to its expert's rank "
              "cast to e4m3 with one power-of-2 scale (D + 4 bytes: about half a bf16 dispatch), which the "
              "experts' gate and up GEMMs read as their input cast; the combine and the gradients stay in "
              "high precision (not in torchtitan 0.2.2; docs/low_precision.md)."),
      }),
      section("quantize.grouped_mm.mx", &J::grouped_mx,
              "MXFP8 MoE experts (torchtitan's MXGroupedMMConverter, torchao's MXFP8 grouped GEMM numerics); on "
              "with model.converters listing quantize.grouped_mm.mx.", {
          key("fqns", &GroupedMxSection::fqns,
              "MoE modules whose routed experts train in MXFP8, selected as quantize.grouped_mm.float8.fqns."),
          key("recipe_name", &GroupedMxSection::recipe_name,
              "mxfp8 (torchtitan's; torchao 0.18 scales it with RCEIL) = mxfp8_rceil, or mxfp8_floor (FLOOR "
              "scales); e4m3 elements, one E8M0 scale per 1 x 32 block of each group.")
              .one_of(float8::grouped_mx_recipe_names()),
      }),
      section("validation", &J::validation, "The validation loop: forward only over a held-out dataset.", {
          key("enable", &ValidationSection::enable,
              "Validate every `freq` training steps and after the last one (torchtitan's [validation])."),
          key("dataset", &ValidationSection::dataset,
              "Validation dataset, read as training.dataset is; c4_validation = the c4 reader over "
              "dataset_path (a local copy of C4's validation split).")
              .one_of({"fortunes", "text", "jsonl", "c4", "c4_test", "c4_validation", "tokens"}),
          key("dataset_path", &ValidationSection::dataset_path,
              "Where the validation dataset lives; \"\" = the dataset's default location."),
          key("local_batch_size", &ValidationSection::local_batch_size,
              "Sequences per data-parallel rank per validation step.").count_at_least(1),
          key("seq_len", &ValidationSection::seq_len, "Tokens per validation sequence.").count_at_least(1),
          key("freq", &ValidationSection::freq, "Training steps between validations.").count_at_least(1),
          key("steps", &ValidationSection::steps,
              "Validation steps per validation; -1 = the whole validation set once (whole global "
              "batches).").count_at_least(1).or_exactly(-1),
      }),
      section("int8", &J::int8, "INT8 mixed-precision training of the linears.", {
          key("enable_int8_linear", &Int8Section::enable_int8_linear,
              "Train the linears with int8 GEMMs (row-wise forward, column-wise backward)."),
          key("filter_fqns", &Int8Section::filter_fqns,
              "Linears whose fully-qualified name contains one of these stay high precision."),
          key("output_gemm", &Int8Section::output_gemm, "Forward GEMM in int8."),
          key("grad_input_gemm", &Int8Section::grad_input_gemm, "grad_input GEMM in int8."),
          key("grad_weight_gemm", &Int8Section::grad_weight_gemm, "grad_weight GEMM in int8."),
      }),
      plan_section(),
      section("comm", &J::comm, "Collective timeouts and tracing.", {
          key("init_timeout_seconds", &CommSection::init_timeout_seconds,
              "How long rendezvous waits for every rank to join.").in_closed(1, kMaxTimeoutSeconds),
          key("train_timeout_seconds", &CommSection::train_timeout_seconds,
              "How long one collective may take during training before it fails.").in_closed(1, kMaxTimeoutSeconds),
          key("debug_fail_at_step", &CommSection::debug_fail_at_step,
              "Fault injection (tests): rank comm.debug_fail_rank fails at the start of this "
              "step; 0 = never.").count_at_least(0),
          key("debug_fail_rank", &CommSection::debug_fail_rank,
              "The rank that comm.debug_fail_at_step makes fail.").count_at_least(0),
          key("trace_buf_size", &CommSection::trace_buf_size,
              "Flight recorder: the last this many collectives of each rank, written to "
              "job.dump_folder/comm_trace/rank<N>.json when a collective fails or times out; "
              "0 = off.").count_at_least(0),
          key("debug_stall_at_step", &CommSection::debug_stall_at_step,
              "Fault injection (tests): rank comm.debug_stall_rank stops (sleeps) at the start of "
              "this step; 0 = never.").count_at_least(0),
          key("debug_stall_rank", &CommSection::debug_stall_rank,
              "The rank that comm.debug_stall_at_step stops.").count_at_least(0),
          key("debug_slow_seconds", &CommSection::debug_slow_seconds,
              "Fault injection (tests): rank comm.debug_slow_rank sleeps this long at the start "
              "of every step, a straggler for metrics.straggler_factor to name; 0 = never.")
              .in_closed(0, 3600),
          key("debug_slow_rank", &CommSection::debug_slow_rank,
              "The rank that comm.debug_slow_seconds slows.").count_at_least(0),
          key("debug_link_latency_ms", &CommSection::debug_link_latency_ms,
              "Simulated network (overlap tests, benchmarks): every collective completes no "
              "sooner than this latency after the group's link is free; 0 = off.")
              .in_closed(0, 3600e3),  // an hour: the simulated delay stays a finite clock duration
          key("debug_link_bytes_per_second", &CommSection::debug_link_bytes_per_second,
              "Simulated network: each group's link carries this many bytes per second, one "
              "collective at a time (bytes = the gathered or scattered size); 0 = off.")
              .in_closed(1, 1e15).or_exactly(0),  // >= 1 B/s: bytes / rate stays a finite duration
      }),
  };
}

// Binds alias and accepted rows (Note [torchtitan's schema in the key table]): an alias takes
// its target's type, storage and choices; an accepted row stores its value by name.
void bind_torchtitan_rows(std::vector<SectionSpec>& table) {
  auto find_in = [&](const std::string& dotted) -> const KeySpec* {
    for (const auto& s : table) {
      for (const auto& k : s.keys) {
        if (k.dotted() == dotted) return &k;
      }
    }
    return nullptr;
  };
  for (auto& s : table) {
    for (auto& k : s.keys) {
      if (k.kind == KeyKind::kAccepted) {
        k.type = static_cast<ValueType>(k.default_value->index());
        k.ref = [dotted = k.dotted(), init = *k.default_value](JobConfig& c) -> ValueRef {
          ConfigValue& v = c.torchtitan_values.try_emplace(dotted, init).first->second;
          return std::visit([](auto& x) -> ValueRef { return &x; }, v);
        };
      }
    }
  }
  for (auto& s : table) {
    for (auto& k : s.keys) {
      if (k.kind != KeyKind::kAlias) continue;
      const KeySpec* target = find_in(k.alias_of);
      if (target == nullptr || target->kind == KeyKind::kAlias) {
        throw std::logic_error("config table: alias " + k.dotted() + " names " + k.alias_of +
                               ", which is not a key");
      }
      k.type = target->type;
      k.ref = target->ref;
      k.choices = target->choices;
      if (k.alias_negates && k.type != ValueType::kBool) {
        throw std::logic_error("config table: negated alias " + k.dotted() + " is not a bool");
      }
      k.help = "torchtitan " + k.versions + " name of " + k.alias_of +
               (k.alias_negates ? " with the opposite meaning" : "") + ".";
    }
  }
}

std::vector<SectionSpec> assemble_table() {
  std::vector<SectionSpec> table = build_table();
  for (auto& section : table) {
    for (Row& row : torchtitan_rows(section.name)) {
      row.spec.section = section.name;
      section.keys.push_back(std::move(row.spec));
    }
  }
  for (auto& section : torchtitan_sections()) table.push_back(std::move(section));
  std::set<std::string> seen;
  for (const auto& s : table) {
    for (const auto& k : s.keys) {
      if (!seen.insert(k.dotted()).second) {
        throw std::logic_error("config table: key " + k.dotted() + " is declared twice");
      }
    }
  }
  bind_torchtitan_rows(table);
  return table;
}

}  // namespace

SectionSpec torchtitan_section(const char* name, const char* help, std::vector<Row> rows) {
  SectionSpec out{name, help, {}};
  for (auto& row : rows) {
    row.spec.section = name;
    out.keys.push_back(std::move(row.spec));
  }
  return out;
}

const std::vector<SectionSpec>& config_table() {
  static const std::vector<SectionSpec> table = assemble_table();
  return table;
}

const KeySpec* find_key(const std::string& dotted) {
  const size_t dot = dotted.rfind('.');
  if (dot == std::string::npos) return nullptr;
  return find_key(dotted.substr(0, dot), dotted.substr(dot + 1));
}

bool is_section_prefix(const std::string& prefix) {
  for (const auto& s : config_table()) {
    if (s.name.size() > prefix.size() && s.name.compare(0, prefix.size(), prefix) == 0 &&
        s.name[prefix.size()] == '.') {
      return true;
    }
  }
  return false;
}

const SectionSpec* find_section(const std::string& name) {
  for (const auto& s : config_table()) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

const KeySpec* find_key(const std::string& section, const std::string& name) {
  const SectionSpec* s = find_section(section);
  if (s == nullptr) return nullptr;
  for (const auto& k : s->keys) {
    if (k.name == name) return &k;
  }
  return nullptr;
}

bool Range::contains(double v) const {
  if (sentinel && v == *sentinel) return true;
  if (lo && (lo_open ? !(v > *lo) : !(v >= *lo))) return false;
  if (hi && (hi_open ? !(v < *hi) : !(v <= *hi))) return false;
  return true;
}

std::string Range::describe() const {
  // Bounds as written in the table: 1, 0.5, -1, and whole numbers in full (2147483647, not
  // 2.14748e+09), so that the message states the exact limit.
  auto text = [](double v) {
    if (v == std::floor(v) && std::fabs(v) < 9.0e18) return std::to_string(static_cast<int64_t>(v));
    std::ostringstream os;
    os << v;
    return os.str();
  };
  std::string out;
  if (sentinel) out += text(*sentinel) + " or ";
  if (lo && hi) {
    out += std::string("in ") + (lo_open ? "(" : "[") + text(*lo) + ", " + text(*hi) + (hi_open ? ")" : "]");
  } else if (lo) {
    out += (lo_open ? "> " : ">= ") + text(*lo);
  } else if (hi) {
    out += (hi_open ? "< " : "<= ") + text(*hi);
  }
  return out;
}

}  // namespace titan::trainer::config::detail
