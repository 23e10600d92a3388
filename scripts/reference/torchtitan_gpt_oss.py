#!/usr/bin/env python3
"""Runs torchtitan's own gpt-oss model (torchtitan/models/gpt_oss/model/model.py of a release)
forward and backward on deterministic weights and tokens, and writes what it computed as the JSON
fixture that tests/test_gpt_oss.cpp compares titan's Transformer with.

    torchtitan_gpt_oss.py MODEL_PY GPT_OSS_MOE_PY MOE_PY ATTENTION_PY > tests/fixtures/torchtitan/v0.2.2/gpt_oss_model.json

MODEL_PY, GPT_OSS_MOE_PY, MOE_PY and ATTENTION_PY are torchtitan/models/gpt_oss/model/model.py,
torchtitan/models/gpt_oss/model/moe.py, torchtitan/models/moe/moe.py and
torchtitan/models/attention.py of that release (`git show v0.2.2:<path>` in a torchtitan clone,
saved to files). They run with stand-ins for their other torchtitan imports
(torchtitan_release.py): FlexAttention is evaluated as a softmax under the dense mask the
release's own mask mods give (causal, document, sliding window: its attention.py runs unchanged),
returning the log-sum-exp the sinks rescale by; the arguments a namespace with GptOssModelArgs'
fields. Two stand-in lines: the Attention asserts its mask is a FlexAttention BlockMask, which the
dense stand-in is not (`assert isinstance(attention_masks, BlockMask)` becomes a check that it is
a tensor); and block_causal gets the causal mask with the document mask (see CAUSAL_DOCUMENTS). The model's blocks are built in bfloat16 (`.to(torch.bfloat16)`); the script runs them
in float32, as titan's test does.

Weights, tokens and the fixture's contents follow torchtitan_qwen3.py's recipe: parameter `name`
(sorted, index k from 1) is value(i) = scale * sin(1.7 i + k) over its flat index (scale 0.2, the
embedding 1, PARAMETER_SCALES' names theirs; norm weights
1 + 0.1 sin(...)), float64 rounded to float32; a swiglu_limit of 0.3, inside the experts'
pre-activations' spread (~1 here), so that the clamp acts on both halves; tokens (7 i + 3) mod vocab; per
parameter the gradient's norm and its dot product with value(i) of seed 1000 + k. Each MoE layer's
expert_bias is value(i) of seed 500 + layer, scale 0.2; the tokens per expert are recorded. Cases:
causal and block-causal (token EOS_ID ends a document inside row 0), a window of 4 on the even
blocks (shorter than the documents and the rows), YaRN as the flavors set it.
"""
import json
import sys
import types

import torch

from torchtitan_release import count_histc_in_float, load_release_model, values

SHAPES = dict(vocab_size=64, dim=32, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=8, moe_inter_dim=16,
              norm_eps=1e-5, swiglu_limit=0.3, sliding_window_size=4, max_seq_len=16, original_seq_len=4096,
              rope_theta=150000.0, rope_factor=32.0, ntk_alpha=1.0, ntk_beta=32.0)
MOE = dict(num_experts=4, num_shared_experts=0, score_func="softmax", route_norm=True, route_scale=1.0,
           gate_bias=True, score_before_experts=False, top_k=2, use_grouped_mm=False, load_balance_coeff=1e-3)
# The sin-valued weights are coherent, not random: at 0.2, q and k add up along the rows into
# attention logits of +-50 (lse up to 52 in layer 0), a near one-hot softmax whose float32
# rounding (ulp(50) = 4e-6 per logit) is amplified into the gradients, and a sink probability of
# 1e-9 that tests nothing. At 0.05 the logits are O(1), as in training's early steps, and every
# sink takes a share of its rows.
PARAMETER_SCALES = {"attention.wq.weight": 0.05, "attention.wk.weight": 0.05}
BATCH, SEQ = 2, 12
EOS_ID = 38  # token 5 of row 0: documents [0, 6) and [6, 12) there, row 1 one document
CASES = [("causal", "causal"), ("block_causal", "block_causal")]
FIX = ("assert isinstance(attention_masks, BlockMask), attention_masks",
       "assert isinstance(attention_masks, torch.Tensor), attention_masks")
