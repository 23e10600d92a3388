#!/usr/bin/env python3
"""Reference tensors for titan's low-precision MoE experts (tests/test_grouped_experts.cpp).

    grouped_experts_reference.py OUT.safetensors

One grouped projection out = A @ W[e]^T per token group (A [T, K] sorted by expert, W [E, N, K]),
its backward from a given output gradient G, for torchao 0.18's expert recipes:

  float8 rowwise: torchao's own quantizers of _Float8GroupedMM (torchao.float8 tensor_to_scale /
    to_fp8_saturated for the row-scaled A and G and the column-scaled W^T, and the
    prototype.moe_training.utils references torch_to_3d_rowwise_float8_transpose_rhs (W for
    grad_A) and torch_to_float8_per_group_colwise (G and A for grad_W)), each GEMM then evaluated
    as torch._scaled_grouped_mm defines it: the dequantized operands' product, in float64, rounded
    once to the output dtype. torchao has no CPU rowwise grouped GEMM to call.
  MXFP8 (RCEIL and FLOOR): torchao's differentiable _to_mxfp8_then_scaled_grouped_mm with
    KernelPreference.EMULATED, forward and backward, in bfloat16 (its CPU emulation runs only there).

Token groups are padded as torchtitan pads them (set_token_group_alignment_size_m: every group,
an empty one too, to a multiple of the alignment, 16 for float8 and 32 for MX, with zero rows) and
the padding removed from the results, so torchao sees what torchtitan hands it; titan's groups are
unpadded. Every input is generated here from fixed seeds and stored with its results.
"""
import sys

import torch

from torchao.float8.config import ScalingGranularity
from torchao.float8.float8_utils import tensor_to_scale, to_fp8_saturated
from torchao.prototype.moe_training.mxfp8_grouped_mm import _to_mxfp8_then_scaled_grouped_mm
from torchao.prototype.moe_training.utils import (
    torch_to_3d_rowwise_float8_transpose_rhs,
    torch_to_float8_per_group_colwise,
)
from torchao.prototype.mx_formats.config import ScaleCalculationMode
from torchao.quantization.quantize_.common.kernel_preference import KernelPreference

from block_scaled_reference import write_safetensors  # this folder's one safetensors writer

E4M3 = torch.float8_e4m3fn
out = {}


def put(name, t):
    # Dense row-major strides even for size-1 dims (which contiguous() leaves as they were).
    t = t.detach().cpu().flatten().clone().view(t.shape)
    if t.dtype == E4M3:
        t = t.view(torch.uint8)
    out[name] = t


def pad_groups(x, counts, align):
    """torchtitan's token-group padding: group e takes max(counts[e], align) rounded up to align
    rows, its own first, zeros after. Returns the padded rows, their group ends and each real
    row's index among them."""
    rows, ends, keep, at = [], [], [], 0
    src = 0
    for c in counts:
        size = (max(c, align) + align - 1) // align * align
        block = x.new_zeros((size, x.shape[1]))
        block[:c] = x[src:src + c]
        rows.append(block)
        keep.extend(range(at, at + c))
        at += size
        src += c
        ends.append(at)
    return torch.cat(rows), torch.tensor(ends, dtype=torch.int32), torch.tensor(keep, dtype=torch.long)


def groups(counts):
    start = 0
    for e, c in enumerate(counts):
        yield e, start, start + c
        start += c


