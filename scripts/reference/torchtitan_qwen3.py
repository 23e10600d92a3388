#!/usr/bin/env python3
"""Runs torchtitan's own Qwen3 model (torchtitan/models/qwen3/model/model.py of a release) forward
and backward on deterministic weights and tokens, and writes what it computed as the JSON fixture
that tests/test_qwen3.cpp compares titan's Transformer with.

    torchtitan_qwen3.py MODEL_PY MOE_PY > tests/fixtures/torchtitan/v0.2.2/qwen3_model.json

MODEL_PY and MOE_PY are torchtitan/models/qwen3/model/model.py and torchtitan/models/moe/moe.py of
that release (`git show v0.2.2:<path>` in a torchtitan clone, saved to files). They are executed
with stand-ins for their torchtitan imports: the attention wrappers become the plain
scaled_dot_product_attention call torchtitan's SDPA wrapper makes (causal), the model protocol an
nn.Module, the model arguments a namespace with Qwen3ModelArgs' fields; nothing beyond torch
needs to be installed.

Every parameter `name` (in sorted order, index k from 1) is value(i) = scale * sin(1.7 * i + k)
over its flat index i (norm weights: 1 + 0.1 * sin(...)), computed in float64 and rounded to
float32, which the C++ test computes the same way; the tokens are (7 i + 3) mod vocab. The
fixture holds the logits and, per parameter, its gradient's norm and its projection on
value(i) with seed 1000 + k (scale 1). Three cases: tied embeddings, untied, and Qwen3-MoE (every
block an MoE layer of 4 experts, top 2, expert_bias of layer l = value(i) with seed 500 + l,
scale 0.2), whose tokens per expert are recorded too.
"""
import json
import sys
import types

import torch

from torchtitan_release import count_histc_in_float, load_release_model, values

# A small Qwen3: head_dim independent of dim / n_heads, grouped-query heads, qk-norm.
SHAPES = dict(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, hidden_dim=48,
              norm_eps=1e-6, rope_theta=1000000.0, qk_norm=True, max_seq_len=16, depth_init=True)
BATCH, SEQ = 2, 12


def main():
    count_histc_in_float()
    model_module, moe_module = load_release_model("qwen3", "Qwen3ModelArgs", sys.argv[1], sys.argv[2])
    cases = []
    # Qwen3-MoE's routing (softmax top 2 of 4, route_norm, weights after the experts, no shared
    # expert, the default load balancing), small.
    moe_args = moe_module.MoEArgs(num_experts=4, num_shared_experts=0, top_k=2, score_func="softmax",
                                  route_norm=True, route_scale=1.0, score_before_experts=False, use_grouped_mm=False)
    for tied, moe in ((True, False), (False, False), (False, True)):
        args = types.SimpleNamespace(**SHAPES, attn_type="sdpa", attn_mask_type="causal", eos_id=0,
                                     enable_weight_tying=tied, moe_enabled=moe, moe_inter_dim=24 if moe else 0,
                                     moe_args=moe_args if moe else None)
        torch.manual_seed(0)
        model = model_module.Qwen3Model(args)
        named = dict(model.named_parameters())  # a tied output.weight is the embedding: listed once
        names = sorted(named)
        with torch.no_grad():
            for k, name in enumerate(names, start=1):
                p = named[name]
                if name.endswith("norm.weight"):
                    p.copy_(values(list(p.shape), k, 0.1, ones=True))
                else:
                    p.copy_(values(list(p.shape), k, 1.0 if name == "tok_embeddings.weight" else 0.2))
            for layer_id, layer in model.layers.items():  # a bias that changes choices
                if moe:
                    layer.moe.expert_bias.copy_(values([4], 500 + int(layer_id), 0.2))
                    layer.moe.tokens_per_expert.zero_()
        tokens = torch.tensor([(7 * i + 3) % SHAPES["vocab_size"] for i in range(BATCH * SEQ)]).view(BATCH, SEQ)
        logits = model(tokens)
        logits.backward(values(list(logits.shape), 99, 1.0))
        cases.append({
            "tied": tied,
            "moe": moe,
            "tokens_per_expert": [layer.moe.tokens_per_expert.tolist() for layer in model.layers.values()] if moe else [],
            "parameters": names,
            "logits": logits.detach().flatten().tolist(),
            # Each gradient as two numbers (a full copy would make the fixture megabytes): its
            # norm and its dot product with values(shape, 1000 + k, 1.0), which a wrong gradient
            # changes at the first order.
            "grads": {name: [named[name].grad.double().norm().item(),
                             (named[name].grad.double() *
                              values(list(named[name].shape), 1000 + k, 1.0).double()).sum().item()]
                      for k, name in enumerate(names, start=1)},
        })
    json.dump({"release_file": "torchtitan/models/qwen3/model/model.py", "shapes": SHAPES, "batch": BATCH,
               "seq": SEQ, "cases": cases}, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
