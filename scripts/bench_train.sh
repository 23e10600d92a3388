#!/usr/bin/env bash
# titan vs Python peers (same wheel, same threads, same model shapes and batch shape) on the CPU:
# steady-state tokens/s, time to first step, peak memory (resident set) and the share of the step
# spent in GEMMs, for the debug model and a ~100M model.
#   scripts/bench_train.sh [threads]
#   ENGINES="titan eager compile"            (default) the hand-written eager Llama
#                                            (scripts/bench/eager_llama.py), plain and torch.compile
#   ENGINES="titan torchtitan torchtitan_compile"   torchtitan 0.2.2's own Llama 3 Transformer
#                                            (scripts/bench/torchtitan_llama.py), eager and compiled
#                                            per TransformerBlock as torchtitan's apply_compile
#   DTYPE=float32 (default) | bfloat16 | "float32 bfloat16"   bfloat16: titan gets
#                                            --training.mixed_precision_param bfloat16, the Python
#                                            engines run forward + loss under torch.autocast
#   GEMM_SHARE=1 (default) | 0               profile one extra step per engine (titan: a separate
#                                            3-step run with --profiling.enable_profiling) and report
#                                            the GEMM share of its self CPU time (not for eager/compile)
#   BENCH_OUT=dir                            keep each engine's JSON line (with the top self-time
#                                            ops of the profiled step) and titan's logs there
#   TITAN_FLAGS="--section.key value ..."    extra overrides for titan's runs only, e.g.
#                                            "--training.cpu_float32_gemm onednn"
#   REPEAT=n (default 1)                     run every case's engines n times back to back, every
#                                            other round in reverse order (as bench_plan.sh's
#                                            REPEAT); each ratio is taken within a round and the
#                                            verdict is the median round's (this machine's speed
#                                            drifts by 10-20% between minutes: one round's 100M
#                                            ratio against the compiled peer read 1.02x, then
#                                            1.12x, then 0.96x); tok/s is each engine's median
# Time to first step: from process start to the end of the first optimizer step (Python: from
# before `import torch`; includes torch.compile's warm-up; titan: the process's wall time minus
# its timed steps, so it also counts titan's exit). Steady state: tokens/s over the timed steps
# after the warm-up steps (2; torch.compile: 3, its backward graph compiles in step 1).
# GEMM share: self time of aten::mm/addmm/bmm/baddbmm/matmul/linear over the self time of all CPU
# events of the profiled step (trace_gemm_share in scripts/bench/torchtitan_llama.py).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
THREADS="${1:-$(nproc)}"
ENGINES="${ENGINES:-titan eager compile}"
DTYPES="${DTYPE:-float32}"
GEMM_SHARE="${GEMM_SHARE:-1}"
REPEAT="${REPEAT:-1}"
[[ "$REPEAT" =~ ^[1-9][0-9]*$ ]] || { echo "bench_train.sh: REPEAT '$REPEAT': a whole number >= 1" >&2; exit 2; }
for engine in $ENGINES; do
  case "$engine" in
    titan | eager | compile | torchtitan | torchtitan_compile) ;;
    *) echo "bench_train.sh: unknown engine '$engine' in ENGINES (choose from: titan eager compile" \
            "torchtitan torchtitan_compile)" >&2; exit 2 ;;
  esac
done
for dtype in $DTYPES; do
  case "$dtype" in
    float32 | bfloat16) ;;
    *) echo "bench_train.sh: DTYPE '$dtype': choose float32 or bfloat16" >&2; exit 2 ;;
  esac
done
"$ROOT/scripts/setup.sh" >/dev/null
PY="$ROOT/.deps/venv/bin/python"
TRAIN="$ROOT/build/apps/titan-train"
BENCH="$ROOT/scripts/bench"
if [[ -n "${BENCH_OUT:-}" ]]; then  # keep the per-engine JSON lines (top self-time ops) and logs
  OUT="$BENCH_OUT"; mkdir -p "$OUT"
else
  OUT="$(mktemp -d)"; trap 'rm -rf "$OUT"' EXIT
fi

if [[ " $ENGINES " == *" torchtitan"* ]]; then source "$ROOT/scripts/bench/install_torchtitan.sh"; fi

# name flavor batch seq_len timed_steps
CASES=("debug debugmodel 4 128 30" "100M 100M 2 256 8")

for dtype in $DTYPES; do
for c in "${CASES[@]}"; do
  read -r name flavor batch seq steps <<<"$c"
  for round in $(seq 1 "$REPEAT"); do  # (body not indented: its heredocs end at column 0)
  order=($ENGINES)
  if (( round % 2 == 0 )); then rev=(); for e in "${order[@]}"; do rev=("$e" "${rev[@]}"); done; order=("${rev[@]}"); fi
  for engine in "${order[@]}"; do
    warmup=2
    res="$OUT/$name.$dtype.$engine.r$round.json"
    case "$engine" in
      titan)
        titan_flags=(--model.flavor "$flavor" --training.local_batch_size "$batch" --training.seq_len "$seq"
                     --training.num_threads "$THREADS" --training.mixed_precision_param "$dtype"
                     --metrics.log_freq 1 --metrics.peak_flops 1e12 ${TITAN_FLAGS:-})
        start=$(date +%s.%N)
        "$TRAIN" "${titan_flags[@]}" --training.steps $((steps + warmup)) --job.dump_folder "$OUT/$name.$dtype.r$round" \
          >"$OUT/$name.$dtype.r$round.log" 2>&1 || { cat "$OUT/$name.$dtype.r$round.log" >&2; exit 1; }
        end=$(date +%s.%N)
        "$PY" - "$OUT/$name.$dtype.r$round/metrics.jsonl" "$warmup" "$start" "$end" >"$res" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
