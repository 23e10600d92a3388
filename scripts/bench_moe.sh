#!/usr/bin/env bash
# Mixture-of-experts training on the CPU: titan in one process and under expert parallelism 2 (two
# ranks on this machine, Gloo on 127.0.0.1) against torchtitan 0.2.2's own Qwen3-MoE and
# DeepSeek-V3 models in PyTorch eager (scripts/bench/torchtitan_qwen3_moe.py,
# scripts/bench/torchtitan_deepseek_v3.py), same shapes, same batch, same threads.
#   scripts/bench_moe.sh [threads]
# Cases: torchtitan's debugmodel_moe (8 layers, 64 experts, top 8; 315M parameters, ~52M active)
# and titan's moe_100M_active (14 layers, 8 experts, top 2; 364M parameters, ~103M active);
# DeepSeek-V3's titan debugmodel_small (latent attention, a dense block then 3 MoE blocks of 8
# experts, top 2 of a group-limited sigmoid router; 1.1M parameters) and torchtitan's debugmodel.
#   CASES_FILTER=regex   run only the cases whose name matches
# Columns: whole-job tokens/s over the timed steps (after WARMUP steps), seconds per step, peak
# resident set per process (EP 2: the larger rank's), the share of the step blocked in collectives
# (comm_exposed_s) and the share in the expert-parallel all-to-alls (titan's metrics.jsonl
# comm_s_by_dim["ep"]; they are waited for as issued), and
# the torchtitan peer's grouped-GEMM experts (torch._grouped_mm, torchtitan's GPU default) next to
# its per-expert loop (titan's CPU form). EP 2 runs each rank with threads / 2 intra-op threads,
# so the job uses the same cores as one process.
#   STEPS=3 WARMUP=1 (defaults; the torchtitan peer needs minutes per debugmodel_moe step here)
#   ENGINES="titan titan_ep2 torchtitan torchtitan_grouped" (default)
#   BENCH_OUT=dir   keep the logs and JSON lines there
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
THREADS="${1:-$(nproc)}"
STEPS="${STEPS:-3}"
WARMUP="${WARMUP:-1}"
ENGINES="${ENGINES:-titan titan_ep2 torchtitan torchtitan_grouped}"
for engine in $ENGINES; do
  case "$engine" in
    titan | titan_ep2 | torchtitan | torchtitan_grouped) ;;
    *) echo "bench_moe.sh: unknown engine '$engine' in ENGINES (choose from: titan titan_ep2 torchtitan" \
            "torchtitan_grouped)" >&2; exit 2 ;;
  esac
done
"$ROOT/scripts/setup.sh" >/dev/null
PY="$ROOT/.deps/venv/bin/python"
TRAIN="$ROOT/build/apps/titan-train"
RUN="$ROOT/build/apps/titan-run"
if [[ -n "${BENCH_OUT:-}" ]]; then
  OUT="$BENCH_OUT"; mkdir -p "$OUT"
else
  OUT="$(mktemp -d)"; trap 'rm -rf "$OUT"' EXIT
fi
if [[ " $ENGINES " == *" torchtitan"* ]]; then source "$ROOT/scripts/bench/install_torchtitan.sh"; fi

# name family flavor batch seq_len
ALL_CASES=("debugmodel_moe qwen3 debugmodel_moe 4 128" "100M-active qwen3 moe_100M_active 2 256"
           "ds3_debugmodel_small deepseek_v3 debugmodel_small 8 128" "ds3_debugmodel deepseek_v3 debugmodel 4 128")
CASES=()
for c in "${ALL_CASES[@]}"; do [[ "${c%% *}" =~ ${CASES_FILTER:-.} ]] && CASES+=("$c"); done

