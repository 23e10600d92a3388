#!/usr/bin/env bash
# Peak memory and tokens/s for each activation-checkpointing mode, high precision and (when the
# trainer has the [float8] keys) float8 rowwise / tensorwise, on the debug model and the 100M
# model. Prints a Markdown table (the one in docs/performance.md):
#   scripts/bench_memory.sh                 # both models
#   MODELS="debugmodel" STEPS=4 scripts/bench_memory.sh
# Environment: BUILD (build folder, default build), MODELS, STEPS (default 4; the row reports
# the last step's line), THREADS (intra-op threads, default 2), plus per-model batch shapes
# below. Memory = the tracked CPU allocator's peak of the last step (the log line's memory).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${BUILD:-$ROOT/build}"
TRAIN="$BUILD/apps/titan-train"
MODELS="${MODELS:-debugmodel 100M}"
STEPS="${STEPS:-4}"
THREADS="${THREADS:-2}"
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT

shape() {  # model -> batch/seq overrides
  case "$1" in
    debugmodel) echo "--training.local_batch_size 8 --training.seq_len 256" ;;
    100M) echo "--training.local_batch_size 2 --training.seq_len 512" ;;
  esac
}

# float8 variants only if this titan-train knows the keys.
PRECISIONS=("hp|")
if "$TRAIN" --help 2>/dev/null | grep -q "float8.recipe_name"; then
  PRECISIONS+=("float8 rowwise|--float8.enable_float8_linear --float8.recipe_name rowwise"
               "float8 tensorwise|--float8.enable_float8_linear --float8.recipe_name tensorwise")
else
  echo "note: titan-train has no [float8] keys yet: high precision only" >&2
fi
MODES=("none|--activation_checkpoint.mode none"
       "full|--activation_checkpoint.mode full"
       "every 2|--activation_checkpoint.mode selective --activation_checkpoint.selective_ac_option 2"
       "op|--activation_checkpoint.mode selective --activation_checkpoint.selective_ac_option op")

echo "| model | precision | AC | peak memory (GiB) | estimate (GiB) | tps |"
echo "|---|---|---|---:|---:|---:|"
for model in $MODELS; do
  for prec in "${PRECISIONS[@]}"; do
    for mode in "${MODES[@]}"; do
      # shellcheck disable=SC2046
      args=(--model.flavor "$model" $(shape "$model") --training.steps "$STEPS"
            --metrics.log_freq 1 --training.num_threads "$THREADS" --job.dump_folder "$OUT/run"
            --lr_scheduler.warmup_steps 1 ${mode#*|} ${prec#*|})
      rm -rf "$OUT/run"
      "$TRAIN" "${args[@]}" > "$OUT/log" 2>&1 || { echo "run failed: ${args[*]}" >&2; tail -5 "$OUT/log" >&2; continue; }
      est="$("$TRAIN" --estimate-memory "${args[@]}" | awk '/total \(peak\)/ {print $3}')"
      tail -1 "$OUT/run/metrics.jsonl" | EST="$est" M="$model" P="${prec%%|*}" A="${mode%%|*}" \
        python3 -c 'import json,os,sys; r=json.loads(sys.stdin.read());
print("| %s | %s | %s | %.3f | %s | %s |" % (os.environ["M"], os.environ["P"], os.environ["A"],
      r["memory_peak_bytes"]/2**30, os.environ["EST"], format(int(r["tps"]), ",")))'
    done
  done
done
