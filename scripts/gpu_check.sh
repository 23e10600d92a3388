#!/usr/bin/env bash
# The GPU check: everything of titan that needs an NVIDIA GPU, in one command on a bare, offline
# GPU machine that has only the checkout, a bundle from scripts/gpu_bundle.sh and its own
# python3 with torch 2.11 (no apt, no pip, no build).
#   scripts/gpu_check.sh --bundle DIR [--quick] [--rehearse]
#     --quick      fewer steps, no torch.compile, no CPU test cases, no debug-model recipe sweep
#     --rehearse   no GPU needed: runs the steps that have a CPU twin (the bundle's executables
#                  on the CPU, the python baseline, the snapshot viewer, the result files) and
#                  lists the GPU steps as skipped; scripts/gpu_bundle.sh --rehearse runs it
# Environment: GPU_CHECK_OUT (results folder, default outputs/gpu_check), TITAN_PYTHON (the
# python whose torch is used; default python3), GPU_CHECK_DEADLINE_S (default 540: later steps
# are reported NOT RUN instead of overrunning a 10-minute command).
# What it measures (docs/development.md, "GPU check"): every [cuda] test (fused casts vs the CPU
# reference bit for bit, _scaled_mm and cuBLASLt vs emulation, int8 _int_mm, the MX / blockwise
# dim0 and dim1 cast kernels vs the CPU casts, cuBLASLt block-scaled GEMMs vs the emulation),
# one-rank NCCL collectives through Comm, titan-bench-matmul (8192^3 float8 vs bf16) and
# titan-bench-linear (M=K=N=8192 fwd+bwd, the block-scaled recipes' time and SQNR too), Llama 3
# 8B-shaped training (8B_4layers, seq_len 8192, per-op AC) in bf16, three float8 recipes and the
# block-scaled ones the GPU multiplies natively (blockwise on sm90+, MXFP8 on sm100+) beside
# eager PyTorch and torch.compile, a CUDA memory snapshot
# opened with torch.cuda._memory_viz, and on 2+ GPUs FSDP 2 / TP 2 against one GPU.
# Results (at most 8 files): summary.txt (the table), results.json (every number),
# logs.tar.gz (every log, metrics and snapshot), memory_viz.html.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BUNDLE="" QUICK=0 REHEARSE=0
while (($#)); do
  case "$1" in
    --bundle) BUNDLE="${2:-}"; shift 2 || { echo "gpu_check: --bundle needs a folder" >&2; exit 2; } ;;
    --quick) QUICK=1; shift ;;
    --rehearse) REHEARSE=1; shift ;;
    -h|--help) sed -n '2,/^set /p' "$0" | sed '$d'; exit 0 ;;
    *) echo "gpu_check: unknown argument '$1' (valid: --bundle DIR, --quick, --rehearse)" >&2; exit 2 ;;
  esac
done
if [[ -z "$BUNDLE" ]]; then
  echo "gpu_check: --bundle DIR is required (make it with scripts/gpu_bundle.sh; default .gpu_bundle)" >&2
  exit 2
fi
NG=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  NG=$(nvidia-smi -L | grep -c '^GPU')
fi
if ((NG == 0 && REHEARSE == 0)); then
  echo "gpu_check: no NVIDIA GPU visible (nvidia-smi -L failed); without a GPU run --rehearse" >&2
  exit 1
