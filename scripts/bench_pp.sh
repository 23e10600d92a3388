#!/usr/bin/env bash
# Pipeline schedules on CPU ranks (Gloo on 127.0.0.1): per schedule, the step time, each rank's
# measured idle fraction beside the schedule's theoretical bubble (from --job.print_pipeline_schedule,
# last step), and each stage's peak live tensor bytes; the peer in the same run is one process
# running the same micro-batches as gradient accumulation (no pipeline).
#
#   scripts/bench_pp.sh [BUILD_DIR] [extra --section.key overrides...]
#   PP=4 MICROBATCHES=8 scripts/bench_pp.sh
#
# Each rank runs one intra-op thread; on a machine with fewer cores than ranks, ranks share
# cores and the times say so. The first STEPS_WARMUP steps are excluded from the step time.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:-$ROOT/build}"
shift || true
PP="${PP:-2}"
STEPS="${STEPS:-6}"
STEPS_WARMUP="${STEPS_WARMUP:-2}"
SEQ_LEN="${SEQ_LEN:-128}"
MICROBATCHES="${MICROBATCHES:-8}"
OUT="${OUT:-$(mktemp -d /tmp/titan_bench_pp.XXXXXX)}"
mkdir -p "$OUT"
RUN="$BUILD/apps/titan-run"
TRAIN="$BUILD/apps/titan-train"
[[ -x "$RUN" && -x "$TRAIN" ]] || { echo "bench_pp.sh: build titan-run and titan-train in $BUILD first" >&2; exit 1; }

ARGS=(--training.seq_len "$SEQ_LEN" --training.global_batch_size "$MICROBATCHES" --training.steps "$STEPS"
      --lr_scheduler.warmup_steps 2 --metrics.log_freq 1 --training.num_threads 1 --metrics.peak_flops 1e12 "$@")

summarize() {  # name dump log ranks
  python3 - "$@" "$STEPS_WARMUP" <<'PY'
import json, os, re, sys
name, dump, log, ranks, warmup = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
files = ["metrics.jsonl"] if ranks == 1 else ["metrics_rank%d.jsonl" % r for r in range(ranks)]
times, peaks, loss = [], [], None
for f in files:
    rows = [json.loads(l) for l in open(os.path.join(dump, f))]
    times.append(sum(r["elapsed_s"] for r in rows[warmup:]) / max(1, len(rows) - warmup))
    peaks.append(max(r["memory_peak_bytes"] for r in rows) / 2**20)
    loss = rows[-1]["loss"]
idle, theory = {}, ""
for line in open(log):
    m = re.search(r"pipeline timeline, pp rank (\d+) .*idle ([\d.]+)% measured, bubble ([\d.]+)% in theory", line)
    if m: idle[int(m.group(1))] = m.group(2); theory = m.group(3) + "%"
idle_text = " / ".join(idle[r] + "%" for r in sorted(idle)) if idle else "-"
print("| %-22s | %5d | %8.1f | %-22s | %-8s | %-26s | %.6f |" % (
    name, ranks, 1e3 * max(times), idle_text, theory or "-", " / ".join("%.1f" % p for p in peaks), loss))
PY
}

echo "pipeline schedules, pp $PP, $MICROBATCHES micro-batches of 1 x $SEQ_LEN tokens per step, $(nproc) cores, $(date -u +%F)"
echo "| schedule               | ranks | step ms  | idle per rank (meas.)  | theory   | peak MiB per rank          | last loss |"
echo "|------------------------|-------|----------|------------------------|----------|----------------------------|-----------|"
dump="$OUT/single"
"$TRAIN" "${ARGS[@]}" --training.local_batch_size 1 --job.dump_folder "$dump" > "$dump.log" 2>&1
summarize "1 process (accumulation)" "$dump" "$dump.log" 1
for schedule in GPipe 1F1B Interleaved1F1B LoopedBFS InterleavedZeroBubble ZBVZeroBubble; do
  dump="$OUT/$schedule"
  "$RUN" --nproc-per-node "$PP" -- "$TRAIN" "${ARGS[@]}" --training.local_batch_size "$MICROBATCHES" \
    --parallelism.pipeline_parallel_degree "$PP" --parallelism.data_parallel_shard_degree 1 \
    --parallelism.pipeline_parallel_schedule "$schedule" --job.print_pipeline_schedule \
    --job.dump_folder "$dump" > "$dump.log" 2>&1 || { echo "| $schedule failed: see $dump.log"; continue; }
  summarize "$schedule" "$dump" "$dump.log" "$PP"
done
echo "logs: $OUT"
