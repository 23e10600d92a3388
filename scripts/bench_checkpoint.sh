#!/usr/bin/env bash
# Checkpoint cost on the CPU, one process: save time (sync, and async's blocking part + its
# background write), the step-time overhead of a save (the step after a sync save; the steps
# that run beside an async write), load (resume) time, and bytes written per checkpoint, for the
# debug and ~100M models.
#   scripts/bench_checkpoint.sh [threads]     (default: all cores; writes under a temp folder)
# TITAN_BENCH_CASE=debug|100M runs one case. TITAN_BENCH_DIR=DIR puts the checkpoints there instead (e.g. a real disk rather than tmpfs).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
THREADS="${1:-$(nproc)}"
PY="$ROOT/.deps/venv/bin/python"
TRAIN="$ROOT/build/apps/titan-train"
[ -x "$TRAIN" ] || TITAN_BUILD_TARGET=titan-train "$ROOT/scripts/setup.sh" >/dev/null
OUT="${TITAN_BENCH_DIR:-$(mktemp -d)}"
mkdir -p "$OUT"
[ -n "${TITAN_BENCH_DIR:-}" ] || trap 'rm -rf "$OUT"' EXIT

# name flavor batch seq_len steps interval
CASES=("debug debugmodel 4 128 16 4" "100M 100M 2 256 10 3")

printf '%-6s %-9s %14s %8s %11s %9s %12s %8s %10s\n' case mode "bytes" "step s" "blocking s" \
  "write s" "overhead s" "load s" "load GB/s"
for c in "${CASES[@]}"; do
  read -r name flavor batch seq steps interval <<<"$c"
  [ -z "${TITAN_BENCH_CASE:-}" ] || [ "$name" = "$TITAN_BENCH_CASE" ] || continue
  # The same run without checkpoints: the step times a save's overhead is measured against.
  "$TRAIN" --model.flavor "$flavor" --training.local_batch_size "$batch" --training.seq_len "$seq" \
    --training.steps "$steps" --training.num_threads "$THREADS" --metrics.log_freq 1 \
    --metrics.peak_flops 1e12 --job.dump_folder "$OUT/$name-none" >"$OUT/$name-none.log" 2>&1
  for mode in disabled async; do
    run="$OUT/$name-$mode"
    args=(--model.flavor "$flavor" --training.local_batch_size "$batch" --training.seq_len "$seq"
          --training.steps "$steps" --training.num_threads "$THREADS" --metrics.log_freq 1
          --metrics.peak_flops 1e12 --checkpoint.enable_checkpoint --checkpoint.interval "$interval"
          --checkpoint.last_save_model_only false --checkpoint.keep_latest_k 2 --checkpoint.async_mode "$mode" --job.dump_folder "$run")
    "$TRAIN" "${args[@]}" >"$run.log" 2>&1
    # Every save is a full checkpoint (the last too: last_save_model_only false), so each row's
    # bytes are one checkpoint's. Resume from the next-to-last one (load time), in a copy of the folder.
    last="$(ls -d "$run"/checkpoint/step-* | sort -t- -k2 -n | head -1)"
    mkdir -p "$run-resume/checkpoint" && cp -r "$last" "$run-resume/checkpoint/"
    "$TRAIN" "${args[@]}" --job.dump_folder "$run-resume" --training.steps "$(( ${last##*-} + 1 ))" \
      >"$run-resume.log" 2>&1
    "$PY" - "$name" "$mode" "$run" "$OUT/$name-none" "$run-resume.log" <<'PY'
import json, re, statistics, sys
name, mode, run, none, resume_log = sys.argv[1:6]
log = open(run + ".log").read()
steps = {r["step"]: r["elapsed_s"] for r in map(json.loads, open(run + "/metrics.jsonl"))}
plain = {r["step"]: r["elapsed_s"] for r in map(json.loads, open(none + "/metrics.jsonl"))}
saved = {int(s) for s in re.findall(r"checkpoint: step (\d+) (?:saved|staged)", log)}
blocking = [float(x) for x in re.findall(r"(?:saved|staged) in ([0-9.]+) s of training time", log)]
write = [float(x) for x in re.findall(r"written and committed in ([0-9.]+) s", log)]
nbytes = [int(x) for x in re.findall(r"saved \S+ \((\d+) bytes", log)]
# A save after step k lands in step k+1's time, an async write in the steps it runs beside: the
# cost per save is the extra time of steps 3..N over the run without checkpoints, divided by the
# saves made before the last step (the last one is waited for at exit, after the last step).
base = statistics.median(t for s, t in plain.items() if s > 2)
inner = [k for k in saved if 2 <= k < max(steps)]
extra = sum(steps[s] - plain[s] for s in steps if s > 2)
m = re.search(r"\((\d+) bytes read by this rank in ([0-9.]+) s\)", open(resume_log).read())
load_s = float(m.group(2)) if m else float("nan")
load_gbs = int(m.group(1)) / load_s / 1e9 if m else float("nan")
over = extra / len(inner) if inner else float("nan")
print(f"{name:<6} {mode:<9} {statistics.mean(nbytes):14,.0f} {base:8.3f} {statistics.mean(blocking):11.3f} "
      f"{statistics.mean(write):9.3f} {over:12.3f} {load_s:8.3f} {load_gbs:10.2f}")
PY
  done
done
echo "bytes: one checkpoint (masters + AdamW moments + state); step s: median step without a save;"
echo "blocking s: training time a save takes (sync: all of it; async: the copy to host memory);"
echo "write s: safetensors + CRC + fsync + commit; overhead s: training time added per save (steps 3..N vs the"
echo "same run without checkpoints); load s: resume from the next-to-last checkpoint (this rank's reads)."