for c in "${CASES[@]}"; do
  read -r name family flavor batch seq <<<"$c"
  for engine in $ENGINES; do
    res="$OUT/$name.$engine.json"
    echo "[bench] $name $engine" >&2
    case "$engine" in
      titan | titan_ep2)
        dump="$OUT/$name.$engine"
        flags=(--model.name "$family" --model.flavor "$flavor" --training.seq_len "$seq" --training.global_batch_size "$batch"
               --training.steps $((STEPS + WARMUP)) --metrics.log_freq 1 --metrics.peak_flops 1e12
               --job.dump_folder "$dump")
        if [[ "$engine" == titan ]]; then
          "$TRAIN" "${flags[@]}" --training.local_batch_size "$batch" --training.num_threads "$THREADS" \
            >"$dump.log" 2>&1 || { tail -5 "$dump.log" >&2; exit 1; }
        else
          OMP_NUM_THREADS=$((THREADS > 1 ? THREADS / 2 : 1)) "$RUN" --nproc-per-node 2 -- "$TRAIN" "${flags[@]}" \
            --training.local_batch_size $((batch / 2)) --training.num_threads $((THREADS > 1 ? THREADS / 2 : 1)) \
            --parallelism.expert_parallel_degree 2 >"$dump.log" 2>&1 || { tail -5 "$dump.log" >&2; exit 1; }
        fi
        "$PY" - "$dump" "$WARMUP" >"$res" <<'PY'
import glob, json, sys
dump, warmup = sys.argv[1], int(sys.argv[2])
files = sorted(glob.glob(f"{dump}/metrics_rank*.jsonl")) or [f"{dump}/metrics.jsonl"]
tps, step_s, rss, comm, ep = 0.0, 0.0, 0, 0.0, 0.0
for f in files:  # every rank: its tokens over its time; the job's tokens/s is the sum
    rows = [r for r in map(json.loads, open(f)) if "loss" in r and r["step"] > warmup]
    elapsed = sum(r["elapsed_s"] for r in rows)
    tps += sum(r["tokens"] for r in rows) / elapsed
    step_s = max(step_s, elapsed / len(rows))
    rss = max(rss, rows[-1]["peak_rss_bytes"])
    # exposed: the time blocked on collectives (FSDP's prefetched gathers overlap compute and
    # would count twice); the all-to-alls are waited for as they are issued, so all of theirs.
    comm = max(comm, sum(r.get("comm_exposed_s", 0) for r in rows) / elapsed)
    ep = max(ep, sum(r.get("comm_s_by_dim", {}).get("ep", 0) for r in rows) / elapsed)
print(json.dumps({"tps": tps, "step_s": step_s, "peak_rss_bytes": rss, "comm_share": comm, "ep_share": ep}))
PY
        ;;
      torchtitan | torchtitan_grouped)
        experts=loop; [[ "$engine" == torchtitan_grouped ]] && experts=grouped
        peer="$ROOT/scripts/bench/torchtitan_qwen3_moe.py"
        [[ "$family" == deepseek_v3 ]] && peer="$ROOT/scripts/bench/torchtitan_deepseek_v3.py"
        OMP_NUM_THREADS=$THREADS "$PY" "$peer" --flavor "$flavor" \
          --batch "$batch" --seq-len "$seq" --steps "$STEPS" --warmup "$WARMUP" --threads "$THREADS" \
          --experts "$experts" 2>"$OUT/$name.$engine.err" >"$res" || { tail -5 "$OUT/$name.$engine.err" >&2; exit 1; }
        ;;
    esac
  done
done

"$PY" - "$OUT" "$THREADS" "$ENGINES" "${CASES[@]}" <<'PY'
import json, os, sys
out, threads, engines, cases = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4:]
print(f"threads: {threads} (titan_ep2: 2 ranks x {max(1, int(threads) // 2)})")
print("| case | engine | tok/s | vs torchtitan | s/step | peak RSS GiB | comm share | all-to-all share |")
print("|---|---|---|---|---|---|---|---|")
for c in cases:
    name = c.split()[0]
    res = {e: json.load(open(os.path.join(out, f"{name}.{e}.json"))) for e in engines}
    peer = res.get("torchtitan", {}).get("tps")
    for e in engines:
        r = res[e]
        if "error" in r:
            print(f"| {name} | {e} | n/a: {r['error']} | | | | | |")
            continue
        vs = f"{r['tps'] / peer:.2f}x" if peer else "n/a"
        comm = f"{100 * r['comm_share']:.1f}%" if "comm_share" in r and e == "titan_ep2" else "-"
        ep = f"{100 * r['ep_share']:.1f}%" if "ep_share" in r and e == "titan_ep2" else "-"
        print(f"| {name} | {e} | {r['tps']:,.1f} | {vs} | {r['step_s']:.2f} | {r['peak_rss_bytes'] / 2**30:.2f} | "
              f"{comm} | {ep} |")
PY