# torchtitan 0.2.2's block_causal masks for gpt-oss are the document mask alone: its full-attention
# (odd) blocks then see the later tokens of their document (the sliding-window blocks stay causal
# through the window's own kv <= q). torchtitan's main branch since fixed it (causal + document);
# titan is causal within documents in every block, so the script and-s the causal mask in too.
CAUSAL_DOCUMENTS = ("""                basic_mask_mods.append(
                    get_document_mask_mod(input_batch, tokenizer.eos_id)
                )""", """                basic_mask_mods.append(get_causal_mask_mod())
                basic_mask_mods.append(
                    get_document_mask_mod(input_batch, tokenizer.eos_id)
                )""")


def main():
    count_histc_in_float()
    model_module, moe_module = load_release_model("gpt_oss", "GptOssModelArgs", sys.argv[1], sys.argv[3],
                                                  attention_py=sys.argv[4], fixes=[FIX, CAUSAL_DOCUMENTS], siblings=[("moe", sys.argv[2])])
    # How often the clamp acts (recorded in the fixture): the release's swiglu, counted.
    experts_module = sys.modules["torchtitan.models.gpt_oss.model.moe"]
    release_swiglu, clamped = experts_module.swiglu, []

    def counted_swiglu(x, alpha=1.702, limit=7.0):
        clamped.append([(x[..., ::2] > limit).float().mean().item(), (x[..., 1::2].abs() > limit).float().mean().item()])
        return release_swiglu(x, alpha=alpha, limit=limit)
    experts_module.swiglu = counted_swiglu
    cases = []
    for name, mask_type in CASES:
        clamped.clear()
        args = types.SimpleNamespace(**SHAPES, attn_mask_type=mask_type, attn_type="flex",
                                     moe_args=moe_module.MoEArgs(**MOE))
        torch.manual_seed(0)
        model = model_module.GptOssModel(args).float()
        named = dict(model.named_parameters())
        names = sorted(named)
        with torch.no_grad():
            for k, pname in enumerate(names, start=1):
                p = named[pname]
                if pname.endswith("norm.weight"):
                    p.copy_(values(list(p.shape), k, 0.1, ones=True))
                else:
                    scale = 1.0 if pname == "tok_embeddings.weight" else 0.2
                    scale = next((s for suffix, s in PARAMETER_SCALES.items() if pname.endswith(suffix)), scale)
                    p.copy_(values(list(p.shape), k, scale))
            for layer_id, layer in model.layers.items():  # a bias that changes choices
                layer.moe.expert_bias.copy_(values([MOE["num_experts"]], 500 + int(layer_id), 0.2))
                layer.moe.tokens_per_expert.zero_()
        tokens = torch.tensor([(7 * i + 3) % SHAPES["vocab_size"] for i in range(BATCH * SEQ)]).view(BATCH, SEQ)
        masks = model.get_attention_masks(tokens, types.SimpleNamespace(eos_id=EOS_ID))
        logits = model(tokens, masks)
        logits.backward(values(list(logits.shape), 99, 1.0))
        cases.append({
            "name": name,
            "attn_mask_type": mask_type,
            "tokens_per_expert": [layer.moe.tokens_per_expert.tolist() for layer in model.layers.values()],
            "clamped_fraction": clamped[:],  # per expert call: [gate above the limit, linear outside it]
            "parameters": names,
            "logits": logits.detach().flatten().tolist(),
            "grads": {pname: [named[pname].grad.double().norm().item(),
                              (named[pname].grad.double() *
                               values(list(named[pname].shape), 1000 + k, 1.0).double()).sum().item()]
                      for k, pname in enumerate(names, start=1)},
        })
    json.dump({"release_file": "torchtitan/models/gpt_oss/model/model.py", "shapes": SHAPES, "moe": MOE,
               "batch": BATCH, "seq": SEQ, "eos_id": EOS_ID,
               "parameter_scales": PARAMETER_SCALES, "cases": cases}, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
