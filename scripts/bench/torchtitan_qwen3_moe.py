"""torchtitan's own Qwen3-MoE model (torchtitan 0.2.2's `Qwen3Model` with its `MoE` layers) in a
single-process training loop: the peer titan is measured against in scripts/bench_moe.sh.

Same JSON line as scripts/bench/torchtitan_llama.py (tps, step_s, first_step_s, peak_rss_bytes,
...). The model is built as torchtitan's trainer builds it (meta device, `to_empty`,
`init_weights`) with the shapes of titan's flavor of the same name (model/qwen3/family.cpp:
torchtitan's `debugmodel_moe`, and titan's `moe_100M_active`), the vocabulary of titan's byte
tokenizer (258), and the step is torchtitan's without parallelism: zero_grad, forward, the summed
cross entropy / tokens, backward, clip_grad_norm_(1.0, foreach), torchtitan's MoE load-balancing
optimizer pre-hook (`_update_expert_bias`: counts, sign, zero-mean delta), then
AdamW(fused=True) with torchtitan's defaults (scripts/bench/torchtitan_moe_peer.py).

--experts loop (default) runs torchtitan's for-loop experts (MoEArgs.use_grouped_mm = False), the
form titan's CPU path also takes; --experts grouped runs torch._grouped_mm (torchtitan's default
on GPUs). On the CPU in torch 2.11 the grouped form's backward fails; the JSON line then holds
"error" with the exception, which bench_moe.sh prints as n/a.
"""
import time

PROCESS_START = time.perf_counter()

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torchtitan_moe_peer import load_torchtitan_family, parse_args, train_and_report  # noqa: E402

# titan's flavors (model/qwen3/family.cpp): dim, n_layers, n_heads, n_kv_heads, head_dim,
# hidden_dim (dense, unused by MoE blocks), num_experts, top_k, moe_inter_dim.
FLAVORS = {
    "debugmodel_moe": (256, 8, 16, 8, 128, 3072, 64, 8, 768),
    "moe_100M_active": (512, 14, 4, 2, 128, 1536, 8, 2, 2048),
}


def main():
    a = parse_args(FLAVORS, "debugmodel_moe")
    import torch
    tt_model, tt_args, tt_moe, version = load_torchtitan_family("qwen3")
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    dim, n_layers, n_heads, n_kv, head_dim, hidden, experts, top_k, moe_inter = FLAVORS[a.flavor]
    margs = tt_args.Qwen3ModelArgs(
        vocab_size=a.vocab, max_seq_len=a.seq_len, head_dim=head_dim, dim=dim, n_layers=n_layers, n_heads=n_heads,
        n_kv_heads=n_kv, qk_norm=True, hidden_dim=hidden, rope_theta=1000000, moe_enabled=True,
        moe_inter_dim=moe_inter,
        moe_args=tt_moe.MoEArgs(num_experts=experts, num_shared_experts=0, top_k=top_k, score_func="softmax",
                                route_norm=True, route_scale=1.0, score_before_experts=False,
                                use_grouped_mm=a.experts == "grouped"))
    train_and_report(lambda: tt_model.Qwen3Model(margs), a, version, PROCESS_START)


if __name__ == "__main__":
    main()
