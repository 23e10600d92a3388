#!/usr/bin/env python3
"""Runs torchtitan's own Llama 4 model (torchtitan/models/llama4/model/model.py of a release)
forward and backward on deterministic weights and tokens, and writes what it computed as the JSON
fixture that tests/test_llama4.cpp compares titan's Transformer with.

    torchtitan_llama4.py MODEL_PY MOE_PY ATTENTION_PY > tests/fixtures/torchtitan/v0.2.2/llama4_model.json

MODEL_PY, MOE_PY and ATTENTION_PY are torchtitan/models/llama4/model/model.py,
torchtitan/models/moe/moe.py and torchtitan/models/attention.py of that release (`git show
v0.2.2:<path>` in a torchtitan clone, saved to files). They run with stand-ins for their other
torchtitan imports (torchtitan_release.py): the SDPA wrapper is the causal
scaled_dot_product_attention call torchtitan's makes; FlexAttention is evaluated as SDPA under the
dense mask the release's own mask mods give (causal, document, fixed block: its attention.py
runs unchanged); the arguments a namespace with TransformerModelArgs' fields.

One fix to the release: its Attention.forward selects the layer's mask (attention_mask =
attention_masks["rope" if self.use_rope else "nope"]) and then passes the whole dict as
block_mask, which FlexAttention cannot take; the script passes the selected mask, which is what
the selection means and what titan computes.

Weights, tokens and the fixture's contents follow torchtitan_qwen3.py's recipe: parameter `name`
(sorted, index k from 1) is value(i) = scale * sin(1.7 i + k) over its flat index (norm weights
1 + 0.1 sin(...)), float64 rounded to float32; tokens (7 i + 3) mod vocab; per parameter the
gradient's norm and its dot product with value(i) of seed 1000 + k. Each MoE layer's expert_bias is
value(i) of seed 500 + layer, scale 0.2; the tokens per expert are recorded. Cases: every block
MoE (17bx16e's interleave 1) causal over the whole row; iRoPE (NoPE blocks 0 and 2 over the whole
window, RoPE blocks 1 and 3 within chunks of 4) with dense and MoE blocks alternating (interleave
2), block-causal (token EOS_ID ends a document inside row 0) and causal.
"""
import json
import sys
import types

import torch

from torchtitan_release import count_histc_in_float, load_release_model, values

# A small Llama 4: grouped-query heads, Llama 3.1 rope scaling (RoPEScalingArgs' defaults, which at
# theta 5e5 and head_dim 8 divide the two lowest frequencies by 16), one shared expert, top-1
# sigmoid routing with the score applied before the experts.
SHAPES = dict(vocab_size=64, dim=32, n_layers=4, n_heads=4, n_kv_heads=2, multiple_of=16, ffn_dim_multiplier=None,
              norm_eps=1e-5, rope_theta=500000.0, max_seq_len=16, depth_init=True, auto_scale_hidden_dim=True)
SCALING = dict(scaling_factor=16.0, low_freq_factor=1.0, high_freq_factor=1.0, original_max_position_embeddings=8192)
BATCH, SEQ = 2, 12
EOS_ID = 38  # token 5 of row 0: documents [0, 6) and [6, 12) there, row 1 one document
# (name, attn_type, attn_mask_type, interleave_moe_layer_step, every_n_layers_nope, fixed_attn_block_size)
CASES = [
    ("moe_every_block_causal", "sdpa", "causal", 1, None, 8192),
    ("irope_block_causal", "flex", "block_causal", 2, 2, 4),
    ("irope_causal", "flex", "causal", 2, 2, 4),
]
FIX = ("block_mask=attention_masks,", "block_mask=attention_mask,")


def main():
    count_histc_in_float()
    model_module, moe_module = load_release_model("llama4", ("RoPEScalingArgs", "TransformerModelArgs"), sys.argv[1],
                                                  sys.argv[2], attention_py=sys.argv[3], fixes=[FIX])
    moe_args = moe_module.MoEArgs(num_experts=4, use_grouped_mm=False)  # the release's defaults otherwise
    cases = []
    for name, attn_type, mask_type, interleave, nope, block in CASES:
        args = types.SimpleNamespace(**SHAPES, rope_scaling_args=types.SimpleNamespace(**SCALING),
                                     attn_type=attn_type, attn_mask_type=mask_type, every_n_layers_nope=nope,
                                     fixed_attn_block_size=block, moe_args=moe_args,
                                     interleave_moe_layer_step=interleave)
        torch.manual_seed(0)
        model = model_module.Transformer(args)
        named = dict(model.named_parameters())
        names = sorted(named)
        with torch.no_grad():
            for k, pname in enumerate(names, start=1):
                p = named[pname]
                if pname.endswith("norm.weight"):
                    p.copy_(values(list(p.shape), k, 0.1, ones=True))
                else:
                    p.copy_(values(list(p.shape), k, 1.0 if pname == "tok_embeddings.weight" else 0.2))
            for layer_id, layer in model.layers.items():  # a bias that changes choices
                if layer.moe_enabled:
                    layer.moe.expert_bias.copy_(values([4], 500 + int(layer_id), 0.2))
                    layer.moe.tokens_per_expert.zero_()
        tokens = torch.tensor([(7 * i + 3) % SHAPES["vocab_size"] for i in range(BATCH * SEQ)]).view(BATCH, SEQ)
        masks = None
        if attn_type == "flex":
            masks = model.get_attention_masks(tokens, types.SimpleNamespace(eos_id=EOS_ID))
        logits = model(tokens, masks)
        logits.backward(values(list(logits.shape), 99, 1.0))
        cases.append({
            "name": name,
            "attn_mask_type": mask_type,
            "interleave_moe_layer_step": interleave,
            "every_n_layers_nope": nope or 0,
            "fixed_attn_block_size": block,
            "moe_layers": [int(i) for i, layer in model.layers.items() if layer.moe_enabled],
            "tokens_per_expert": [layer.moe.tokens_per_expert.tolist() for layer in model.layers.values()
                                  if layer.moe_enabled],
            "parameters": names,
            "logits": logits.detach().flatten().tolist(),
            "grads": {pname: [named[pname].grad.double().norm().item(),
                              (named[pname].grad.double() *
                               values(list(named[pname].shape), 1000 + k, 1.0).double()).sum().item()]
                      for k, pname in enumerate(names, start=1)},
        })
    json.dump({"release_file": "torchtitan/models/llama4/model/model.py", "shapes": SHAPES, "rope_scaling": SCALING,
               "batch": BATCH, "seq": SEQ, "eos_id": EOS_ID, "num_experts": 4, "cases": cases}, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
