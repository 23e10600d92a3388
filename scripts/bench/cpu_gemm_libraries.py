#!/usr/bin/env python3
"""float32 GEMM throughput on the CPU: LibTorch's mm (MKL in the x86 wheels) against oneDNN's linear
(mkldnn::_linear_pointwise, what training.cpu_float32_gemm = onednn uses), for the three products
of a linear (x W^T, G W, G^T x) with the transposed operands as strided views, as titan passes
them (Note [float32 GEMMs on the CPU] in model/linear.h). Prints one table row per shape.

  .deps/venv/bin/python scripts/bench/cpu_gemm_libraries.py [--threads 2] [--tokens 512]

Shapes: the 100M and debug models' projections (K x N = in x out features) at --tokens rows,
and 2048^3. Each figure is the best of 3 timings of at least 0.2 s.
"""
import argparse
import time

import torch


def gflops(fn, flops):
    fn()  # warm-up: thread pool, packed buffers
    best = 0.0
    for _ in range(3):
        reps, start = 0, time.perf_counter()
        while True:
            fn()
            reps += 1
            elapsed = time.perf_counter() - start
            if elapsed >= 0.2:
                break
        best = max(best, flops * reps / elapsed / 1e9)
    return best


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tokens", type=int, default=512)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    linear = torch.ops.mkldnn._linear_pointwise
    shapes = [("100M w1/w3", a.tokens, 768, 2048), ("100M w2", a.tokens, 2048, 768),
              ("100M wq/wk/wv/wo", a.tokens, 768, 768), ("debug wq..wo", a.tokens, 256, 256),
              ("debug w1/w3", a.tokens, 256, 768), ("square", 2048, 2048, 2048)]
    print(f"threads: {a.threads}; GFLOP/s, LibTorch mm / oneDNN linear")
    print("| shape | M x K x N | x W^T | G W | G^T x |")
    print("|---|---|---|---|---|")
    with torch.no_grad():
        for name, m, k, n in shapes:
            x, w, g = torch.randn(m, k), torch.randn(n, k), torch.randn(m, n)
            f = 2.0 * m * k * n
            cells = []
            for mm, dnn in [(lambda: torch.mm(x, w.t()), lambda: linear(x, w, None, "none", [], "")),
                            (lambda: torch.mm(g, w), lambda: linear(g, w.t(), None, "none", [], "")),
                            (lambda: torch.mm(g.t(), x), lambda: linear(g.t(), x.t(), None, "none", [], ""))]:
                cells.append(f"{gflops(mm, f):.0f} / {gflops(dnn, f):.0f}")
            print(f"| {name} | {m} x {k} x {n} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
