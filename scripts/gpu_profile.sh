#!/usr/bin/env bash
# One traced step of the 8B-shaped run (8B_4layers, seq_len 8192, per-op AC) per recipe on a GPU,
# to see where titan's step goes (scripts/bench/trace_summary.py reads the traces here):
#   scripts/gpu_profile.sh --bundle DIR --out DIR [RECIPE ...]    (default: bf16 tensorwise)
# RECIPE: bf16 or a float8 recipe name. Writes OUT/<recipe>_trace.json.gz and OUT/<recipe>.log.
# Also runs, first, the [cuda] cases of the bundled tests when TESTS=1 (OUT/test_*.log) and one
# traced linear per float8 recipe at M=K=N=8192 when LINEAR=1 (titan-bench-linear --trace:
# OUT/linear.log, OUT/linear_<recipe>.json.gz); last, the eager PyTorch baseline on the same
# shapes when EAGER=1 (OUT/eager.json).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUNDLE="" OUT=""
while (($#)); do
  case "$1" in
    --bundle) BUNDLE="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    *) break ;;
  esac
done
[[ -n "$BUNDLE" && -n "$OUT" ]] || { echo "gpu_profile: --bundle DIR --out DIR are required" >&2; exit 2; }
RECIPES=("$@"); ((${#RECIPES[@]})) || RECIPES=(bf16 tensorwise)
# shellcheck source=scripts/gpu_env.sh
source "$ROOT/scripts/gpu_env.sh" "$BUNDLE" || exit 2
B="$BUNDLE/bin"
mkdir -p "$OUT"
if [[ "${TESTS:-0}" == 1 ]]; then
  for t in test_float8 test_model test_trainer; do
    "$B/$t" "[cuda]" >"$OUT/$t.log" 2>&1
    echo "$t [cuda]: rc $?"; tail -2 "$OUT/$t.log"
  done
fi
if [[ "${LINEAR:-0}" == 1 ]]; then
  "$B/titan-bench-linear" --device cuda --tokens 8192 --dims 8192 --skip-block-scaled --trace "$OUT" \
    >"$OUT/linear.log" 2>&1
  echo "titan-bench-linear: rc $?"; cat "$OUT/linear.log"
  for f in "$OUT"/linear_*.json; do [[ -f "$f" ]] && gzip -f "$f"; done
fi
WORK="$(mktemp -d /tmp/titan-gpu-profile.XXXXXX)"
for recipe in "${RECIPES[@]}"; do
  f8=()
  [[ $recipe != bf16 ]] && f8=(--float8.enable_float8_linear --float8.recipe_name "$recipe")
  "$B/titan-train" --job.config_file "$BUNDLE/configs/llama3_8b.toml" --training.dataset fortunes \
    --training.dataset_path "$BUNDLE/data/fortunes" --model.flavor 8B_4layers \
    --model.tokenizer_path "$BUNDLE/data/bench_vocab_128k.tiktoken" --training.steps 10 \
    --lr_scheduler.warmup_steps 2 --metrics.log_freq 1 --profiling.enable_profiling \
    --profiling.profile_freq 10 --profiling.profiler_warmup 1 --profiling.profiler_active 1 \
    --job.dump_folder "$WORK/$recipe" "${f8[@]}" >"$OUT/$recipe.log" 2>&1
  echo "$recipe: rc $?"; grep "step:" "$OUT/$recipe.log" | sed -n "4,10p" | sed "s/.*step:/step:/"
  trace=$(ls "$WORK/$recipe"/*/iteration_*/rank0_trace.json 2>/dev/null | head -1)
  [[ -n "$trace" ]] && gzip -c "$trace" >"$OUT/${recipe}_trace.json.gz"
done
if [[ "${EAGER:-0}" == 1 ]]; then
  PYTHONUNBUFFERED=1 "$TITAN_PY" "$ROOT/scripts/bench/eager_llama.py" --device cuda --dtype bfloat16 \
    --flavor 8B_4layers --vocab 128256 --batch 1 --seq-len 8192 --ac op --steps 5 --warmup 3 --threads 8 \
    >"$OUT/eager.json" 2>"$OUT/eager.log"
  echo "eager: rc $?"; cat "$OUT/eager.json"
fi
ls -la "$OUT"
