#!/usr/bin/env bash
# titan vs plain PyTorch eager (Python, same wheel, same threads, same model and batch shape):
# tokens/s and peak memory (resident set) for the debug model and a ~100M model on the CPU.
#   scripts/bench_train.sh [threads]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
THREADS="${1:-$(nproc)}"
"$ROOT/scripts/setup.sh" >/dev/null
PY="$ROOT/.deps/venv/bin/python"
TRAIN="$ROOT/build/apps/titan-train"
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT

# name flavor batch seq_len timed_steps
CASES=("debug debugmodel 4 128 30" "100M 100M 2 256 8")

printf '%-8s %-8s %14s %14s %8s %14s %14s %8s\n' case threads "titan tok/s" "eager tok/s" ratio \
  "titan peakRSS" "eager peakRSS" "mem"
for c in "${CASES[@]}"; do
  read -r name flavor batch seq steps <<<"$c"
  warmup=2
  total=$((steps + warmup))
  "$TRAIN" --model.flavor "$flavor" --training.local_batch_size "$batch" --training.seq_len "$seq" \
    --training.steps "$total" --training.num_threads "$THREADS" --metrics.log_freq 1 \
    --metrics.peak_flops 1e12 --job.dump_folder "$OUT/$name" >"$OUT/$name.log" 2>&1
  titan="$("$PY" - "$OUT/$name/metrics.jsonl" "$warmup" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
timed = [r for r in rows if r["step"] > int(sys.argv[2])]
print(sum(r["tokens"] for r in timed) / sum(r["elapsed_s"] for r in timed), rows[-1]["peak_rss_bytes"])
PY
)"
  eager="$(OMP_NUM_THREADS=$THREADS "$PY" "$ROOT/scripts/bench/eager_llama.py" --flavor "$flavor" \
    --batch "$batch" --seq-len "$seq" --steps "$steps" --warmup "$warmup" --threads "$THREADS")"
  "$PY" - "$name" "$THREADS" "$titan" "$eager" <<'PY'
import json, sys
name, threads, titan, eager = sys.argv[1], sys.argv[2], sys.argv[3].split(), json.loads(sys.argv[4])
t_tps, t_rss = float(titan[0]), int(titan[1])
gib = lambda b: f"{b / 2**30:.3f} GiB"
print(f"{name:<8} {threads:<8} {t_tps:14,.0f} {eager['tps']:14,.0f} {t_tps / eager['tps']:7.2f}x "
      f"{gib(t_rss):>14} {gib(eager['peak_rss_bytes']):>14} {t_rss / eager['peak_rss_bytes']:7.2f}x")
PY
done
