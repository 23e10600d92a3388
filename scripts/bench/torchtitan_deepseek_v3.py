"""torchtitan's own DeepSeek-V3 model (torchtitan 0.2.2's `DeepSeekV3Model`: latent attention,
dense then MoE blocks) in a single-process training loop: the peer titan is measured against in
scripts/bench_moe.sh.

Same JSON line as scripts/bench/torchtitan_llama.py (tps, step_s, first_step_s, peak_rss_bytes,
...). The model is built as torchtitan's trainer builds it (meta device, `to_empty`,
`init_weights`) with the shapes of titan's flavor of the same name (model/deepseek_v3/family.cpp:
titan's `debugmodel_small`, and torchtitan's `debugmodel`), the vocabulary of titan's byte
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

# titan's flavors (model/deepseek_v3/family.cpp): DeepSeekV3ModelArgs' fields and the MoE's.
FLAVORS = {
    "debugmodel_small": dict(
        model=dict(dim=128, inter_dim=384, moe_inter_dim=64, n_layers=4, n_dense_layers=1, n_heads=4, q_lora_rank=32,
                   kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, mscale=0.70),
        moe=dict(num_experts=8, num_shared_experts=1, top_k=2, score_func="sigmoid", route_norm=True, route_scale=2.5,
                 num_expert_groups=4, num_limited_groups=2, score_before_experts=False)),
    "debugmodel": dict(
        model=dict(dim=256, inter_dim=1024, moe_inter_dim=256, n_layers=6, n_dense_layers=1, n_heads=16, q_lora_rank=0,
                   kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, mscale=0.70),
        moe=dict(num_experts=8, num_shared_experts=2, top_k=3, score_func="softmax", route_norm=False,
                 score_before_experts=False)),
}


def main():
    a = parse_args(FLAVORS, "debugmodel_small")
    import torch
    tt_model, tt_args, tt_moe, version = load_torchtitan_family("deepseek_v3")
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    flavor = FLAVORS[a.flavor]
    margs = tt_args.DeepSeekV3ModelArgs(vocab_size=a.vocab, max_seq_len=a.seq_len, **flavor["model"],
                                        moe_args=tt_moe.MoEArgs(**flavor["moe"], use_grouped_mm=a.experts == "grouped"))
    margs.moe_impl = "standard"  # update_from_config's default (expert_parallel_comm_backend)
    train_and_report(lambda: tt_model.DeepSeekV3Model(margs), a, version, PROCESS_START)


if __name__ == "__main__":
    main()
