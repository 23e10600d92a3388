#!/usr/bin/env bash
# Context parallelism on CPU ranks (Gloo on 127.0.0.1): per sequence length and rotate method, the
# step time, tokens/s of the whole job, and each rank's peak live tensor bytes at CP 1 / 2 / 4; the
# peer in the same run is one process training the same sequence (CP 1).
#
#   scripts/bench_cp.sh [BUILD_DIR] [extra --section.key overrides...]
#   SEQ_LENS="2048 8192" CPS="2 4" METHODS="alltoall titan_ulysses" scripts/bench_cp.sh
#
# One row of SEQ_LEN tokens per step, debugmodel, no activation checkpointing. Each rank runs one
# intra-op thread; with more ranks than cores the ranks share cores (the table prints the core
# count): the CPU rows measure memory and correctness at scale, and the ring's compute overhead,
# not a speed-up. The first STEPS_WARMUP steps are excluded from the step time.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:-$ROOT/build}"
shift || true
SEQ_LENS="${SEQ_LENS:-1024 4096}"
CPS="${CPS:-2 4}"
METHODS="${METHODS:-allgather alltoall titan_ulysses}"
STEPS="${STEPS:-3}"
STEPS_WARMUP="${STEPS_WARMUP:-1}"
OUT="${OUT:-$(mktemp -d /tmp/titan_bench_cp.XXXXXX)}"
mkdir -p "$OUT"
RUN="$BUILD/apps/titan-run"
TRAIN="$BUILD/apps/titan-train"
[[ -x "$RUN" && -x "$TRAIN" ]] || { echo "bench_cp.sh: build titan-run and titan-train in $BUILD first" >&2; exit 1; }

summarize() {  # name seq cp dump
  python3 - "$@" "$STEPS_WARMUP" <<'PY'
import json, os, sys
name, seq, cp, dump, warmup = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
files = ["metrics.jsonl"] if cp == 1 else ["metrics_rank%d.jsonl" % r for r in range(cp)]
times, peaks, loss = [], [], None
for f in files:
    rows = [json.loads(l) for l in open(os.path.join(dump, f))]
    times.append(sum(r["elapsed_s"] for r in rows[warmup:]) / max(1, len(rows) - warmup))
    peaks.append(max(r["memory_peak_bytes"] for r in rows) / 2**20)
    loss = rows[-1]["loss"]
step = max(times)
print("| %6d | %-14s | %3d | %9.0f | %8.0f | %9.1f | %.6f |" % (seq, name, cp, 1e3 * step, seq / step, max(peaks), loss))
PY
}

echo "context parallelism, debugmodel, 1 x SEQ_LEN tokens per step, no AC, $(nproc) cores, $(date -u +%F)"
echo "| seq    | method         | cp  | step ms   | tokens/s | peak MiB  | last loss |"
echo "|--------|----------------|-----|-----------|----------|-----------|-----------|"
for seq in $SEQ_LENS; do
  ARGS=(--training.seq_len "$seq" --training.local_batch_size 1 --training.steps "$STEPS" --lr_scheduler.warmup_steps 2
        --metrics.log_freq 1 --training.num_threads 1 --training.seed 3 "$@")
  dump="$OUT/seq${seq}_cp1"
  "$TRAIN" "${ARGS[@]}" --job.dump_folder "$dump" > "$dump.log" 2>&1 || { echo "| $seq cp 1 failed: see $dump.log"; continue; }
  summarize "one process" "$seq" 1 "$dump"
  for cp in $CPS; do
    for method in $METHODS; do
      dump="$OUT/seq${seq}_cp${cp}_$method"
      "$RUN" --nproc-per-node "$cp" -- "$TRAIN" "${ARGS[@]}" --parallelism.context_parallel_degree "$cp" \
        --parallelism.context_parallel_rotate_method "$method" --job.dump_folder "$dump" > "$dump.log" 2>&1 ||
        { echo "| $seq $method cp $cp failed: see $dump.log"; continue; }
      summarize "$method" "$seq" "$cp" "$dump"
    done
  done
done
echo "logs: $OUT"
