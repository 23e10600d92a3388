#!/usr/bin/env bash
# The layout planner's predictions for published GPU runs of Llama 3 (docs/planner.md, "Against
# published runs"): each run's model, cluster and layout through `titan-plan --plan.explain`,
# one row each: published tokens/s per GPU, predicted, ratio. torchtitan's rows are predicted
# twice: for the table's H100 SXM (80 GB, 3.35 TB/s) and for the GPUs they ran on (96 GB of
# HBM2e at 2.4 TB/s: --plan.memory_gib 89.4 --plan.hbm_tbps 2.4; their 500 W cap on the clocks is
# not modeled).
#   scripts/plan_published.sh [BUILD_DIR]
# Published figures: torchtitan's benchmark tables (benchmarks/llama3_h100_202412_torchtitan.md,
# 8B and 70B/405B; H100s with 96 GB at 500 W) and the Llama 3 paper (405B, Table 4: 430 and 400
# TFLOP/s per GPU, converted to tokens/s with the model's FLOPs per token).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:-$ROOT/build}"
PLAN="$BUILD/apps/titan-plan"
[[ -x "$PLAN" ]] || { echo "plan_published.sh: build titan-plan in $BUILD first" >&2; exit 1; }
VOCAB="$ROOT/.gpu_bundle/data/bench_vocab_128k.tiktoken"
if [[ ! -f "$VOCAB" ]]; then  # no GPU bundle here: a vocabulary of Llama 3's size for this run only
  vocab_dir="$(mktemp -d)"
  trap 'rm -rf "$vocab_dir"' EXIT
  VOCAB="$vocab_dir/bench_vocab_128k.tiktoken"
  python3 "$ROOT/scripts/bench/bench_vocab.py" "$VOCAB" >/dev/null
fi

# name | config | nodes | global batch | layout | published tok/s per GPU
RUNS=(
  "8B, 8 H100, bf16 eager|llama3_8b|1|16|dp_shard=8,local_batch=2,ac=selective,precision=bf16|5762"
  "8B, 8 H100, float8 + compile|llama3_8b|1|16|dp_shard=8,local_batch=2,ac=selective,precision=tensorwise|8532"
  "70B, 256 H100, float8, async TP|llama3_70b|32|512|dp_shard=32,tp=8,local_batch=16,ac=full,precision=tensorwise,async_tp=1|876"
  "405B, 512 H100, float8, async TP, 1F1B|llama3_405b|64|256|dp_shard=8,tp=8,pp=8,schedule=1F1B,microbatch=1,local_batch=32,ac=full,precision=tensorwise,async_tp=1|100"
  "405B, 512 H100, same, Interleaved1F1B|llama3_405b|64|256|dp_shard=8,tp=8,pp=8,schedule=Interleaved1F1B,microbatch=1,local_batch=32,ac=full,precision=tensorwise,async_tp=1|128"
  "Llama 3 paper, 405B, 8,192 H100|llama3_405b|1024|2048|dp_shard=64,tp=8,pp=16,schedule=Interleaved1F1B,microbatch=1,local_batch=32,ac=none,precision=bf16|177"
  "Llama 3 paper, 405B, 16,384 H100|llama3_405b|2048|2048|dp_shard=128,tp=8,pp=16,schedule=Interleaved1F1B,microbatch=1,local_batch=16,ac=none,precision=bf16|165"
)
predict() {  # config nodes global layout [extra keys...] -> "tokens/s per GPU|memory", or "failed: why|"
  local config=$1 nodes=$2 global=$3 layout=$4 out predicted
  shift 4
  out=$("$PLAN" --job.config_file "$ROOT/configs/$config.toml" --model.tokenizer_path "$VOCAB" \
    --plan.device h100 --plan.nodes "$nodes" --plan.gpus_per_node 8 \
    --plan.precisions bf16,tensorwise --plan.ac_modes none,selective,full \
    --training.global_batch_size "$global" --plan.explain "$layout" "$@" 2>&1) || true
  predicted=$(sed -n 's/^tokens\/s per GPU \([0-9.]*\),.*/\1/p' <<<"$out")
  # The memory estimate beside it (the busiest pipeline rank): "251.8 of 74.5 GiB, does NOT fit".
  memory=$(sed -n 's/.*memory \([0-9.]* of [0-9.]* GiB\) (the memory estimate.*/\1/p' <<<"$out")
  if grep -q 'does NOT fit' <<<"$out"; then memory="$memory, does NOT fit"; elif [[ -n "$memory" ]]; then memory="$memory, fits"; fi
  [[ -n "$predicted" ]] && echo "$predicted|$memory" || echo "failed: $(tail -1 <<<"$out")|"
}
ratio() { [[ $1 == failed* ]] && echo "-" || python3 -c "print(f'{$1 / $2:.2f}')"; }
printf '| run | layout | published tok/s/GPU | predicted (H100 SXM) | ratio | memory estimate (H100 SXM) | predicted (96 GB, 2.4 TB/s) | ratio |\n'
printf '|---|---|---|---|---|---|---|---|\n'
for run in "${RUNS[@]}"; do
  IFS='|' read -r name config nodes global layout published <<<"$run"
  IFS='|' read -r sxm sxm_memory <<<"$(predict "$config" "$nodes" "$global" "$layout")"
  if [[ $name == Llama* ]]; then hbm2e="" hbm2e_ratio=""; else
    IFS='|' read -r hbm2e _ <<<"$(predict "$config" "$nodes" "$global" "$layout" --plan.memory_gib 89.4 --plan.hbm_tbps 2.4)"
    hbm2e_ratio=$(ratio "$hbm2e" "$published")
  fi
  printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' "$name" "$layout" "$published" "$sxm" \
    "$(ratio "$sxm" "$published")" "$sxm_memory" "$hbm2e" "$hbm2e_ratio"
done