fi
# shellcheck source=scripts/gpu_env.sh
source "$ROOT/scripts/gpu_env.sh" "$BUNDLE" || exit 2
BUNDLE="$(cd "$BUNDLE" && pwd)"
B="$BUNDLE/bin"
RESULTS="${GPU_CHECK_OUT:-$ROOT/outputs/gpu_check}"
mkdir -p "$RESULTS"
WORK="$(mktemp -d /tmp/titan-gpu-check.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/logs" "$WORK/runs"
MODE=gpu; ((QUICK)) && MODE=quick; ((REHEARSE)) && MODE=rehearse
DEVICE="cpu (no GPU)"
((NG > 0)) && DEVICE="$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1) x$NG"
T0=$(date +%s)
# Steps are skipped once this many seconds have passed, so that a run inside a 10-minute device
# command always ends with its result files written.
DEADLINE="${GPU_CHECK_DEADLINE_S:-540}"
{ echo "mode $MODE, device: $DEVICE, torch $TITAN_TORCH_VERSION ($TITAN_TORCH_DIR), python $TITAN_PY"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"; nvidia-smi 2>/dev/null; } >"$WORK/logs/environment.log"
echo "[gpu_check] mode $MODE on $DEVICE; torch $TITAN_TORCH_VERSION; results -> $RESULTS"

# assemble: the result files from what the steps left so far (scripts/bench/gpu_results.py). It
# never stops on what it reads: an output it cannot read is listed in summary.txt, named here
# once, and fails the whole check at the end (ASSEMBLY_RC), so a bench tool whose format
# changed turns the rehearsal, and CI, red instead of silently losing the GPU run's table.
ASSEMBLY_RC=0
touch "$WORK/assemble.seen"
assemble() {
  "$TITAN_PY" "$ROOT/scripts/bench/gpu_results.py" --work "$WORK" --out "$RESULTS" --mode "$MODE" \
    --device "$DEVICE" --bundle "$BUNDLE" --seconds $(( $(date +%s) - T0 )) >/dev/null 2>"$WORK/logs/assemble.err"
  ASSEMBLY_RC=$?
  if ((ASSEMBLY_RC == 3)); then  # unreadable outputs, each named once
    awk 'FILENAME == ARGV[1] { seen[$0] = 1; next } /^gpu_results: unreadable/ && !seen[$0] { print "[gpu_check] " $0 }' \
      "$WORK/assemble.seen" "$WORK/logs/assemble.err" >&2
    cp "$WORK/logs/assemble.err" "$WORK/assemble.seen"
  elif ((ASSEMBLY_RC != 0)); then
    echo "[gpu_check] assembling the results failed (rc $ASSEMBLY_RC): $(tail -2 "$WORK/logs/assemble.err")" >&2
  fi
}
# step NAME LIMIT_S SKIP_OK CMD...: runs CMD with its log in logs/NAME.log. Exit 77 means
# "skipped" (a test that found no GPU); SKIP_OK=1 accepts that (rehearsal), else it fails.
step() {
  local name="$1" limit="$2" skip_ok="$3" start rc status left
  shift 3
  left=$((DEADLINE - ($(date +%s) - T0)))
  if ((left < 30)); then not_run "$name" "GPU_CHECK_DEADLINE_S=$DEADLINE spent"; assemble; return; fi
  ((limit > left)) && limit=$left
  start=$(date +%s%N)
  # bash -c: the helpers below are exported functions, which timeout cannot start by itself.
  timeout --kill-after=15 "$limit" bash -c '"$@"' "$name" "$@" >"$WORK/logs/$name.log" 2>&1
  rc=$?
  case $rc in
    0) status=PASS ;;
    77) status=SKIP; ((skip_ok)) || status=FAIL ;;
    124|137) status=TIMEOUT ;;
    *) status=FAIL ;;
  esac
  printf '%s\t%s\t%s\t%d.%d\t%s\n' "$name" "$status" "$rc" $(( ($(date +%s%N) - start) / 1000000000 )) \
    $(( ($(date +%s%N) - start) / 100000000 % 10 )) "$*" >>"$WORK/steps.tsv"
  echo "[gpu_check] $name: $status (rc $rc)"
  [[ $status == PASS || $status == SKIP ]] || tail -5 "$WORK/logs/$name.log" | sed 's/^/    /'
  assemble
}
not_run() { printf '%s\tNOT RUN\t-\t0\t%s\n' "$1" "$2" >>"$WORK/steps.tsv"; }