def rowwise_case(tag, A, W, G, counts):
    """float8 rowwise: torchao's quantizers of each operand, the three GEMMs in float64."""
    dt = A.dtype
    pow2 = True
    B_t = W.transpose(-2, -1)  # (E, K, N), per-expert column-major as torchao wants it
    # out = A @ B: A per row (over K), B per column (over K) per expert.
    A_s = tensor_to_scale(A, E4M3, scaling_granularity=ScalingGranularity.AXISWISE, axiswise_dim=-1, round_scales_to_power_of_2=pow2)
    A8 = to_fp8_saturated(A.to(torch.float32) * A_s, E4M3)
    B_s = tensor_to_scale(B_t, E4M3, scaling_granularity=ScalingGranularity.AXISWISE, axiswise_dim=-2, round_scales_to_power_of_2=pow2)
    B8 = to_fp8_saturated(B_t.to(torch.float32) * B_s, E4M3)  # (E, K, N), scales (E, 1, N)
    # grad_A = G @ B^T: G per row (over N), B^T per row (over N): torchao's 3-D transpose rhs.
    G_s = tensor_to_scale(G, E4M3, scaling_granularity=ScalingGranularity.AXISWISE, axiswise_dim=-1, round_scales_to_power_of_2=pow2)
    G8 = to_fp8_saturated(G.to(torch.float32) * G_s, E4M3)
    Bd8, Bd_s = torch_to_3d_rowwise_float8_transpose_rhs(B_t, E4M3, round_scales_to_power_of_2=pow2)  # (E,N,K), (E,1,K)
    # grad_W = G^T @ A per group: both scaled per column within the group (empty groups dropped:
    # their offsets repeat, and an empty group has no scale).
    nonempty = [c for c in counts if c > 0]
    offs = torch.cumsum(torch.tensor(nonempty), 0).to(torch.int32)
    Gc8, Gc_s = torch_to_float8_per_group_colwise(G, offs, E4M3, round_scales_to_power_of_2=pow2)
    Ac8, Ac_s = torch_to_float8_per_group_colwise(A, offs, E4M3, round_scales_to_power_of_2=pow2)
    K, N = A.shape[1], G.shape[1]
    y = torch.zeros(A.shape[0], N, dtype=torch.float64)
    gA = torch.zeros_like(A, dtype=torch.float64)
    gW = torch.zeros(W.shape, dtype=torch.float64)
    g = 0
    for e, s, t in groups(counts):
        a = A8[s:t].double() / A_s[s:t].double()
        y[s:t] = a @ (B8[e].double() / B_s[e].double())
        gA[s:t] = (G8[s:t].double() / G_s[s:t].double()) @ (Bd8[e].double() / Bd_s[e].double())
        if t > s:
            gc = Gc8[s:t].double() / Gc_s[g * N:(g + 1) * N].double()
            ac = Ac8[s:t].double() / Ac_s[g * K:(g + 1) * K].double()
            gW[e] = gc.t() @ ac
            g += 1
    put(f"{tag}/out", y.to(dt))
    put(f"{tag}/grad_input", gA.to(dt))
    put(f"{tag}/grad_weight", gW.to(dt))
    # The quantized operands themselves, for bitwise checks of which axis each is scaled along.
    put(f"{tag}/w_fwd_data", B8.transpose(-2, -1))  # (E, N, K): W's rows, as titan casts W
    put(f"{tag}/w_fwd_scale", B_s.transpose(-2, -1))  # (E, N, 1)
    put(f"{tag}/w_dgrad_data", Bd8)  # (E, N, K) laid out as W; scaled per column of W
    put(f"{tag}/w_dgrad_scale", Bd_s)  # (E, 1, K)
    put(f"{tag}/g_colwise_data", Gc8)
    put(f"{tag}/g_colwise_scale", Gc_s)
    put(f"{tag}/a_colwise_data", Ac8)
    put(f"{tag}/a_colwise_scale", Ac_s)


def mx_case(tag, A, W, G, counts, mode):
    """MXFP8: torchao's emulated grouped GEMM autograd on torchtitan's padded groups."""
    Ap, ends, keep = pad_groups(A, counts, 32)
    Ap = Ap.detach().requires_grad_(True)
    Wq = W.detach().clone().requires_grad_(True)
    y = _to_mxfp8_then_scaled_grouped_mm(
        Ap, Wq.transpose(-2, -1), ends, out_dtype=A.dtype, kernel_preference=KernelPreference.EMULATED,
        scale_calculation_mode=mode)
    Gp = torch.zeros_like(y)
    Gp[keep] = G
    y.backward(Gp)
    put(f"{tag}/out", y[keep])
    put(f"{tag}/grad_input", Ap.grad[keep])
    put(f"{tag}/grad_weight", Wq.grad)


def main():
    path = sys.argv[1]
    gen = torch.Generator().manual_seed(2026)
    E, K, N = 4, 64, 96
    cases = {"uneven": [5, 0, 37, 22], "aligned": [32, 0, 64, 32]}
    for name, counts in cases.items():
        T = sum(counts)
        A = torch.randn(T, K, generator=gen)
        # Rows of very different magnitude: per-row and per-group scales must not be shared.
        A = A * torch.logspace(-2, 2, T).unsqueeze(1)[torch.randperm(T, generator=gen)]
        W = torch.randn(E, N, K, generator=gen) * 0.05
        G = torch.randn(T, N, generator=gen) * 1e-3
        counts_t = torch.tensor(counts, dtype=torch.float32)
        for dtag, dt in (("f32", torch.float32), ("bf16", torch.bfloat16)):
            a, w, g = A.to(dt), W.to(dt), G.to(dt)
            put(f"{name}/{dtag}/A", a)
            put(f"{name}/{dtag}/W", w)
            put(f"{name}/{dtag}/G", g)
            rowwise_case(f"{name}/{dtag}/rowwise", a, w, g, counts)
            if dt == torch.bfloat16:
                mx_case(f"{name}/{dtag}/mxfp8_rceil", a, w, g, counts, ScaleCalculationMode.RCEIL)
                mx_case(f"{name}/{dtag}/mxfp8_floor", a, w, g, counts, ScaleCalculationMode.FLOOR)
        put(f"{name}/counts", counts_t)

    write_safetensors(path, out)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
