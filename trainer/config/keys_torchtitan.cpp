// trainer/config/keys_torchtitan.cpp — the rows of the key table that exist for torchtitan's
// schema: older names of titan keys (aliases) and torchtitan keys titan accepts without an effect
// or refuses by feature (Note [torchtitan's schema in the key table] in key_table.h).
//
// Release names in `versions`: "early-2025" is torchtitan's schema of January-February 2025
// (argparse era: training.batch_size, [experimental], float8.enable_float8_linear); v0.1.0 (June
// 2025) moved the degrees to [parallelism] and added [lr_scheduler]; v0.2.0 moved float8 to
// [quantize.linear.float8], compile to [compile] and the tokenizer to model.hf_assets_path;
// v0.2.1 moved seed/deterministic to [debug]; v0.2.2 added lr_scheduler.total_steps.
#include "trainer/config/key_table.h"

namespace titan::trainer::config::detail {

namespace {

using Strings = std::vector<std::string>;

constexpr const char* kNoPython = "it configures Python-side machinery titan does not have";
constexpr const char* kOnlyWithFaultTolerance =
    "it is read only by torchft, which titan refuses (fault_tolerance.enable)";
constexpr const char* kEstimateMemory = "titan-train --estimate-memory prints titan's own per-rank estimate";
constexpr const char* kLoaderWorkers =
    "titan's loader runs in the training process (no DataLoader workers, no pinned-memory "
    "copies); the batches are the same";

std::vector<Row> rows_of(const std::string& section) {
  if (section == "job") {
    return {
        alias("print_config", "job.print_args", "v0.2.0+"),
        accepted_any("use_for_integration_test", false,
                     "it marks a torchtitan CI config and changes no training",
                     "early-2025, v0.1.0"),
        accepted_if("custom_config_module", "", "Python config modules", "v0.2.0+"),
        accepted_if("save_config_file", "", "writing the config to a file of its own", "v0.2.1+")
            .advising("--job.print_args prints it as TOML, and every checkpoint's manifest.json holds it"),
    };
  }
  if (section == "metrics") {
    return {
        alias("rank_0_only", "metrics.save_for_all_ranks", "early-2025").negated(),
        accepted_if("enable_wandb", false, "Weights & Biases logging", "")
            .advising("W&B has no C++ client to write offline runs for `wandb sync`; "
                      "metrics.enable_tensorboard writes the same metrics as TensorBoard events"),
    };
  }
  if (section == "mx") {
    return {
        accepted_any("use_fp8_dim1_cast_triton_kernel", true,
                     "titan's dim1 cast is its own fused kernel on CUDA either way, with the same bits",
                     "v0.1.0"),
    };
  }
  if (section == "model") {
    return {
        accepted_if("norm_type", "rmsnorm",
                    "norms other than RMSNorm (Llama 3's); fused_rmsnorm is the same math and "
                    "is not accepted by name either",
                    "early-2025"),
        accepted_any("print_after_conversion", false,
                     "the start-up log always prints the converted linears and the parallel plan",
                     "v0.1.0+"),
    };
  }
  if (section == "optimizer") {
    return {
        accepted_any("fused", false,
                     "titan's AdamW step is always the fused kernel, with the same math as the "
                     "for-loop and foreach ones",
                     "early-2025"),
        accepted_any("implementation", "fused",
                     "titan's AdamW step is always the fused kernel, with the same math as the "
                     "for-loop and foreach ones",
                     "v0.1.0+"),
        accepted_if("early_step_in_backward", false, "the optimizer step inside backward", ""),
    };
  }
  if (section == "lr_scheduler") {
    return {
        alias("lr_min", "lr_scheduler.min_lr_factor", "v0.1.0"),
        accepted_if("total_steps", int64_t{0},
                    "an LR schedule length other than training.steps (lr_scheduler.total_steps)",
                    "v0.2.2"),
    };
  }
  if (section == "training") {
    return {
        alias("batch_size", "training.local_batch_size", "early-2025"),
        alias("warmup_steps", "lr_scheduler.warmup_steps", "early-2025"),
        alias("data_parallel_replicate_degree", "parallelism.data_parallel_replicate_degree",
              "early-2025"),
        alias("data_parallel_shard_degree", "parallelism.data_parallel_shard_degree",
              "early-2025"),
        alias("tensor_parallel_degree", "parallelism.tensor_parallel_degree", "early-2025"),
        alias("disable_loss_parallel", "parallelism.disable_loss_parallel", "early-2025"),
        alias("fsdp_reshard_after_forward", "parallelism.fsdp_reshard_after_forward",
              "early-2025"),
        accepted_if("enable_cpu_offload", false, "FSDP CPU offload", ""),
        accepted_any("gc_freq", int64_t{50}, "titan has no garbage collector to schedule", ""),
        accepted_any("gc_debug", false, "titan has no garbage collector to schedule", "v0.1.0+"),
        accepted_if("dtype", "float32",
                    "pure bfloat16 training without float32 masters (training.dtype)", "v0.2.0+"),
        alias("debug_moe_force_load_balance", "model.moe_force_load_balance", "v0.2.0"),
    };
  }
  if (section == "parallelism") {
    return {
        accepted_any("enable_compiled_autograd", false,
                     "titan has no JIT; its backward is compiled ahead of time", "v0.1.0, v0.2.0"),
        accepted_any("pipeline_parallel_expert_parallel_overlap", true,
                     "titan runs a pipeline's and its experts' communication one after the other: the setting "
                     "changes speed, not numbers", "v0.2.1+"),
        accepted_if("context_parallel_load_balancer", "headtail",
                    "other context-parallel load balancers (titan splits head + tail chunks)", "v0.2.2"),
        accepted_if("expert_parallel_comm_backend", "standard",
                    "the DeepEP all-to-all kernels (titan's expert parallelism uses the process group's all-to-all)",
                    "v0.2.1+"),
    };
  }
  if (section == "checkpoint") {
    // titan implements checkpointing under torchtitan's first spelling of each key (the
    // implemented rows are in keys.cpp); later spellings are aliases of them.
    return {
        alias("enable", "checkpoint.enable_checkpoint", "v0.2.0+"),
        accepted_if("interval_type", "steps", "checkpoint intervals in seconds", "early-2025"),
        alias("last_save_model_only", "checkpoint.model_weights_only", "v0.2.0+"),
        alias("last_save_model_weights_only", "checkpoint.model_weights_only", "v0.1.0"),
        alias("initial_load_model_weights_only", "checkpoint.initial_load_model_only", "v0.1.0"),
        accepted_if("initial_load_in_hf_quantized", false,
                    "loading quantized Hugging Face checkpoints", "v0.2.0+"),
        accepted_any("enable_ft_dataloader_checkpoints", true, kOnlyWithFaultTolerance,
                     "v0.2.0+"),
    };
  }
  if (section == "activation_checkpoint") {
    return {
        accepted_any("per_op_sac_force_recompute_mm_shapes_by_fqns", Strings{"moe.router.gate"},
                     "titan's per-op AC decides by op, not by GEMM shape (docs/memory.md)", "v0.2.0+"),
        accepted_any("early_stop", false,
                     "stopping a recompute early saves time, not values; titan recomputes whole",
                     "v0.2.0+"),
        accepted_any("memory_budget", 0.5,
                     "it is read only with mode = memory_budget (torch.compile's partitioner), which "
                     "titan refuses",
                     "v0.2.0+"),
        accepted_if("visualize_memory_budget_pareto", false, "memory-budget activation checkpointing",
                    "v0.2.0+"),
        accepted_any("preserve_rng_state", true,
                     "Llama 3 has no dropout, so recomputation draws no random numbers",
                     "v0.2.1+"),
        accepted_if("determinism_check", "default",
                    "recomputation determinism checks other than the default", "v0.2.1+"),
        accepted_if("debug", false, "activation-checkpoint debug mode", "v0.2.1+"),
    };
  }
  if (section == "float8") {
    return {
        accepted_any("force_recompute_fp8_weight_in_bwd", false,
                     "titan's float8 backward always recasts the weight from the gathered "
                     "high-precision one; no unsharded float8 weight is saved for backward",
                     "early-2025, v0.1.0"),
    };
  }
  if (section == "comm") {
    return {
        accepted_any("save_traces_folder", "comm_traces",
                     "titan records every collective in its own per-rank record", "v0.2.0+"),
        accepted_any("save_traces_file_prefix", "rank_",
                     "titan records every collective in its own per-rank record", "v0.2.0+"),
        accepted_if("mode", "default", "torchtitan's fake_backend and local_tensor communication modes",
                    "v0.2.1+")
            .advising("titan's dry run, titan-train --dry-run-rank R --dry-run-world N, builds and "
                      "initializes one rank's share of an N-rank job without communicating"),
    };
  }
  return {};
}

}  // namespace

std::vector<Row> torchtitan_rows(const std::string& section) { return rows_of(section); }

std::vector<SectionSpec> torchtitan_sections() {
  return {
      torchtitan_section("experimental", "torchtitan's early-2025 section; its keys moved to "
                         "[parallelism].", {
          alias("enable_async_tensor_parallel", "parallelism.enable_async_tensor_parallel",
                "early-2025"),
          alias("pipeline_parallel_degree", "parallelism.pipeline_parallel_degree", "early-2025"),
          alias("pipeline_parallel_split_points", "parallelism.pipeline_parallel_split_points",
                "early-2025"),
          alias("pipeline_parallel_schedule", "parallelism.pipeline_parallel_schedule",
                "early-2025"),
          alias("pipeline_parallel_schedule_csv", "parallelism.pipeline_parallel_schedule_csv",
                "early-2025"),
          alias("pipeline_parallel_microbatches", "parallelism.num_pp_microbatches", "early-2025"),
          alias("enable_compiled_autograd", "parallelism.enable_compiled_autograd", "early-2025"),
          alias("context_parallel_degree", "parallelism.context_parallel_degree", "early-2025"),
          alias("context_parallel_rotate_method", "parallelism.context_parallel_rotate_method",
                "early-2025"),
          accepted_if("custom_model_path", "", "custom Python model modules", "early-2025"),
          accepted_if("custom_import", "", "custom Python imports", "v0.1.0"),
          accepted_if("custom_args_module", "", "custom Python config modules", "v0.1.0"),
      }),
      torchtitan_section("compile", "torchtitan's torch.compile settings (v0.2.0+).", {
          alias("enable", "training.compile", "v0.2.0+"),
          // Later torchtitan moved the switch here, since its async TP is a compiler pass; titan
          // builds the overlap natively (parallel/tensor_parallel/async_tp.h) and needs no compiler for it.
          alias("enable_async_tensor_parallel", "parallelism.enable_async_tensor_parallel", "after v0.2.2"),
          accepted_any("components", Strings{"model", "loss"},
                       "titan has no JIT; every component is compiled ahead of time", "v0.2.0+"),
          accepted_any("backend", "inductor",
                       "titan has no JIT; every component is compiled ahead of time", "v0.2.0+"),
      }),
      torchtitan_section("quantize.linear.float8",
                         "torchtitan's float8 linear settings (v0.2.0+); titan's [float8].", {
          alias("enable_fsdp_float8_all_gather", "float8.enable_fsdp_float8_all_gather",
                "v0.2.0+"),
          alias("precompute_float8_dynamic_scale_for_fsdp",
                "float8.precompute_float8_dynamic_scale_for_fsdp", "v0.2.0+"),
          alias("recipe_name", "float8.recipe_name", "v0.2.0+"),
          alias("filter_fqns", "float8.filter_fqns", "v0.2.0+"),
          alias("emulate", "float8.emulate", "v0.2.0+"),
      }),
      torchtitan_section("quantize.linear.mx", "torchtitan's MX linear settings (v0.2.0+); titan's [mx].", {
          alias("mxfp8_dim1_cast_kernel_choice", "mx.mxfp8_dim1_cast_kernel_choice", "v0.2.0+"),
          alias("recipe_name", "mx.recipe_name", "v0.2.0+"),
          alias("filter_fqns", "mx.filter_fqns", "v0.2.0+"),
      }),
      torchtitan_section("training.dataloader", "torchtitan's DataLoader worker settings.", {
          accepted_any("num_workers", int64_t{0}, kLoaderWorkers, "v0.2.1+"),
          accepted_any("persistent_workers", false, kLoaderWorkers, "v0.2.1+"),
          accepted_any("pin_memory", false, kLoaderWorkers, "v0.2.1+"),
          accepted_any("prefetch_factor", int64_t{0}, kLoaderWorkers, "v0.2.1+"),
      }),
      torchtitan_section("validation.dataloader", "torchtitan's validation DataLoader workers.", {
          accepted_any("num_workers", int64_t{0}, kLoaderWorkers, "v0.2.1+"),
          accepted_any("persistent_workers", false, kLoaderWorkers, "v0.2.1+"),
          accepted_any("pin_memory", false, kLoaderWorkers, "v0.2.1+"),
          accepted_any("prefetch_factor", int64_t{0}, kLoaderWorkers, "v0.2.1+"),
      }),
      torchtitan_section("debug", "torchtitan v0.2.1's debugging switches.", {
          alias("seed", "training.seed", "v0.2.1+"),
          alias("deterministic", "training.deterministic", "v0.2.1+"),
          accepted_any("deterministic_warn_only", false,
                       "titan's deterministic mode has no nondeterministic op to warn about",
                       "v0.2.1+"),
          alias("moe_force_load_balance", "model.moe_force_load_balance", "v0.2.1+"),
      }),
      torchtitan_section("memory_estimation", "torchtitan's FakeTensor memory estimation.", {
          accepted_if("enabled", false, "FakeTensor memory estimation as a training mode",
                      "early-2025, v0.1.0")
              .advising(kEstimateMemory),
          accepted_if("enable", false, "FakeTensor memory estimation as a training mode", "v0.2.0+")
              .advising(kEstimateMemory),
          accepted_any("disable_fake_mode", false,
                       "it is read only by torchtitan's FakeTensor estimation (memory_estimation.enable), "
                       "which titan refuses",
                       "")
              .advising(kEstimateMemory),
      }),
      torchtitan_section("fault_tolerance", "torchft fault tolerance (v0.1.0+).", {
          accepted_if("enable", false, "torchft fault tolerance", "v0.1.0+"),
          accepted_any("process_group", "gloo", kOnlyWithFaultTolerance, "v0.2.0+"),
          accepted_any("process_group_timeout_ms", int64_t{10000}, kOnlyWithFaultTolerance,
                       "v0.2.0+"),
          accepted_any("replica_id", int64_t{0}, kOnlyWithFaultTolerance, "v0.1.0+"),
          accepted_any("group_size", int64_t{0}, kOnlyWithFaultTolerance, "v0.1.0+"),
          accepted_any("min_replica_size", int64_t{1}, kOnlyWithFaultTolerance, "v0.1.0+"),
          accepted_any("semi_sync_method", "", kOnlyWithFaultTolerance, "v0.1.0+"),
          accepted_any("sync_steps", int64_t{5}, kOnlyWithFaultTolerance, "v0.1.0"),
          accepted_any("should_quantize", false, kOnlyWithFaultTolerance, "v0.1.0"),
          accepted_any("fragment_sync_delay", int64_t{0}, kOnlyWithFaultTolerance, "v0.1.0"),
          accepted_any("fragment_update_alpha", 0.0, kOnlyWithFaultTolerance, "v0.1.0"),
      }),
  };
}

}  // namespace titan::trainer::config::detail
