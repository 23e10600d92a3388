#!/usr/bin/env python3
"""Reference tensors for titan's block-scaled low precision (tests/test_block_scaled.cpp).

    block_scaled_reference.py OUT.safetensors

MX (MXFP8, MXFP4): torchao's own emulation (torchao.prototype.mx_formats to_mx / to_dtype and
the mx_mm autograd function of its MXFP8 linear with KernelPreference.EMULATED), so titan's CPU
path is checked bit for bit against the library whose recipe names it takes. torchao comes from
scripts/setup.sh (.deps/torchao, on PYTHONPATH).

Blockwise float8: an independent plain-PyTorch statement of the DeepSeek-V3 / torchao blockwise
math, tile by tile with Python loops (1 x 128 activation tiles, 128 x 128 weight tiles, float32
reciprocal scales), written from the formulas, not from titan's code.

Every input is generated here from fixed seeds and stored next to its results, so the C++ test
reads the inputs instead of regenerating them.
"""
import json
import struct
import sys

import torch

from torchao.prototype.moe_training.mxfp8_linear import mx_mm
from torchao.prototype.mx_formats.config import (
    MXFP8Dim0CastKernelChoice,
    MXFP8Dim1CastKernelChoice,
    ScaleCalculationMode,
)
from torchao.prototype.mx_formats.mx_tensor import to_dtype, to_mx
from torchao.prototype.mx_formats.utils import to_blocked
from torchao.quantization.quantize_.common.kernel_preference import KernelPreference

MODES = {"floor": ScaleCalculationMode.FLOOR, "rceil": ScaleCalculationMode.RCEIL}
ELEMS = {"e4m3": torch.float8_e4m3fn, "e2m1": torch.float4_e2m1fn_x2}
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}

out = {}


def put(name, t):
    t = t.detach().contiguous().cpu()
    if t.dtype in (torch.float8_e4m3fn, torch.float8_e8m0fnu):
        t = t.view(torch.uint8)
    out[name] = t


def special_values():
    """[16, 64]: two blocks of 32 per row, each row a boundary case of E8M0 or the elements."""
    rows = []
    g = torch.Generator().manual_seed(7)
    base = torch.randn(32, generator=g)

    def row(a, b):
        rows.append(torch.cat([a.float(), b.float()]))

    row(torch.zeros(32), base)                                   # an all-zero block
    row(torch.full((32,), -0.0), base * 1e-3)                    # negative zeros
    row(base * 1e-39, base * 1e-42)                              # float32 subnormals
    row(base * 2.0**-119, base * 2.0**-125)                      # scales below E8M0's 2^-127 floor
    row(base * 3e38, base * 1e30)                                # the top of float32
    row(torch.tensor([448.0, 464.0, 480.0, 500.0] * 8), torch.tensor([2.0**k for k in range(-16, 16)]))
    row(torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * 4),       # e2m1 ties
        torch.tensor([7.0, 5.5, 0.24, 0.26, 2.75, 4.5, 6.5, 1.0] * 4))
    row(torch.tensor([1.0 + 2.0**-23] * 32), torch.tensor([448.0 * (1 + 2.0**-20)] * 32))  # rceil edges
    row(torch.tensor([2.0**-10 * 1.0009765625] * 32), base * 2.0**100)
    row(torch.linspace(-1, 1, 32), torch.linspace(-500, 500, 32))
    t = base.clone()
    t[3] = float("nan")
    row(t, base)                                                 # a NaN poisons its block
    t = base.clone()
    t[5] = float("inf")
    u = base.clone()
    u[9] = float("-inf")
    row(t, u)                                                    # infinities
    row(base * 2.0**-126, base * 2.0**-133)
    row(torch.full((32,), 6.0), torch.full((32,), 448.0))
    row(torch.full((32,), 2.0**-127), torch.full((32,), 1.5 * 2.0**-127))
    row(base * 1e-20, base * 1e20)
    return torch.stack(rows)


