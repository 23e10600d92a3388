#!/usr/bin/env bash
# The layout planner against measured step times on this machine: titan-plan (plan.device cpu:
# this machine's probes) lists every layout of the debug model that fits on NPROC CPU ranks; each
# is run for STEPS steps through titan-run (Gloo on 127.0.0.1) and its step time measured (mean
# of the steps after STEPS_WARMUP, slowest rank). Prints one row per layout (predicted and
# measured ms) and the planner's Kendall tau, its first choice's measured time against the
# measured best, and the mean absolute error of its predictions.
#
#   scripts/bench_plan.sh [BUILD_DIR] [extra --section.key overrides for both...]
#   NPROC=4 scripts/bench_plan.sh
#   REUSE=/tmp/titan_bench_plan.abc123 scripts/bench_plan.sh   # a new planner against old runs
#
# REPEAT=n runs the whole list n times, every other pass in reverse order, and takes each
# layout's fastest pass (this machine's step times move by ~10% from one run of a layout to the
# next, and a one-off slow run decided first choices: 745 ms measured once, 564 and 613 when run
# again); passes.tsv keeps every pass.
#
# REUSE names an earlier run's OUT folder: a layout measured there (same NPROC, GLOBAL, STEPS and
# overrides) is not run again, only predicted again; the measured times are the trainer's and do
# not depend on the planner, so a change to the step-time model is scored in the planner's time.
#
# SAMPLE=k runs the planner's first 5 layouts and every k-th one after them (by predicted rank),
# for models whose whole list takes hours here (the 100M model's 172 layouts on 4 ranks: ~2 h);
# the tau is then over the sample, and "measured best" is the best of the sample.
#
# The search is narrowed to what a few minutes allow: no gradient accumulation (local batch =
# the global batch's share), one-row pipeline micro-batches, AC none and full; every degree
# product, schedule and CP method is kept.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:-$ROOT/build}"
shift || true
NPROC="${NPROC:-2}"
STEPS="${STEPS:-8}"
STEPS_WARMUP="${STEPS_WARMUP:-3}"
REPEAT="${REPEAT:-1}"
SAMPLE="${SAMPLE:-1}"
[[ "$SAMPLE" =~ ^[1-9][0-9]*$ ]] || { echo "bench_plan.sh: SAMPLE '$SAMPLE': a whole number >= 1" >&2; exit 2; }
GLOBAL="${GLOBAL:-8}"
OUT="${OUT:-$(mktemp -d /tmp/titan_bench_plan.XXXXXX)}"
mkdir -p "$OUT"
RUN="$BUILD/apps/titan-run" TRAIN="$BUILD/apps/titan-train" PLAN="$BUILD/apps/titan-plan"
[[ -x "$RUN" && -x "$TRAIN" && -x "$PLAN" ]] || { echo "bench_plan.sh: build titan-run, titan-train and titan-plan in $BUILD first" >&2; exit 1; }
JOB=(--training.seq_len 256 --training.global_batch_size "$GLOBAL" --training.num_threads 1 "$@")

"$PLAN" "${JOB[@]}" --plan.device cpu --plan.gpus_per_node "$NPROC" --plan.ac_modes none,full \
  --plan.top 10000 --plan.exhaustive true >"$OUT/plan.txt" 2>/dev/null
python3 - "$OUT/plan.txt" "$GLOBAL" "$SAMPLE" >"$OUT/layouts.tsv" <<'PY'
import re, sys
plan, glob, sample = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
kept = 0
for line in open(plan):
    m = re.match(r"\s*\d+\s+([\d.]+)\s+\d+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+(\S+)$", line)
    if not m: continue
    layout = dict(kv.split("=") for kv in m.group(2).split(","))
    dp = int(layout["dp_replicate"]) * int(layout["dp_shard"])
    if int(layout["local_batch"]) != glob // dp: continue               # no gradient accumulation
    if layout.get("microbatch", "1") != "1": continue                   # one-row micro-batches
    if layout.get("async_tp", "0") == "1": continue                     # async TP: one of the two
    kept += 1
    if kept > 5 and (kept - 6) % sample != 0: continue                  # SAMPLE: the top 5, then every k-th
    print(m.group(1), m.group(2), sep="\t")
PY
echo "planner: $(wc -l <"$OUT/layouts.tsv") layouts to run on $NPROC ranks (of $(grep -c '^ *[0-9]' "$OUT/plan.txt") that fit)"

