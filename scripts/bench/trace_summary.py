"""Where one traced step's GPU time goes, from a titan (or any Kineto) Chrome trace:
the step's wall time, GPU busy time, and the kernels grouped by name, largest total first.

    python3 scripts/bench/trace_summary.py TRACE.json[.gz] [--top N]

scripts/gpu_profile.sh writes such traces (one 8B-shaped step per recipe).
"""
import argparse
import gzip
import json
import re


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def family(name):
    """Kernel names carry template arguments; group by what the kernel does."""
    n = name.lower()
    rules = [("gemm (float8)", r"e4m3|f8f6f4|fp8"), ("gemm", r"gemm|cutlass|sm90_xmma|nvjet|cublas"),
             ("flash attention", r"flash|fmha"), ("nccl", r"nccl"),
             ("reduce / norm", r"reduce|norm"), ("elementwise", r"elementwise|vectorized|unrolled"),
             ("copy / cat", r"copy|cat|memcpy|memset"), ("adam", r"adam|foreach|multi_tensor")]
    for label, pattern in rules:
        if re.search(pattern, n):
            return label
    return "other"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    events = load(a.trace).get("traceEvents", [])
    kernels = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    steps = [e for e in events if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep")]
    if not kernels:
        print("no GPU kernels in the trace")
        return 1
    t0 = min(float(e["ts"]) for e in kernels)
    t1 = max(float(e["ts"]) + float(e.get("dur", 0)) for e in kernels)
    busy = 0.0
    end = -1.0
    for e in sorted(kernels, key=lambda e: float(e["ts"])):  # union of kernel intervals
        s, d = float(e["ts"]), float(e.get("dur", 0))
        if s >= end:
            busy += d
            end = s + d
        elif s + d > end:
            busy += s + d - end
            end = s + d
    for s in steps:
        print(f"{s['name']}: {float(s['dur']) / 1e3:.1f} ms on the CPU side")
    print(f"GPU span {(t1 - t0) / 1e3:.1f} ms, busy {busy / 1e3:.1f} ms ({100 * busy / (t1 - t0):.1f}%), "
          f"{len(kernels)} kernels")
    by_family, by_name = {}, {}
    for e in kernels:
        d = float(e.get("dur", 0))
        f = family(e["name"])
        by_family[f] = by_family.get(f, 0.0) + d
        c, t = by_name.get(e["name"], (0, 0.0))
        by_name[e["name"]] = (c + 1, t + d)
    print("\nby kind:")
    for f, d in sorted(by_family.items(), key=lambda x: -x[1]):
        print(f"  {f:<18} {d / 1e3:9.2f} ms  {100 * d / busy:5.1f}%")
    print(f"\ntop {a.top} kernels:")
    for name, (c, d) in sorted(by_name.items(), key=lambda x: -x[1][1])[: a.top]:
        print(f"  {d / 1e3:8.2f} ms {c:5d}x  {name[:120]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
