#!/usr/bin/env python3
"""Runs torchtitan's own MoE layer (torchtitan/models/moe/moe.py of a release) forward and backward
on deterministic weights and inputs, and writes what it computed as the JSON fixture that
tests/test_moe.cpp compares titan's layer with.

    torchtitan_moe.py MOE_PY > tests/fixtures/torchtitan/v0.2.2/moe_layer.json

MOE_PY is torchtitan/models/moe/moe.py of that release (e.g. `git show
v0.2.2:torchtitan/models/moe/moe.py` in a torchtitan clone, saved to a file). The file is executed
with stand-ins for its three torchtitan imports (trunc_normal_, the logger, the grouped-mm padding
helper, unused with use_grouped_mm = False), so neither torchtitan nor its dependencies beyond
torch need to be installed.

Every weight, bias and input is value(i) = scale * sin(1.7 * i + seed) over its flat index i,
computed in float64 and rounded to float32, which the C++ test computes the same way; the
fixture holds the configurations, the outputs, the tokens per expert and every gradient. Each case
also runs a float64 twin of the module (its float32 casts made float64) and records float32's own
rounding error per tensor (float32_error), which the test's tolerance is made of.
"""
import json
import logging
import sys
import types

import torch

from torchtitan_release import values

D, H, E, N = 8, 6, 4, 6  # dim, expert hidden, experts, tokens (batch 2 x 3)


def load(path, compute_dtype="float32"):
    for name in ("torchtitan", "torchtitan.models", "torchtitan.tools", "torchtitan.models.moe"):
        module = types.ModuleType(name)
        module.__path__ = []
        sys.modules[name] = module
    utils = types.ModuleType("torchtitan.models.utils")
    utils.trunc_normal_ = torch.nn.init.trunc_normal_
    sys.modules["torchtitan.models.utils"] = utils
    logging_stub = types.ModuleType("torchtitan.tools.logging")
    logging_stub.logger = logging.getLogger("torchtitan")
    sys.modules["torchtitan.tools.logging"] = logging_stub
    moe_utils = types.ModuleType("torchtitan.models.moe.utils")
    moe_utils.indices_padding_wrapper = lambda fn: fn
    sys.modules["torchtitan.models.moe.utils"] = moe_utils
    module = types.ModuleType("torchtitan.models.moe.moe")
    module.__file__ = path
    module.__package__ = "torchtitan.models.moe"
    sys.modules["torchtitan.models.moe.moe"] = module
    with open(path) as f:
        source = f.read()
    # The float64 twin: the router's and the combine's float32 casts become float64 casts, so that
    # every operation runs in float64 (the buffers' float32 counts stay as they are).
    casts = {"scores.to(torch.float32)": f"scores.to(torch.{compute_dtype})",
             "routed_input.to(torch.float32)": f"routed_input.to(torch.{compute_dtype})",
             "routed_output_unsorted.float()": f"routed_output_unsorted.to(torch.{compute_dtype})"}
    for cast, twin in casts.items():
        assert cast in source, cast
        source = source.replace(cast, twin)
    exec(compile(source, path, "exec"), module.__dict__)
    return module


CONFIGS = [
    # name, MoEArgs fields
    ("defaults with a load-balancing bias", dict(num_experts=E)),
    ("qwen3-moe", dict(num_experts=E, num_shared_experts=0, score_func="softmax", top_k=2, route_norm=True,
                       score_before_experts=False, load_balance_coeff=None)),
    ("group-limited", dict(num_experts=E, top_k=2, num_expert_groups=2, num_limited_groups=1, route_norm=True,
                           route_scale=2.5, gate_bias=True, num_shared_experts=2, score_before_experts=False)),
    ("force-load-balance", dict(num_experts=E, num_shared_experts=0, score_func="softmax", top_k=2,
                                route_norm=True, load_balance_coeff=None, _debug_force_load_balance=True)),
]


def run(moe, fields, dtype):
    """torchtitan's layer on the fixture's weights and input (float32 values, held in dtype): the
    output, the tokens per expert and every gradient."""
    args = moe.MoEArgs(use_grouped_mm=False, **fields)
    layer = moe.MoE(args, dim=D, hidden_dim=H).to(dtype)
    params = {
        "router.gate.weight": values([E, D], 1, 0.5),
        "experts.w1": values([E, H, D], 2, 0.4),
        "experts.w2": values([E, D, H], 3, 0.4),
        "experts.w3": values([E, H, D], 4, 0.4),
    }
    if args.gate_bias:
        params["router.gate.bias"] = values([E], 5, 0.5)
    if args.num_shared_experts > 0:
        sh = H * args.num_shared_experts
        params["shared_experts.w1.weight"] = values([sh, D], 6, 0.4)
        params["shared_experts.w2.weight"] = values([D, sh], 7, 0.4)
        params["shared_experts.w3.weight"] = values([sh, D], 8, 0.4)
    with torch.no_grad():
        named = dict(layer.named_parameters())
        assert set(named) == set(params), (sorted(named), sorted(params))
        for key, value in params.items():
            named[key].copy_(value)
        layer.tokens_per_expert.zero_()
        if args.load_balance_coeff is not None:
            layer.expert_bias.copy_(values([E], 9, 0.2))
    x = values([2, 3, D], 10, 1.0).to(dtype).requires_grad_(True)
    out = layer(x)
    out.backward(values([2, 3, D], 11, 1.0).to(dtype))
    grads = {"x": x.grad, **{k: named[k].grad for k in params}}
    return out.detach(), layer.tokens_per_expert.clone(), grads


def main():
    # torchtitan's router histograms int64 expert indices with torch.histc, which the CPU kernel
    # implements for floating types only (the CUDA one returns int64 counts): the stand-in counts
    # the integers 0..E-1 in E unit bins in float and returns them as int64, as on the GPU.
    histc = torch.histc

    def int_histc(t, *a, **k):
        return histc(t, *a, **k) if t.is_floating_point() else histc(t.float(), *a, **k).long()

    torch.histc = int_histc
    moe32 = load(sys.argv[1])
    moe64 = load(sys.argv[1], "float64")
    cases = []
    for name, fields in CONFIGS:
        out, tokens_per_expert, grads = run(moe32, fields, torch.float32)
        out64, tokens_per_expert64, grads64 = run(moe64, fields, torch.float64)
        assert torch.equal(tokens_per_expert, tokens_per_expert64), name  # the same routing
        cases.append({
            "name": name,
            "args": {k: v for k, v in fields.items()},
            "out": out.flatten().tolist(),
            "tokens_per_expert": tokens_per_expert.tolist(),
            "grads": {k: g.flatten().tolist() for k, g in grads.items()},
            # float32's own rounding error in what torchtitan computed: its largest difference from
            # the float64 twin, per tensor (the test's tolerance is made of it).
            "float32_error": {"out": (out.double() - out64).abs().max().item(),
                              **{k: (g.double() - grads64[k]).abs().max().item() for k, g in grads.items()}},
        })
    json.dump({"release_file": "torchtitan/models/moe/moe.py", "dim": D, "hidden_dim": H, "num_experts": E,
               "tokens": N, "cases": cases}, sys.stdout, indent=None)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