# ------------------------------------------------------------------------------- preflight
# Every bundled executable must resolve every library. If the machine's libstdc++ is older
# than the build's, the bundle's own (lib/compat) goes first.
preflight() {
  local missing
  missing="$(for f in "$B"/*; do ldd "$f" 2>&1 | sed "s|^|$(basename "$f"): |"; done | grep -E "not found")"
  if [[ -n "$missing" ]] && grep -q "GLIBCXX\|CXXABI\|GCC_" <<<"$missing" && [[ -z "${TITAN_GPU_ENV_COMPAT:-}" ]]; then
    echo "the machine's libstdc++ is older than the bundle needs; using lib/compat"
    return 3
  fi
  [[ -z "$missing" ]] || { echo "unresolved libraries:"; echo "$missing"; return 1; }
  for f in "$B"/*; do echo "== $(basename "$f")"; ldd "$f"; done
  # On a GPU, the [cuda] test cases return early without a device: make sure there is one.
  if ((!REHEARSE)); then
    "$TITAN_PY" -c "import torch; assert torch.cuda.is_available(), 'torch sees no GPU'; \
print('torch', torch.__version__, 'sees', torch.cuda.get_device_name(), torch.cuda.get_device_capability(), \
'nccl', torch.cuda.nccl.version())" || return 1
  fi
}
export B REHEARSE
export -f preflight
preflight >"$WORK/logs/preflight_probe.log" 2>&1
if [[ $? == 3 ]]; then
  export TITAN_GPU_ENV_COMPAT=1
  source "$ROOT/scripts/gpu_env.sh" "$BUNDLE" || exit 2
fi
step preflight 60 0 preflight
if grep -q "^preflight	FAIL" "$WORK/steps.tsv"; then
  echo "[gpu_check] preflight failed (a library unresolved, or no GPU torch can use): see preflight.log in $RESULTS/logs.tar.gz" >&2
  exit 1
fi

DATA=(--training.dataset fortunes --training.dataset_path "$BUNDLE/data/fortunes")
VOCAB="$BUNDLE/data/bench_vocab_128k.tiktoken"
export B BUNDLE WORK ROOT
train() {  # NAME CONFIG ARGS...: titan-train with its outputs under runs/NAME
  local name="$1" config="$2"
  shift 2
  "$B/titan-train" --job.config_file "$BUNDLE/configs/$config" --training.dataset fortunes \
    --training.dataset_path "$BUNDLE/data/fortunes" --metrics.log_freq 1 \
    --job.dump_folder "$WORK/runs/$name" "$@"
}
snapshot() {  # DEVICE: 2 steps with a memory snapshot, opened with PyTorch's own viewer
  local dir="$WORK/runs/memory_snapshot/memory_snapshot/iteration_2"
  train memory_snapshot llama3_debugmodel.toml --training.device "$1" --training.steps 2 \
    --profiling.enable_memory_snapshot --profiling.profile_freq 2 || return 1
  ls -l "$dir"/rank0_memory_snapshot.{pickle,html} || return 1
  "$TITAN_PY" -m torch.cuda._memory_viz stats "$dir/rank0_memory_snapshot.pickle" || return 1
  "$TITAN_PY" -m torch.cuda._memory_viz trace_plot "$dir/rank0_memory_snapshot.pickle" \
    -o "$WORK/memory_viz.html" || return 1
  grep -q "activations" "$dir/rank0_memory_snapshot.html"
}
eager() {  # NAME ARGS...: the eager PyTorch baseline; its JSON line goes to runs/NAME.json
  local name="$1"
  shift
  PYTHONUNBUFFERED=1 "$TITAN_PY" "$ROOT/scripts/bench/eager_llama.py" "$@" >"$WORK/runs/$name.json"
  local rc=$?
  cat "$WORK/runs/$name.json"
  return $rc
}

plan_8B() {  # GPU_KIND: the planner's prediction for train_8B_4layers_bf16's layout on one such GPU
  "$B/titan-train" --job.config_file "$BUNDLE/configs/llama3_8b.toml" --model.flavor 8B_4layers \
    --model.tokenizer_path "$VOCAB" --job.plan --plan.device "$1" --plan.gpus_per_node 1 \
    --training.global_batch_size 1 --plan.explain "dp_shard=1,local_batch=1,ac=selective"
}

export VOCAB
export -f train snapshot eager plan_8B
if ((REHEARSE)); then
  # ----------------------------------------------------------------- rehearsal (CPU twins)
  step test_nccl 120 1 "$B/test_nccl"
  step test_float8_cuda_cases 60 0 bash -c "n=\$('$B/test_float8' --list-test-names-only '[cuda]' | grep -c CUDA); echo \"\$n [cuda] cases\"; ((n >= 4))"
  step cpu_train_step 300 0 train cpu_train_step llama3_debugmodel.toml --training.steps 2 \
    --training.seq_len 64 --training.local_batch_size 2
  step cpu_train_bench_vocab 300 0 train cpu_train_bench_vocab llama3_debugmodel.toml \
    --model.tokenizer_path "$VOCAB" --training.steps 1 --training.seq_len 64 --training.local_batch_size 1
  step cpu_titan_run_fsdp2 300 0 "$B/titan-run" --nproc-per-node 2 -- "$B/titan-train" \
    --job.config_file "$BUNDLE/configs/llama3_debugmodel.toml" "${DATA[@]}" --training.steps 2 \
    --training.seq_len 64 --training.local_batch_size 2 --training.num_threads 1 \
    --parallelism.data_parallel_shard_degree 2 --metrics.log_freq 1 --job.dump_folder "$WORK/runs/cpu_fsdp2"
  step bench_matmul 300 0 "$B/titan-bench-matmul" --device cpu --scale 64 --tokens 512 --iters 1
  step bench_linear 300 0 "$B/titan-bench-linear" --device cpu --scale 16 --tokens 512 --dims 1024 --iters 1
  step bench_experts 120 0 "$B/titan-bench-experts" --device cpu --scale 32 --tokens 2048 --iters 1
  step bench_attention_seq 120 0 "$B/titan-bench-attention" --seq-sweep 1024 --iters 1
  step eager_cpu 300 0 eager eager_cpu --flavor debugmodel --steps 1 --warmup 1 --batch 1 --seq-len 32 --ac op
  step memory_snapshot 300 0 snapshot cpu
  step plan_8B_4layers 60 0 plan_8B h100
  for s in test_model_cuda test_trainer_cuda test_float8_cuda test_float8_all train_qwen3_moe_bf16 \
           train_8B_4layers_{bf16,tensorwise,rowwise,rowwise_with_gw_hp,blockwise,block_causal} \
           eager_8B_4layers compile_8B_4layers debugmodel_recipes multi_gpu; do
    not_run "$s" "needs a GPU"
  done
else
  # ------------------------------------------------------------------------------ on a GPU
  STEPS=14; ((QUICK)) && STEPS=8
  step test_float8_cuda 300 0 "$B/test_float8" "[cuda]" --durations yes
  step test_model_cuda 120 0 "$B/test_model" "[cuda]" --durations yes  # the init kernel, varlen document attention, ring attention blocks on flash and the MoE grouped GEMM vs the CPU
  step test_trainer_cuda 120 0 "$B/test_trainer" "[cuda]" --durations yes  # AdamW's CUDA kernel over bf16 compute copies vs the CPU kernel
  step test_nccl 180 0 "$B/test_nccl" --durations yes
  # Mixture of experts (Qwen3 MoE: the grouped GEMM, routing, load balancing) and document
  # masking (varlen flash attention) as whole training runs on the GPU, before the benchmarks.
  step train_qwen3_moe_bf16 200 0 train train_qwen3_moe_bf16 llama3_debugmodel.toml \
    --model.name qwen3 --model.flavor debugmodel_moe --training.device cuda \
    --training.mixed_precision_param bfloat16 --training.steps 10 --training.seq_len 2048
  step bench_matmul 300 0 "$B/titan-bench-matmul" --device cuda
  if ((QUICK)); then
    step bench_linear 300 0 "$B/titan-bench-linear" --device cuda --tokens 8192 --dims 8192
  else
    step bench_linear 300 0 "$B/titan-bench-linear" --device cuda --tokens 8192 --dims 1024 4096 8192
  fi
  # The MoE experts' recipes (quantize.grouped_mm.*) at Qwen3-30B-A3B and DeepSeek-V3 expert
  # shapes as one rank of EP 8 holds them (targets: float8 rowwise fwd+bwd >= 1.3x bf16 at
  # DeepSeek-V3's; MX rows only on sm100).
  step bench_experts 200 0 "$B/titan-bench-experts" --device cuda
  # Flash attention's rate as the sequence grows (512 .. 128k tokens, one 8B head group): what
  # the planner's attention term needs at long context (docs/planner.md, "Long context").
  step bench_attention_seq 200 0 "$B/titan-bench-attention" --device cuda --seq-sweep 131072 --iters 3
  # Llama 3 8B-shaped: 8B's layers (4 of 32) and vocabulary, seq_len 8192, per-op AC, bf16.
  # Block-scaled recipes by what the GPU multiplies natively: blockwise float8 on sm90+ (cuBLASLt
  # VEC128 / BLK128x128 scales), MXFP8 on sm100+ (VEC32_UE8M0); never an emulated throughput.
  CC=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)
  BLOCK_SCALED=(blockwise); ((CC >= 100)) && BLOCK_SCALED+=(mxfp8_cublas mxfp8_cublas_rceil)
  for recipe in bf16 tensorwise rowwise rowwise_with_gw_hp "${BLOCK_SCALED[@]}"; do
    case $recipe in
      bf16) f8=() ;;
      mxfp8*) f8=(--model.converters mx --mx.recipe_name "$recipe") ;;
      *) f8=(--float8.enable_float8_linear --float8.recipe_name "$recipe") ;;
    esac
    step "train_8B_4layers_$recipe" 400 0 train "train_8B_4layers_$recipe" llama3_8b.toml \
      --model.flavor 8B_4layers --model.tokenizer_path "$VOCAB" --training.steps "$STEPS" \
      --lr_scheduler.warmup_steps 2 "${f8[@]}"
  done
  # The layout planner's prediction for the bf16 run's layout on this GPU kind (docs/planner.md).
  PLAN_DEVICE=h100; grep -qi h200 <<<"$DEVICE" && PLAN_DEVICE=h200
  step plan_8B_4layers 60 0 plan_8B "$PLAN_DEVICE"
  step train_8B_4layers_block_causal 400 0 train train_8B_4layers_block_causal llama3_8b.toml \
    --model.flavor 8B_4layers --model.tokenizer_path "$VOCAB" --training.steps "$STEPS" \
    --lr_scheduler.warmup_steps 2 --model.attn_mask_type block_causal
  EAGER=(--device cuda --dtype bfloat16 --flavor 8B_4layers --vocab 128256 --batch 1 --seq-len 8192
         --ac op --steps $((STEPS - 3)) --warmup 3 --threads 8)
  step eager_8B_4layers 400 0 eager eager_8B_4layers "${EAGER[@]}"
  if ((QUICK)); then not_run compile_8B_4layers "--quick"; else
    step compile_8B_4layers 500 0 eager compile_8B_4layers "${EAGER[@]}" --compile
  fi
  step memory_snapshot 300 0 snapshot cuda
  if ((QUICK)); then
    not_run test_float8_all "--quick"; not_run debugmodel_recipes "--quick"
  else
    step test_float8_all 400 0 "$B/test_float8"
    for recipe in bf16 tensorwise rowwise rowwise_with_gw_hp tensorwise_delayed int8 "${BLOCK_SCALED[@]}" mxfp8_emulated; do
      case $recipe in
        bf16) q=() ;;
        int8) q=(--int8.enable_int8_linear) ;;
        mx*) q=(--model.converters mx --mx.recipe_name "$recipe") ;;
        *) q=(--float8.enable_float8_linear --float8.recipe_name "$recipe") ;;
      esac
      step "debugmodel_$recipe" 300 0 train "debugmodel_$recipe" llama3_debugmodel.toml \
        --training.device cuda --training.mixed_precision_param bfloat16 --training.steps 30 \
        --training.local_batch_size 8 --training.seq_len 2048 "${q[@]}"
    done
  fi
  if ((NG >= 2)); then
    # Layouts against one GPU, float32 parameters so that only reduction order differs
    # (scripts/bench/gpu_results.py compares the loss curves).
    L=(--training.device cuda --training.steps 20 --training.local_batch_size 4 --training.seq_len 512)
    step multi_single 300 0 train multi_single llama3_debugmodel.toml "${L[@]}" --training.global_batch_size 8
    # The overlap table of docs/performance.md on GPUs: blocking vs overlapped FSDP, sync vs
    # async TP (float8 tensorwise too); comm_exposed_s in each run's metrics JSONL.
    # Pipeline and context parallelism (never run on GPUs before: NCCL's in-order send/recv
    # matching, the ring's explicit-softmax blocks on CUDA) close the list.
    for layout in fsdp2 fsdp2_blocking tp2 tp2_async tp2_float8 tp2_float8_async fsdp2_float8_all_gather \
                  pp2_1f1b pp2_interleaved cp2_allgather cp2_alltoall cp2_titan_ulysses; do
      case $layout in
        fsdp2) p=(--parallelism.data_parallel_shard_degree 2) ;;
        fsdp2_blocking) p=(--parallelism.data_parallel_shard_degree 2 --parallelism.fsdp_overlap false) ;;
        tp2) p=(--parallelism.tensor_parallel_degree 2 --training.local_batch_size 8) ;;
        tp2_async) p=(--parallelism.tensor_parallel_degree 2 --training.local_batch_size 8
             --parallelism.enable_async_tensor_parallel --parallelism.async_tp_chunks 4) ;;
        tp2_float8) p=(--parallelism.tensor_parallel_degree 2 --training.local_batch_size 8
             --float8.enable_float8_linear --float8.recipe_name tensorwise) ;;
        tp2_float8_async) p=(--parallelism.tensor_parallel_degree 2 --training.local_batch_size 8
             --float8.enable_float8_linear --float8.recipe_name tensorwise
             --parallelism.enable_async_tensor_parallel --parallelism.async_tp_chunks 4) ;;
        fsdp2_float8_all_gather) p=(--parallelism.data_parallel_shard_degree 2 --float8.enable_float8_linear
             --float8.recipe_name tensorwise --float8.enable_fsdp_float8_all_gather
             --float8.precompute_float8_dynamic_scale_for_fsdp) ;;
        pp2_1f1b|pp2_interleaved) p=(--parallelism.pipeline_parallel_degree 2 --parallelism.data_parallel_shard_degree 1
             --training.local_batch_size 8 --parallelism.pipeline_parallel_microbatch_size 2
             --parallelism.pipeline_parallel_schedule "$([[ $layout == pp2_1f1b ]] && echo 1F1B || echo Interleaved1F1B)") ;;
        cp2_*) p=(--parallelism.context_parallel_degree 2 --parallelism.data_parallel_shard_degree 1
             --parallelism.context_parallel_rotate_method "${layout#cp2_}") ;;
      esac
      step "multi_$layout" 300 0 "$B/titan-run" --nproc-per-node 2 -- "$B/titan-train" \
        --job.config_file "$BUNDLE/configs/llama3_debugmodel.toml" "${DATA[@]}" "${L[@]}" \
        --training.global_batch_size 8 --metrics.log_freq 1 --job.dump_folder "$WORK/runs/multi_$layout" "${p[@]}"
    done
  else
    not_run multi_gpu "needs 2+ GPUs (FSDP 2, TP 2, float8 all-gather, PP 2, CP 2 vs 1 GPU); this machine has $NG"
  fi
fi

assemble
cat "$RESULTS/summary.txt"
echo "[gpu_check] results: $RESULTS ($(ls "$RESULTS" | tr '\n' ' '))"
if ((ASSEMBLY_RC != 0)); then
  echo "[gpu_check] FAILED: some step's output could not be assembled (rc $ASSEMBLY_RC; the UNREADABLE rows of summary.txt name each step and text)" >&2
  exit 1
fi
if grep -q -P "\t(FAIL|TIMEOUT)\t" "$WORK/steps.tsv"; then exit 1; fi
exit 0
