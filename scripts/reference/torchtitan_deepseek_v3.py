#!/usr/bin/env python3
"""Runs torchtitan's own DeepSeek-V3 model (torchtitan/models/deepseek_v3/model/model.py of a
release) forward and backward on deterministic weights and tokens, and writes what it computed as
the JSON fixture that tests/test_deepseek_v3.cpp compares titan's Transformer with.

    torchtitan_deepseek_v3.py MODEL_PY MOE_PY > tests/fixtures/torchtitan/v0.2.2/deepseek_v3_model.json

MODEL_PY and MOE_PY are torchtitan/models/deepseek_v3/model/model.py and
torchtitan/models/moe/moe.py of that release (`git show v0.2.2:<path>` in a torchtitan clone,
saved to files). They run with stand-ins for their torchtitan imports: the attention wrapper
becomes the scaled_dot_product_attention call torchtitan's SDPA wrapper makes (causal, with the
model's softmax scale), the model protocol an nn.Module, the arguments a namespace with
DeepSeekV3ModelArgs' fields; nothing beyond torch needs to be installed.

Weights, tokens and the fixture's contents follow tests/fixtures/torchtitan/v0.2.2/qwen3_model.json's
recipe (scripts/reference/torchtitan_qwen3.py): parameter `name` (sorted, index k from 1) is
value(i) = scale * sin(1.7 i + k) over its flat index (norm weights 1 + 0.1 sin(...)), float64
rounded to float32; tokens (7 i + 3) mod vocab; per parameter the gradient's norm and its dot
product with value(i) of seed 1000 + k. Every MoE layer's expert_bias is value(i) of seed
500 + layer, scale 0.2; the tokens per expert are recorded. Cases: latent attention with q
projected directly (q_lora_rank 0) and through its rank with its norm (q_lora_rank 8); without
YaRN (max_seq_len <= original_seq_len) and with it (the frequencies' ramp and mscale's softmax
scale); sigmoid group-limited routing with route scaling, and softmax routing with two shared
experts (the debug flavors').
"""
import json
import sys
import types

import torch

from torchtitan_release import count_histc_in_float, load_release_model, values

# A small DeepSeek-V3: one dense block then MoE blocks; latent attention whose qk head (8 + 4)
# differs from its v head (6).
SHAPES = dict(vocab_size=64, dim=32, inter_dim=48, moe_inter_dim=16, n_layers=3, n_dense_layers=1, n_heads=4,
              norm_eps=1e-5, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6,
              rope_theta=10000.0, rope_factor=40.0, beta_fast=32, beta_slow=1, mscale=0.7, max_seq_len=16)
BATCH, SEQ = 2, 12
# (name, q_lora_rank, original_seq_len, routing): original_seq_len 8 < max_seq_len 16 turns YaRN on.
CASES = [
    ("q_direct_sigmoid_groups", 0, 4096, "sigmoid"),
    ("q_lora_yarn_sigmoid_groups", 8, 8, "sigmoid"),
    ("q_lora_softmax_shared2", 8, 4096, "softmax"),
    ("q_direct_yarn_softmax_shared2", 0, 8, "softmax"),
]


def main():
    count_histc_in_float()
    model_module, moe_module = load_release_model("deepseek_v3", "DeepSeekV3ModelArgs", sys.argv[1], sys.argv[2])
    cases = []
    for case, q_lora_rank, original_seq_len, routing in CASES:
        if routing == "sigmoid":  # 671B's routing: sigmoid, group-limited, normalized, scaled
            moe_args = moe_module.MoEArgs(num_experts=4, num_shared_experts=1, top_k=2, score_func="sigmoid",
                                          route_norm=True, route_scale=2.5, num_expert_groups=2,
                                          num_limited_groups=1, score_before_experts=False, use_grouped_mm=False)
        else:  # the debug flavors': softmax, two shared experts, no normalization
            moe_args = moe_module.MoEArgs(num_experts=4, num_shared_experts=2, top_k=3, score_func="softmax",
                                          route_norm=False, score_before_experts=False, use_grouped_mm=False)
        args = types.SimpleNamespace(**SHAPES, q_lora_rank=q_lora_rank, original_seq_len=original_seq_len,
                                     attn_type="sdpa", attn_mask_type="causal", moe_args=moe_args,
                                     moe_impl="standard")
        torch.manual_seed(0)
        model = model_module.DeepSeekV3Model(args)
        named = dict(model.named_parameters())
        names = sorted(named)
        with torch.no_grad():
            for k, name in enumerate(names, start=1):
                p = named[name]
                if name.endswith("norm.weight"):
                    p.copy_(values(list(p.shape), k, 0.1, ones=True))
                else:
                    p.copy_(values(list(p.shape), k, 1.0 if name == "tok_embeddings.weight" else 0.2))
            for layer_id, layer in model.layers.items():  # a bias that changes choices
                if layer.moe_enabled:
                    layer.moe.expert_bias.copy_(values([4], 500 + int(layer_id), 0.2))
                    layer.moe.tokens_per_expert.zero_()
        tokens = torch.tensor([(7 * i + 3) % SHAPES["vocab_size"] for i in range(BATCH * SEQ)]).view(BATCH, SEQ)
        logits = model(tokens)
        logits.backward(values(list(logits.shape), 99, 1.0))
        cases.append({
            "case": case,
            "q_lora_rank": q_lora_rank,
            "original_seq_len": original_seq_len,
            "routing": routing,
            "softmax_scale": model.layers["0"].attention.softmax_scale,
            "tokens_per_expert": [layer.moe.tokens_per_expert.tolist() for layer in model.layers.values()
                                  if layer.moe_enabled],
            "parameters": names,
            "logits": logits.detach().flatten().tolist(),
            "grads": {name: [named[name].grad.double().norm().item(),
                             (named[name].grad.double() *
                              values(list(named[name].shape), 1000 + k, 1.0).double()).sum().item()]
                      for k, name in enumerate(names, start=1)},
        })
    json.dump({"release_file": "torchtitan/models/deepseek_v3/model/model.py", "shapes": SHAPES, "batch": BATCH,
               "seq": SEQ, "cases": cases}, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
