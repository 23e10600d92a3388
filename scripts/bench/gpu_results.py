"""Turns scripts/gpu_check.sh's work folder into its result files (at most 8, all in --out):

  summary.txt     the one table: every step (PASS / FAIL / SKIP / NOT RUN, seconds) and every
                  measured number beside its target
  results.json    the same numbers, machine-readable, with the device, mode and bundle manifest
  logs.tar.gz     every log, metrics.jsonl and memory snapshot of the run
  memory_viz.html torch.cuda._memory_viz's trace plot of the memory snapshot (when made)

gpu_check.sh calls it after every step, so a run cut short still leaves its results. Needs only
the standard library. Parses the text tables of titan-bench-matmul / titan-bench-linear and the
metrics.jsonl of titan-train runs.
"""
import argparse
import datetime
import json
import os
import re
import shutil
import tarfile

WARMUP_STEPS = 3  # titan-train steps excluded from tokens/s: cuBLAS/NCCL set-up, allocator growth
TARGETS = {"matmul_8192_float8_vs_bf16": 1.8, "linear_8192_float8_vs_bf16": 1.3}
# FSDP 2 / TP 2 against one GPU with float32 parameters: the losses differ only by reduction
# order, float32 rounding amplified over 20 steps; 1e-3 relative is far above that (~1e-6 per
# reduction) and far below a real layout bug (which changes the loss in the 2nd-3rd digit).
MULTI_GPU_LOSS_RTOL = 1e-3


def read_steps(work):
    steps = []
    path = os.path.join(work, "steps.tsv")
    if os.path.exists(path):
        for line in open(path):
            name, status, rc, seconds, command = (line.rstrip("\n").split("\t") + [""] * 5)[:5]
            steps.append({"name": name, "status": status, "rc": rc, "seconds": float(seconds or 0),
                          "command": command})
    return steps


def log_text(work, name):
    path = os.path.join(work, "logs", name + ".log")
    return open(path, errors="replace").read() if os.path.exists(path) else ""


CELL = re.compile(r"([\d.]+) ms\s+([\d.]+)x")


def parse_bench_matmul(text):
    """Rows of titan-bench-matmul: model linear M K N | hp ms TFLOP/s | cells 'ms speedup'."""
    rows = []
    for line in text.splitlines():
        m = re.match(r"(\S+)\s+(\S+)\s+(\d+)\s+(\d+)\s+(\d+)\s+\|\s+([\d.]+)\s+([\d.]+)\s+\|(.*)", line)
        if not m:
            continue
        cells = CELL.findall(m.group(8))
        if len(cells) != 3:
            continue
        row = {"model": m.group(1), "linear": m.group(2), "M": int(m.group(3)), "K": int(m.group(4)),
               "N": int(m.group(5)), "hp_ms": float(m.group(6)), "hp_tflops": float(m.group(7))}
        for key, (ms, x) in zip(("float8_tensorwise", "float8_rowwise", "int8"), cells):
            row[key + "_ms"], row[key + "_speedup"] = float(ms), float(x)
        rows.append(row)
    return rows


def parse_bench_linear(text):
    """titan-bench-linear: header 'M K N | hp ms | recipe | ... | int8', cells 'ms yes/no ...'."""
    recipes, rows = [], []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) > 2 and parts[0].split() == ["M", "K", "N"]:
            recipes = [p.split()[0] for p in parts[2:]]
            continue
        m = re.match(r"\s*(\d+)\s+(\d+)\s+(\d+)$", parts[0]) if len(parts) > 2 else None
        if not (m and recipes):
            continue
        row = {"M": int(m.group(1)), "K": int(m.group(2)), "N": int(m.group(3)),
               "hp_ms": float(parts[1])}
        for recipe, cell in zip(recipes, parts[2:]):
            ms = float(cell.split()[0])
            row[recipe + "_ms"] = ms
            row[recipe + "_speedup"] = row["hp_ms"] / ms if ms > 0 else None
        rows.append(row)
    return rows