rm -f "$OUT/passes.tsv"
for pass in $(seq 1 "$REPEAT"); do
  if (( pass % 2 == 0 )); then order=(tac); else order=(cat); fi
  while IFS=$'\t' read -r i predicted layout; do
    args=()
    IFS=',' read -ra kvs <<<"$layout"
    declare -A L=()
    for kv in "${kvs[@]}"; do L[${kv%%=*}]=${kv#*=}; done
    args+=(--parallelism.data_parallel_replicate_degree "${L[dp_replicate]}" --parallelism.data_parallel_shard_degree "${L[dp_shard]}"
           --parallelism.tensor_parallel_degree "${L[tp]}" --parallelism.context_parallel_degree "${L[cp]}"
           --parallelism.pipeline_parallel_degree "${L[pp]}" --training.local_batch_size "${L[local_batch]}"
           --activation_checkpoint.mode "${L[ac]}")
    [[ -n "${L[schedule]:-}" ]] && args+=(--parallelism.pipeline_parallel_schedule "${L[schedule]}" --parallelism.pipeline_parallel_microbatch_size "${L[microbatch]}"
                                           --parallelism.pipeline_parallel_stage_balance "${L[split]:-layers}")
    [[ -n "${L[cp_method]:-}" ]] && args+=(--parallelism.context_parallel_rotate_method "${L[cp_method]}")
    dump="$OUT/run$i.$pass"
    if [[ -n "${REUSE:-}" ]] && measured=$(awk -F'\t' -v l="$layout" '$3 == l { print $2; found = 1; exit } END { exit !found }' "$REUSE/results.tsv"); then
      :
    elif OMP_NUM_THREADS=1 "$RUN" --nproc-per-node "$NPROC" -- "$TRAIN" "${JOB[@]}" "${args[@]}" --training.steps "$STEPS" \
         --lr_scheduler.warmup_steps 2 --metrics.log_freq 1 --job.dump_folder "$dump" >"$dump.log" 2>&1; then
      measured=$(python3 - "$dump" "$NPROC" "$STEPS_WARMUP" <<'PY'
import json, os, sys
dump, n, warm = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
best = 0.0
for r in range(n):
    f = os.path.join(dump, "metrics_rank%d.jsonl" % r)
    if not os.path.exists(f): continue
    rows = [json.loads(l) for l in open(f)][warm:]
    if rows: best = max(best, sum(x["elapsed_s"] for x in rows) / len(rows))
print("%.1f" % (1e3 * best))
PY
  )
    else
      measured=FAILED
    fi
    printf '%s\t%s\t%s\t%s\n' "$pass" "$predicted" "$measured" "$layout" | tee -a "$OUT/passes.tsv"
  done < <(awk -F'\t' '{ print NR "\t" $0 }' "$OUT/layouts.tsv" | "${order[@]}")
done
# Each layout's fastest pass (FAILED only if every pass failed), in the list's order.
python3 - "$OUT/passes.tsv" "$OUT/layouts.tsv" >"$OUT/results.tsv" <<'PY'
import sys
best = {}
for line in open(sys.argv[1]):
    _, predicted, measured, layout = line.rstrip("\n").split("\t")
    if measured != "FAILED":
        best[layout] = min(best.get(layout, float("inf")), float(measured))
for line in open(sys.argv[2]):
    predicted, layout = line.rstrip("\n").split("\t")
    print(predicted, "%.1f" % best[layout] if layout in best else "FAILED", layout, sep="\t")
PY

python3 - "$OUT/results.tsv" <<'PY'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
ok = [(float(p), float(m), name) for p, m, name in rows if m != "FAILED"]
failed = [name for p, m, name in rows if m == "FAILED"]
n = len(ok)
concordant = discordant = 0
for i in range(n):
    for j in range(i + 1, n):
        s = (ok[i][0] - ok[j][0]) * (ok[i][1] - ok[j][1])
        concordant += s > 0
        discordant += s < 0
tau = (concordant - discordant) / max(1, n * (n - 1) / 2)
first = min(ok, key=lambda r: r[0])
best = min(ok, key=lambda r: r[1])
mae = sum(abs(p - m) / m for p, m, _ in ok) / max(1, n)
print("\n| layouts run | failed | Kendall tau | planner's first choice, measured | measured best | gap | mean abs. error |")
print("|---|---|---|---|---|---|---|")
print("| %d | %d | %.2f | %.1f ms | %.1f ms | %+.1f%% | %.0f%% |" % (n, len(failed), tau, first[1], best[1],
      100 * (first[1] / best[1] - 1), 100 * mae))
print("first choice: %s\nmeasured best: %s" % (first[2], best[2]))
for name in failed: print("FAILED (the planner said it fits): " + name)
PY
echo "logs: $OUT"
