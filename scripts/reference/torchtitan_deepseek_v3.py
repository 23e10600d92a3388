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
# (name, q_lora_rank, original_seq_len, routing, mtp_layers): original_seq_len 8 < max_seq_len 16
# turns YaRN on.
CASES = [
    ("q_direct_sigmoid_groups", 0, 4096, "sigmoid", 0),
    ("q_lora_yarn_sigmoid_groups", 8, 8, "sigmoid", 0),
    ("q_lora_softmax_shared2", 8, 4096, "softmax", 0),
    ("q_direct_yarn_softmax_shared2", 0, 8, "softmax", 0),
    ("q_lora_sigmoid_groups_mtp2", 8, 4096, "sigmoid", 2),
]
# Multi-token prediction's loss on the last case's logits: labels the tokens shifted by one, the
# rows packing documents (their positions restart at each), the depths' weight mtp_scale.
MTP_DOCUMENTS = [[0] * 5 + [1] * 7, [0] * 8 + [1] * 4]
MTP_SCALE = 0.3
IGNORE_INDEX = -100


# torchtitan main's multi-token prediction (torchtitan/models/deepseek_v3/mtp.py, after 0.2.2),
# written out on the release's TransformerBlock: roll_mtp_sequence, MTPTransformerBlock,
# MTPDecoder.forward and MTPLoss, per row of a [batch, seq] tensor.
def roll_mtp_sequence(sequence, shift, fill_value, positions=None):
    """Row by row: position i takes sequence[i + shift] when it exists and, given positions,
    when positions[i + shift] == positions[i] + shift (the same document); else fill_value."""
    seq_len = sequence.shape[1]
    rolled = torch.full_like(sequence, fill_value)
    valid = torch.zeros_like(sequence, dtype=torch.bool)
    valid[:, :seq_len - shift] = True if positions is None else (
        positions[:, shift:] == positions[:, :seq_len - shift] + shift)
    rolled[:, :seq_len - shift] = torch.where(valid[:, :seq_len - shift], sequence[:, shift:],
                                              rolled[:, :seq_len - shift])
    return rolled, valid


def mtp_block_class(model_module, dim, norm_eps):
    class MTPTransformerBlock(model_module.TransformerBlock):
        def __init__(self, layer_id, args):
            super().__init__(layer_id, args)
            self.enorm = torch.nn.RMSNorm(dim, eps=norm_eps)
            self.hnorm = torch.nn.RMSNorm(dim, eps=norm_eps)
            self.eh_proj = torch.nn.Linear(2 * dim, dim, bias=False)
            self.mtp_norm = torch.nn.RMSNorm(dim, eps=norm_eps)

        def forward(self, mtp_input_embed, prev_embed, mtp_input_valid_mask, freqs_cis):
            prev_embed = prev_embed * mtp_input_valid_mask.unsqueeze(-1).to(dtype=prev_embed.dtype)
            h = self.eh_proj(torch.cat([self.enorm(mtp_input_embed), self.hnorm(prev_embed)], dim=-1))
            return self.mtp_norm(super().forward(h, freqs_cis, None))
    return MTPTransformerBlock


def mtp_forward(model, tokens):
    """MTPDecoder.forward: the logits of the main prediction and of every depth."""
    h = model.tok_embeddings(tokens)
    for layer in model.layers.values():
        h = layer(h, model.freqs_cis, None)
    outputs, previous = [model.norm(h)], h
    for depth, layer in enumerate(model.mtp_layers, 1):
        mtp_tokens, valid = roll_mtp_sequence(tokens, depth, 0)
        previous = layer(model.tok_embeddings(mtp_tokens), previous, valid, model.freqs_cis)
        outputs.append(previous)
    return [model.output(o) for o in outputs]


def mtp_loss(preds, labels, positions, scale):
    """MTPLoss without the division by the token count: main + scale * mean of the depths' sums."""
    def ce(pred, target):
        return torch.nn.functional.cross_entropy(pred.flatten(0, 1).float(), target.flatten(0, 1), reduction="sum",
                                                 ignore_index=IGNORE_INDEX)
    depths = [ce(pred, roll_mtp_sequence(labels, k, IGNORE_INDEX, positions)[0]) for k, pred in enumerate(preds[1:], 1)]
    return ce(preds[0], labels) + scale * sum(depths) / len(depths)


def main():
    count_histc_in_float()
    model_module, moe_module = load_release_model("deepseek_v3", "DeepSeekV3ModelArgs", sys.argv[1], sys.argv[2])
    cases = []
    for case, q_lora_rank, original_seq_len, routing, mtp_layers in CASES:
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
        if mtp_layers:  # each depth declared as the last block (torchtitan's _build_mtp_layers)
            block = mtp_block_class(model_module, SHAPES["dim"], SHAPES["norm_eps"])
            model.mtp_layers = torch.nn.ModuleList([block(SHAPES["n_layers"] - 1, args) for _ in range(mtp_layers)])
        named = dict(model.named_parameters())
        names = sorted(named)
        with torch.no_grad():
            for k, name in enumerate(names, start=1):
                p = named[name]
                if name.endswith("norm.weight"):
                    p.copy_(values(list(p.shape), k, 0.1, ones=True))
                else:
                    p.copy_(values(list(p.shape), k, 1.0 if name == "tok_embeddings.weight" else 0.2))
            # A bias that changes choices; a depth's as its layer id in titan (n_layers + k).
            blocks = list(model.layers.values()) + (list(model.mtp_layers) if mtp_layers else [])
            for layer_id, layer in enumerate(blocks):
                if layer.moe_enabled:
                    layer.moe.expert_bias.copy_(values([4], 500 + layer_id, 0.2))
                    layer.moe.tokens_per_expert.zero_()
        tokens = torch.tensor([(7 * i + 3) % SHAPES["vocab_size"] for i in range(BATCH * SEQ)]).view(BATCH, SEQ)
        if mtp_layers:  # every depth's logits stacked on the batch dim, as titan returns them
            preds = mtp_forward(model, tokens)
            logits = torch.cat(preds, 0)
            labels = torch.roll(tokens, -1, 1)
            documents = torch.tensor(MTP_DOCUMENTS)
            positions = torch.stack([torch.tensor([i - row.index(d) for i, d in enumerate(row)]) for row in MTP_DOCUMENTS])
            with torch.no_grad():
                loss = mtp_loss([p.detach() for p in preds], labels, positions, MTP_SCALE)
            mtp = {"labels": labels.tolist(), "documents": documents.tolist(), "scale": MTP_SCALE,
                   "loss_sum": loss.item()}
        else:
            logits = model(tokens)
        logits.backward(values(list(logits.shape), 99, 1.0))
        cases.append({
            "case": case,
            "mtp_layers": mtp_layers,
            "q_lora_rank": q_lora_rank,
            "original_seq_len": original_seq_len,
            "routing": routing,
            "softmax_scale": model.layers["0"].attention.softmax_scale,
            "tokens_per_expert": [layer.moe.tokens_per_expert.tolist() for layer in blocks if layer.moe_enabled],
            "parameters": names,
            "logits": logits.detach().flatten().tolist(),
            "grads": {name: [named[name].grad.double().norm().item(),
                             (named[name].grad.double() *
                              values(list(named[name].shape), 1000 + k, 1.0).double()).sum().item()]
                      for k, name in enumerate(names, start=1)},
            **({"mtp_loss": mtp} if mtp_layers else {}),
        })
    json.dump({"release_file": "torchtitan/models/deepseek_v3/model/model.py", "shapes": SHAPES, "batch": BATCH,
               "seq": SEQ, "cases": cases}, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