def random_values(rows, cols, seed):
    """Gaussian values whose magnitude varies by block, across 2^-30 .. 2^30."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g)
    exps = torch.randint(-30, 31, (rows, cols // 32), generator=g).float()
    return x * torch.exp2(exps).repeat_interleave(32, dim=1)


def mx_casts():
    inputs = {"special": special_values(), "random": random_values(48, 96, 1)}
    for iname, x32 in inputs.items():
        for dname, dtype in DTYPES.items():
            x = x32.to(dtype)
            put(f"cast/{iname}/{dname}/x", x)
            for ename, elem in ELEMS.items():
                for mname, mode in MODES.items():
                    key = f"cast/{iname}/{dname}/{ename}/{mname}"
                    scale, data = to_mx(x, elem, 32, mode)
                    put(key + "/scale", scale)
                    put(key + "/data", data)
                    put(key + "/dequant", to_dtype(data, scale, elem, 32, dtype))


def mx_linears():
    # (tokens as [B, S], K, N): the second has K and N that are not multiples of 128 and a token
    # count that is not one of 128 (the swizzled scale layout pads both).
    shapes = {"even": (2, 64, 128, 256), "remainder": (3, 32, 160, 224)}
    for sname, (b, s, k, n) in shapes.items():
        g = torch.Generator().manual_seed(11)
        x32 = torch.randn(b, s, k, generator=g)
        w32 = torch.randn(n, k, generator=g) * 0.05
        go32 = torch.randn(b, s, n, generator=g) * 1e-3
        for dname, dtype in DTYPES.items():
            key = f"linear/{sname}/{dname}"
            put(key + "/x", x32.to(dtype))
            put(key + "/w", w32.to(dtype))
            put(key + "/grad_out", go32.to(dtype))
            for ename, elem in ELEMS.items():
                for mname, mode in MODES.items():
                    x = x32.to(dtype).detach().clone().requires_grad_()
                    w = w32.to(dtype).detach().clone().requires_grad_()
                    y = mx_mm.apply(x, w, elem, elem, elem, 32, KernelPreference.EMULATED,
                                    MXFP8Dim0CastKernelChoice.TORCH, MXFP8Dim1CastKernelChoice.TORCH,
                                    mode, False)
                    y.backward(go32.to(dtype))
                    put(f"{key}/{ename}/{mname}/out", y)
                    put(f"{key}/{ename}/{mname}/grad_input", x.grad)
                    put(f"{key}/{ename}/{mname}/grad_weight", w.grad)
                    # High precision for the SQNR the test reports.
                    if ename == "e4m3" and mname == "floor":
                        xh = x32.double().requires_grad_()
                        wh = w32.double().requires_grad_()
                        yh = xh @ wh.t()
                        yh.backward(go32.double())
                        put(f"{key}/hp/out", yh.float())
                        put(f"{key}/hp/grad_input", xh.grad.float())
                        put(f"{key}/hp/grad_weight", wh.grad.float())


# ---- blockwise float8: the tile math, stated plainly ----
FP8_MAX = 448.0


def blockwise_quantize(x, tile_rows):
    """x [R, C] -> (e4m3 data [R, C], float32 reciprocal scales [ceil(R/tr), ceil(C/128)])."""
    R, C = x.shape
    tr, tc = -(-R // tile_rows), -(-C // 128)
    data = torch.empty(R, C, dtype=torch.float8_e4m3fn)
    scales = torch.empty(tr, tc, dtype=torch.float32)
    xf = x.float()
    for i in range(tr):
        for j in range(tc):
            tile = xf[i * tile_rows:(i + 1) * tile_rows, j * 128:(j + 1) * 128]
            amax = tile.abs().max().clamp(min=1e-12).double()  # the clamp in float32, then float64
            scale = (FP8_MAX / amax).float()
            data[i * tile_rows:(i + 1) * tile_rows, j * 128:(j + 1) * 128] = \
                (tile * scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
            scales[i, j] = 1.0 / scale
    return data, scales


def blockwise_dequantize(data, scales, tile_rows):
    R, C = data.shape
    out = data.float().clone()
    for i in range(scales.shape[0]):
        for j in range(scales.shape[1]):
            out[i * tile_rows:(i + 1) * tile_rows, j * 128:(j + 1) * 128] *= scales[i, j]
    return out


def blockwise_mm(a, a_tile_rows, b, b_tile_rows, out_dtype):
    """out = A @ B^T with A [M, K] and B [N, K] quantized in tiles along K."""
    ad, as_ = blockwise_quantize(a, a_tile_rows)
    bd, bs = blockwise_quantize(b, b_tile_rows)
    return (blockwise_dequantize(ad, as_, a_tile_rows) @ blockwise_dequantize(bd, bs, b_tile_rows).t()).to(out_dtype)


def blockwise():
    for sname, (r, c) in {"even": (256, 384), "remainder": (200, 320)}.items():
        for tile_rows in (1, 128):
            x = random_values(r, 384 if c == 384 else 320, 3 + tile_rows)[:, :c]
            key = f"blockwise/cast/{sname}/{tile_rows}"
            put(key + "/x", x)
            data, scales = blockwise_quantize(x, tile_rows)
            put(key + "/data", data)
            put(key + "/scale", scales)
    # The three GEMMs of a linear: x [T, K] 1x128, W [N, K] 128x128, G [T, N] 1x128.
    for sname, (t, k, n) in {"even": (256, 256, 384), "remainder": (200, 384, 256)}.items():
        g = torch.Generator().manual_seed(5)
        x = torch.randn(t, k, generator=g)
        w = torch.randn(n, k, generator=g) * 0.05
        go = torch.randn(t, n, generator=g) * 1e-3
        key = f"blockwise/linear/{sname}"
        put(key + "/x", x)
        put(key + "/w", w)
        put(key + "/grad_out", go)
        put(key + "/out", blockwise_mm(x, 1, w, 128, torch.float32))
        put(key + "/grad_input", blockwise_mm(go, 1, w.t().contiguous(), 128, torch.float32))
        put(key + "/grad_weight", blockwise_mm(go.t().contiguous(), 1, x.t().contiguous(), 1, torch.float32))


def swizzle():
    g = torch.Generator().manual_seed(9)
    for r, c in ((256, 8), (200, 7)):
        s = torch.randint(0, 256, (r, c), generator=g, dtype=torch.uint8)
        put(f"swizzle/{r}x{c}/in", s)
        put(f"swizzle/{r}x{c}/out", to_blocked(s))


def write_safetensors(path, tensors):
    names = {torch.float32: "F32", torch.bfloat16: "BF16", torch.uint8: "U8"}
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


if __name__ == "__main__":
    torch.set_num_threads(1)
    mx_casts()
    mx_linears()
    blockwise()
    swizzle()
    write_safetensors(sys.argv[1], out)
    print(f"wrote {len(out)} tensors to {sys.argv[1]}")