def parse_metrics(work, run):
    path = os.path.join(work, "runs", run, "metrics.jsonl")
    if not os.path.exists(path):
        return None
    rows = [json.loads(line) for line in open(path) if line.strip()]
    if not rows:
        return None
    timed = [r for r in rows if r["step"] > WARMUP_STEPS] or rows
    seconds = sum(r["elapsed_s"] for r in timed)
    tokens = sum(r["tokens"] for r in timed)
    flops = sum(r["tflops"] * r["elapsed_s"] for r in timed)
    mfu = sum(r["mfu_pct"] * r["elapsed_s"] for r in timed)
    return {"steps": len(rows), "timed_steps": len(timed),
            "tps": tokens / seconds if seconds > 0 else None,
            "tflops": flops / seconds if seconds > 0 else None,
            "mfu_pct": mfu / seconds if seconds > 0 else None,
            "memory_peak_gib": max(r["memory_peak_bytes"] for r in rows) / 2**30,
            # Overlap (multi-GPU runs): communication in flight and exposed, per step.
            "comm_s_per_step": (sum(r["comm_s"] for r in timed) / len(timed)) if "comm_s" in timed[0] else None,
            "comm_exposed_s_per_step": (sum(r["comm_exposed_s"] for r in timed) / len(timed))
                                       if "comm_exposed_s" in timed[0] else None,
            "step_s": seconds / len(timed),
            "losses": [r["loss"] for r in rows], "final_loss": rows[-1]["loss"]}


def parse_eager(work, run):
    path = os.path.join(work, "runs", run + ".json")
    if not os.path.exists(path):
        return None
    lines = [l for l in open(path) if l.strip().startswith("{")]
    return json.loads(lines[-1]) if lines else None


