#!/usr/bin/env bash
# Everything that needs an NVIDIA GPU: the CUDA-enabled build, the GPU tests (float8 kernels and
# GEMM back ends against their CPU references), the float8 benchmarks on Llama 3 shapes, and
# short training runs with every recipe. Prints one summary table at the end; the numbers go to
# docs/performance.md.   scripts/gpu_check.sh [--quick]
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_check: no NVIDIA GPU visible (nvidia-smi -L failed); nothing to do" >&2
  exit 1
fi
QUICK=0; [[ "${1:-}" == "--quick" ]] && QUICK=1
OUT="${GPU_CHECK_OUT:-$ROOT/outputs/gpu_check}"
mkdir -p "$OUT"
nvidia-smi -L | tee "$OUT/gpu.txt"
TITAN_CUDA=1 scripts/setup.sh 2>&1 | tail -3 || { echo "gpu_check: CUDA build failed"; exit 1; }
B="$ROOT/build-cuda"
declare -a SUMMARY

run() {  # name, command...
  local name="$1"; shift
  local start=$(date +%s)
  if "$@" >"$OUT/$name.log" 2>&1; then r=PASS; else r="FAIL($?)"; fi
  SUMMARY+=("$(printf '%-40s %-10s %5ss' "$name" "$r" $(( $(date +%s) - start )))")
  tail -5 "$OUT/$name.log"
}

run test_float8_cuda "$B/tests/test_float8" "[cuda]"
run test_float8_all "$B/tests/test_float8"
run bench_matmul "$B/apps/titan-bench-matmul"
run bench_linear "$B/apps/titan-bench-linear"
steps=30; [[ $QUICK == 1 ]] && steps=10
for recipe in none tensorwise rowwise rowwise_with_gw_hp tensorwise_delayed int8; do
  args=(--training.device cuda --training.steps "$steps" --metrics.log_freq 10
        --training.local_batch_size 8 --training.seq_len 2048 --job.dump_folder "$OUT/train_$recipe")
  case $recipe in
    none) ;;
    int8) args+=(--int8.enable_int8_linear) ;;
    *) args+=(--float8.enable_float8_linear --float8.recipe_name "$recipe") ;;
  esac
  run "train_debugmodel_$recipe" "$B/apps/titan-train" --job.config_file configs/llama3_debugmodel.toml "${args[@]}"
done
# CUDA memory snapshot: PyTorch's pickle (memory_viz) and titan's categorized HTML picture.
snap() {
  "$B/apps/titan-train" --job.config_file configs/llama3_debugmodel.toml --training.device cuda \
    --training.steps 2 --profiling.enable_memory_snapshot --profiling.profile_freq 2 \
    --job.dump_folder "$OUT/train_snapshot" &&
    ls "$OUT"/train_snapshot/memory_snapshot/iteration_2/rank0_memory_snapshot.{pickle,html} &&
    .deps/venv/bin/python -c "import pickle,sys; d=pickle.load(open(sys.argv[1],'rb')); print(len(d['segments']), 'segments')" \
      "$OUT/train_snapshot/memory_snapshot/iteration_2/rank0_memory_snapshot.pickle" &&
    grep -q "activations" "$OUT/train_snapshot/memory_snapshot/iteration_2/rank0_memory_snapshot.html"
}
run cuda_memory_snapshot snap
NG="$(nvidia-smi -L | wc -l)"
if [[ "$NG" -ge 2 ]]; then
  run train_fsdp2 "$B/apps/titan-run" --nproc-per-node 2 -- "$B/apps/titan-train" \
    --job.config_file configs/llama3_debugmodel.toml --training.device cuda --training.steps 20 \
    --parallelism.data_parallel_shard_degree 2 --job.dump_folder "$OUT/train_fsdp2"
  run train_fsdp2_float8_all_gather "$B/apps/titan-run" --nproc-per-node 2 -- "$B/apps/titan-train" \
    --job.config_file configs/llama3_debugmodel.toml --training.device cuda --training.steps 20 \
    --parallelism.data_parallel_shard_degree 2 --float8.enable_float8_linear \
    --float8.recipe_name tensorwise --float8.enable_fsdp_float8_all_gather \
    --float8.precompute_float8_dynamic_scale_for_fsdp --job.dump_folder "$OUT/train_fsdp2_f8ag"
fi
echo
echo "== gpu_check summary ($(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)) =="
printf '%s\n' "${SUMMARY[@]}"
echo "logs: $OUT"