warmup, wall = int(sys.argv[2]), float(sys.argv[4]) - float(sys.argv[3])
timed = [r for r in rows if r["step"] > warmup]
after_first = sum(r["elapsed_s"] for r in rows if r["step"] > 1)
print(json.dumps({"tps": sum(r["tokens"] for r in timed) / sum(r["elapsed_s"] for r in timed),
                  "first_step_s": wall - after_first, "peak_rss_bytes": rows[-1]["peak_rss_bytes"]}))
PY
        if [[ "$GEMM_SHARE" == 1 && "$round" == 1 ]]; then
          # A separate run (so the trace export costs neither the timing nor the first step): the
          # step after the warm-up steps traced, as torch.profiler's schedule (1 warmup, 1 active).
          prof="$OUT/$name.$dtype.prof"
          "$TRAIN" "${titan_flags[@]}" --training.steps $((warmup + 1)) --job.dump_folder "$prof" \
            --profiling.enable_profiling true --profiling.profile_freq $((warmup + 1)) \
            --profiling.profiler_warmup 1 --profiling.profiler_active 1 \
            >"$prof.log" 2>&1 || { cat "$prof.log" >&2; exit 1; }
          trace="$(find "$prof" -name 'rank0_trace.json' | head -1)"
          [[ -n "$trace" ]] || { echo "bench_train.sh: titan wrote no profiler trace in $prof" >&2; exit 1; }
          "$PY" "$BENCH/torchtitan_llama.py" --gemm-share-of-trace "$trace" >"$prof.json"
          "$PY" - "$res" "$prof.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); r.update(json.load(open(sys.argv[2])))
json.dump(r, open(sys.argv[1], "w"))
PY
        fi
        ;;
      eager | compile | torchtitan | torchtitan_compile)
        script="$BENCH/eager_llama.py"; flags=()
        [[ "$engine" == torchtitan* ]] && script="$BENCH/torchtitan_llama.py"
        if [[ "$engine" == torchtitan* && ( "$GEMM_SHARE" != 1 || "$round" != 1 ) ]]; then flags+=(--no-profile); fi
        if [[ "$engine" == *compile ]]; then flags+=(--compile); warmup=3; fi
        OMP_NUM_THREADS=$THREADS "$PY" "$script" --flavor "$flavor" --dtype "$dtype" \
          --batch "$batch" --seq-len "$seq" --steps "$steps" --warmup "$warmup" --threads "$THREADS" \
          "${flags[@]}" 2>"$OUT/$name.$dtype.$engine.r$round.err" >"$res" ||
          { cat "$OUT/$name.$dtype.$engine.r$round.err" >&2; exit 1; }
        ;;
    esac
  done
  done
done
done

"$PY" - "$OUT" "$THREADS" "$ENGINES" "$DTYPES" "$REPEAT" "${CASES[@]}" <<'PY'
import json, os, statistics, sys
out, threads, engines, dtypes, rounds, cases = (sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4].split(),
                                                int(sys.argv[5]), sys.argv[6:])
peers = [e for e in engines if e != "titan"]
print(f"threads: {threads}, rounds: {rounds} (tok/s: each engine's median round; ratios: the median of the rounds' "
      "ratios, each within one round)")
print("| case | dtype | engine | tok/s | " + "".join(f"vs {p} | " for p in peers)
      + "first step s | peak RSS GiB | GEMM share |")
print("|---|---|---|---|" + "---|" * len(peers) + "---|---|---|")
verdicts = []
for dtype in dtypes:
    for c in cases:
        name = c.split()[0]
        res = {e: [json.load(open(os.path.join(out, f"{name}.{dtype}.{e}.r{r}.json"))) for r in range(1, rounds + 1)]
               for e in engines}
        def ratio(a, b):  # median over rounds of a's tok/s over b's, and the range when rounds > 1
            each = [x["tps"] / y["tps"] for x, y in zip(res[a], res[b])]
            return statistics.median(each), each
        for e in engines:
            first = res[e][0]
            ratios = ""
            for p in peers:
                med, each = ratio(e, p)
                ratios += f"{med:.2f}x" + (f" ({min(each):.2f}-{max(each):.2f})" if rounds > 1 else "") + " | "
            share = first.get("gemm_share")
            share = f"{100 * share:.1f}%" if share is not None else "n/a"
            tps = statistics.median(r["tps"] for r in res[e])
            print(f"| {name} | {dtype} | {e} | {tps:,.0f} | {ratios}{first['first_step_s']:.1f} | "
                  f"{max(r['peak_rss_bytes'] for r in res[e]) / 2**30:.3f} | {share} |")
        if "titan" in res:
            for p in peers:
                if p.startswith("torchtitan"):
                    x, each = ratio("titan", p)
                    spread = f", rounds {' '.join(f'{v:.2f}' for v in each)}" if rounds > 1 else ""
                    verdicts.append(f"{name} {dtype}: titan / {p} = {x:.2f}x{spread} "
                                    f"({'meets' if x >= 1.1 else 'MISSES'} the 1.1x target)")
for v in verdicts:
    print(v)
PY