def fmt(v, spec=".2f"):
    return "-" if v is None else format(v, spec)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--work", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--mode", required=True)
    p.add_argument("--device", required=True)
    p.add_argument("--bundle", required=True)
    p.add_argument("--seconds", type=int, default=0)
    a = p.parse_args()
    work = a.work
    steps = read_steps(work)
    results = {"date": datetime.date.today().isoformat(), "mode": a.mode, "device": a.device,
               "wall_seconds": a.seconds, "steps": steps}
    manifest = os.path.join(a.bundle, "bundle.json")
    if os.path.exists(manifest):
        m = json.load(open(manifest))
        results["bundle"] = {k: m.get(k) for k in ("git_commit", "git_dirty", "torch_version", "built",
                                                   "total_bytes")}
    lines = []

    matmul = parse_bench_matmul(log_text(work, "bench_matmul"))
    linear = parse_bench_linear(log_text(work, "bench_linear"))
    results["bench_matmul"], results["bench_linear"] = matmul, linear
    cube = [r for r in matmul if r["M"] == r["K"] == r["N"] == 8192]
    if cube:
        r = cube[0]
        for recipe in ("float8_tensorwise", "float8_rowwise"):
            results.setdefault("targets", {})["matmul_8192_" + recipe] = {
                "speedup": r[recipe + "_speedup"], "target": TARGETS["matmul_8192_float8_vs_bf16"],
                "met": r[recipe + "_speedup"] >= TARGETS["matmul_8192_float8_vs_bf16"]}
        lines.append(f"matmul 8192^3: bf16 {r['hp_ms']:.2f} ms ({r['hp_tflops']:.0f} TFLOP/s); "
                     f"float8 tensorwise {r['float8_tensorwise_speedup']:.2f}x, rowwise "
                     f"{r['float8_rowwise_speedup']:.2f}x (target >= 1.8x); int8 {r['int8_speedup']:.2f}x")
    cube = [r for r in linear if r["M"] == r["K"] == r["N"] == 8192]
    if cube:
        r = cube[0]
        speedups = {k[:-8]: v for k, v in r.items() if k.endswith("_speedup")}
        for recipe, x in speedups.items():
            if recipe == "int8":
                continue  # the 1.3x target is float8's; int8 is reported beside it
            results.setdefault("targets", {})["linear_8192_" + recipe] = {
                "speedup": x, "target": TARGETS["linear_8192_float8_vs_bf16"],
                "met": x is not None and x >= TARGETS["linear_8192_float8_vs_bf16"]}
        lines.append("linear fwd+bwd M=K=N=8192: bf16 %.2f ms; " % r["hp_ms"] +
                     ", ".join(f"{k} {fmt(v)}x" for k, v in speedups.items()) + " (target >= 1.3x)")

    training = {}
    for step in steps:
        name = step["name"]
        if name.startswith(("train_", "debugmodel_", "multi_", "cpu_train", "cpu_titan_run")):
            run = "cpu_fsdp2" if name == "cpu_titan_run_fsdp2" else name
            metrics = parse_metrics(work, run)
            if metrics:
                training[name] = {"engine": "titan", **metrics}
        elif name.startswith(("eager_", "compile_")):
            e = parse_eager(work, name)
            if e:
                training[name] = {"engine": "torch.compile" if name.startswith("compile") else "eager",
                                  "tps": e.get("tps"), "tflops": e.get("tflops"),
                                  "mfu_pct": e.get("mfu_pct"),
                                  "memory_peak_gib": (e.get("memory_peak_bytes") or 0) / 2**30 or None,
                                  "final_loss": e.get("final_loss")}
    results["training"] = training
    single = training.get("multi_single")
    if single:
        for name, t in training.items():
            if name.startswith("multi_") and name != "multi_single" and "float8" not in name:
                worst = max(abs(x - y) / abs(y) for x, y in zip(t["losses"], single["losses"]))
                t["max_loss_rel_diff_vs_single"] = worst
                t["equal_to_single"] = worst <= MULTI_GPU_LOSS_RTOL

    out = []
    out.append(f"== titan gpu_check ({a.mode}) {results['date']} on {a.device}; {a.seconds} s ==")
    if "bundle" in results:
        b = results["bundle"]
        out.append(f"bundle: commit {str(b['git_commit'])[:12]}{' (dirty)' if b['git_dirty'] else ''}, "
                   f"torch {b['torch_version']}, {b['total_bytes'] / 2**20:.1f} MiB")
    out.append("")
    out.append(f"{'step':<36} {'status':<8} {'seconds':>8}")
    for s in steps:
        out.append(f"{s['name']:<36} {s['status']:<8} {s['seconds']:>8.1f}" +
                   (f"   ({s['command']})" if s["status"] == "NOT RUN" else ""))
    if lines:
        out.append("")
        out.extend(lines)
    if training:
        out.append("")
        out.append(f"{'training run':<36} {'engine':<14} {'tok/s':>9} {'TFLOP/s':>8} {'MFU %':>6} "
                   f"{'peak GiB':>8} {'loss':>8}")
        for name, t in training.items():
            extra = ""
            if "equal_to_single" in t:
                extra = f"  vs 1 GPU: max rel loss diff {t['max_loss_rel_diff_vs_single']:.1e} " + \
                        ("OK" if t["equal_to_single"] else "DIFFERS")
            out.append(f"{name:<36} {t['engine']:<14} {fmt(t.get('tps'), ',.0f'):>9} "
                       f"{fmt(t.get('tflops'), '.1f'):>8} {fmt(t.get('mfu_pct'), '.1f'):>6} "
                       f"{fmt(t.get('memory_peak_gib')):>8} {fmt(t.get('final_loss'), '.4f'):>8}{extra}")
    summary = "\n".join(out) + "\n"

    os.makedirs(a.out, exist_ok=True)

    def write(name, text):
        tmp = os.path.join(a.out, name + ".tmp")
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(a.out, name))

    write("summary.txt", summary)
    write("results.json", json.dumps(results, indent=1) + "\n")
    viz = os.path.join(work, "memory_viz.html")
    if os.path.exists(viz):
        shutil.copyfile(viz, os.path.join(a.out, "memory_viz.html"))
    tmp = os.path.join(a.out, "logs.tar.gz.tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        for sub in ("logs", "runs", "steps.tsv"):
            if os.path.exists(os.path.join(work, sub)):
                tar.add(os.path.join(work, sub), arcname=sub)
    os.replace(tmp, os.path.join(a.out, "logs.tar.gz"))
    print(summary, end="")


if __name__ == "__main__":
    main()
