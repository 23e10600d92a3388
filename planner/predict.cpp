// planner/predict.cpp — see predict.h.
//
// Note [Step-time model]: one step of one rank, from first principles and the cluster's figures
// (planner/cluster.h); nothing here is fitted to a published throughput.
//   Compute. Per micro-batch and pipeline stage, a rank's tokens are rows x seq_len / cp; its
//     matmul FLOPs are 2 x (the block's active parameters) per token and layer, plus the output
//     layer's 2 x dim x vocab on the last stage, divided by tp; attention is a third of its
//     family's training count per token and layer (4 x heads x head_dim x seq_len forward for
//     grouped-query attention, torchtitan's count). Backward is twice the forward,
//     half of it the weight gradients (the W of zero-bubble schedules); attention's backward is
//     the device's attention_backward_ratio times its forward (a flash kernel recomputes the
//     scores: 2.5). GEMMs run at the bf16 peak x the GEMM efficiency, attention at that x the
//     device's attention efficiency at the kernel's query length, seq_len / cp (device cpu:
//     measured by length); a float8 recipe's block linears at the float8 peak.
//   Memory-bound work. Forward elementwise traffic per token and layer: 16 x dim + 3 x hidden
//     elements of the compute dtype (two RMSNorms, RoPE on q and k, two residual adds, SwiGLU,
//     the attention layout copies), divided by tp (sequence parallel); backward twice that. A
//     float8 recipe adds its casts: 5 bytes per element cast (amax read, cast read, 1-byte write)
//     of the four distinct linear inputs forward, and of the outputs' gradients and a transposed
//     input copy backward; each weight is cast once per micro-batch. The optimizer reads and
//     writes 28 bytes per local parameter (float32 AdamW over a float32 gradient; titan's
//     one-pass update over a bf16 compute copy reads a 2-byte gradient and writes a 2-byte copy:
//     28 too), at the optimizer's streaming efficiency; the rest at the elementwise kernels'
//     (planner/cluster.cpp says how each was measured).
//   Recompute. Full AC runs every block's forward again in backward, its collectives and
//     operator dispatch included; per-op (selective) AC keeps attention, every other matmul
//     output and the reduce-scatters and all-to-alls (torchtitan's op list), so it recomputes
//     half the block matmuls, all the elementwise work and the TP all-gathers.
//   Communication, each collective over the link its group crosses (the mesh is pp, dp_replicate,
//     dp_shard, cp, tp from outermost to innermost, ranks filling nodes in order: a group leaves
//     its node when stride x size > GPUs per node), bytes / (bandwidth x link efficiency) plus
//     the fixed cost of g - 1 messages for a ring over g ranks (one for a pipeline transfer);
//     each kind at its own bus bandwidth (DeviceSpec::BusRatios: alike on GPUs, Gloo's
//     reduce-scatter and all-reduce differ from its all-gather):
//     TP: per layer two all-gathers and two reduce-scatters of the activations forward, as many
//       backward, (tp - 1) / tp of rows x seq / cp x dim each; exposed unless async TP, which
//       hides them behind the layer's matmuls (exposed: what exceeds them).
//     CP: allgather gathers K and V per layer forward, gathers them again backward and
//       reduce-scatters their float32 gradients; alltoall passes K and V around the ring (cp - 1
//       steps) each way and the float32 gradient accumulators cp steps backward, each step in
//       flight while the block at hand computes (exposed: what a step exceeds its block; on the
//       CPU at CP 2, seq 2,048: 80 ms exposed per step, where charging it all gave 263 ms);
//       titan_ulysses moves q, k, v and the output per layer each way. Exposed.
//     FSDP (dp_shard x cp ranks): each layer's parameters gathered forward and again backward
//       (bf16), gradients reduce-scattered in float32, per micro-batch; titan prefetches the next
//       layer's gather during this layer's compute, so a layer exposes only what its transfer
//       exceeds the previous layer's compute, plus the first layer's whole gather; the last
//       block stays gathered for backward. The embedding and norm + output are groups of their
//       own (with a 128k vocabulary, two thirds of a 100M model's parameters): the embedding
//       gathered first (exposed), again in backward unless tied, and reduce-scattered last
//       (exposed); norm + output gathered once. Under pp, once per step (gathered parameters and
//       unsharded gradients stay), exposed; the rank with the most bytes sets it.
//     HSDP: the gradient shard all-reduced across replicas once per step, in buckets of 64 MiB
//       (2 (r - 1) / r of the bytes, a ring's 2 (r - 1) messages per bucket: reduce-scatter
//       then all-gather; the copies into the kept bucket and back at the memory's rate).
//     EP: the MoE dispatch and combine all-to-alls, forward and backward; at precision
//       rowwise the forward dispatch carries e4m3 rows + a scale each (D + 4 bytes). Exposed.
//     PP: one activation (or its gradient) per micro-batch and stage boundary, inside the
//       pipeline simulation: in flight beside the compute on GPUs; where transfers run on the
//       compute's cores, its bytes are work on the sending and the receiving rank (added to the
//       F and B of each stage with a neighbour on another rank) and only its fixed cost is in
//       flight.
//   Pipeline idle: planner/pipeline_sim.h runs the schedule's own order with these stage costs;
//     where ranks share fewer cores (device cpu), a waiting rank's share speeds up the others.
//   Where the transfers run on the compute's cores (device cpu: Gloo), nothing overlaps: FSDP's
//     gathers and async TP's traffic are exposed whole; and where the host waits for each
//     operator (device cpu), every layer and micro-batch pays its operators' dispatch (so more,
//     smaller micro-batches cost more than the same rows in fewer).
// Step = gradient-accumulation passes x (micro-batches' compute + exposed communication, or the
// simulated pipeline pass) + FSDP under pp (once per step) + HSDP all-reduce + optimizer.
#include "planner/predict.h"
#include "model/param_path.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "model/family.h"
#include "parallel/parallel_model.h"
#include "planner/pipeline_sim.h"

namespace titan::planner {
namespace {

struct LayerWork {
  double gemm_fwd = 0;       // seconds, the block's matmuls forward
  double attention_fwd = 0;
  double attention_bwd = 0;  // attention_backward_ratio x the forward (cluster.h)
  double memory_fwd = 0;     // elementwise forward
  double memory_bwd = 0;     // elementwise + float8 casts backward
  double tp_comm = 0;        // one direction
  double cp_comm = 0;        // forward
  double cp_comm_b = 0;      // backward
  double ep_comm = 0;        // forward: dispatch + combine
  double ep_comm_b = 0;      // backward: their adjoints (high precision)
  double fsdp_gather = 0;
  double fsdp_reduce_scatter = 0;
};

// Operators the host dispatches per layer and micro-batch, forward and backward (views, copies,
// autograd nodes and kernels): titan's debug model under HSDP, one micro-batch, no AC, profiled
// on the CPU: 3,922 operators in a step of 6 layers (2026-11-27); the embedding, loss and
// optimizer's share is counted with the layers.
constexpr double kOpsPerLayer = 650;

// Whether a group of `size` ranks `stride` apart stays inside one node.
bool within_node(int64_t stride, int64_t size, int64_t gpus_per_node) { return stride * size <= gpus_per_node; }

}  // namespace

Prediction predict(const trainer::config::JobConfig& cfg, const trainer::config::CheckedLayout& checked,
                   const model::ModelArgs& args, const Layout& L, const Cluster& cluster) {
  Prediction p;
  const DeviceSpec& d = cluster.device;
  const auto& dims = checked.dims;
  const double seq = static_cast<double>(cfg.training.seq_len);
  const double bytes = cfg.training.mixed_precision_param == "float32" ? 4.0 : 2.0;
  const double dim = static_cast<double>(args.dim), hidden = static_cast<double>(args.ffn_hidden_dim());
  // The attention's widths as its family declares them (the last block's, whole, per token):
  // its projections' outputs, q, and k + v (what context parallelism moves).
  model::AttentionActivationsQuery whole;
  whole.compute_bytes = static_cast<int64_t>(bytes);
  whole.seq_len = cfg.training.seq_len;
  const model::AttentionActivations att =
      model::family(args.family).attention_activations(args, args.n_layers - 1, whole);
  double attention_outputs = 0;  // q, k, v, o for grouped-query attention
  for (double width : att.matmul_outputs) attention_outputs += width;
  const double q_dim = att.q_width, kv = att.kv_width;
  // Attention's forward FLOPs per token and layer: a third of the training count (the backward
  // is twice the forward), 4 x heads x head_dim x seq_len for grouped-query attention.
  const double attention_fwd_per_token =
      model::attention_flops_per_token(args, cfg.training.seq_len) / (3.0 * static_cast<double>(args.n_layers));
  const double vocab = static_cast<double>(args.vocab_size);
  const double layers = static_cast<double>(args.n_layers);
  const model::ParamCount count = model::count_params(args);
  const double output_params = dim * vocab;
  const double block_active =
      std::max(0.0, static_cast<double>(count.active - count.embedding) - (args.tie_embeddings ? 0.0 : output_params)) /
      layers;
  const double block_params_all = static_cast<double>(count.per_layer);
  const bool float8 = L.precision != "bf16";
  const double mm_rate = d.peak_bf16 * d.gemm_efficiency;
  const double linear_rate = (float8 && d.peak_fp8 > 0 ? d.peak_fp8 : d.peak_bf16) * d.gemm_efficiency;
  const double hbm = d.hbm_bytes_per_s * d.hbm_efficiency;
  const double tp = dims.tp, cp = dims.cp, fsdp = dims.dp_shard_cp();
  // The figures measured for a group of `size` ranks (device cpu), or null: then the device's.
  auto measured = [&](int64_t size) -> const DeviceSpec::GroupLink* {
    const auto it = d.group_links.find(size);
    return it != d.group_links.end() ? &it->second : nullptr;
  };
  // The bus bandwidth of a `kind` collective over a group of `size` ranks `stride` apart whose
  // whole (gathered or reduced) tensor is `message` bytes: measured for `among` ranks (by default
  // its size) where the cluster has that figure (device cpu), else the link the group crosses.
  auto bus = [&](Collective kind, int64_t stride, int64_t size, double message, int64_t among = 0) {
    if (const auto* m = measured(among > 0 ? among : size)) return m->bus_bytes_per_s(kind, message) * d.link_efficiency;
    const bool inside = within_node(stride, size, cluster.gpus_per_node);
    return (inside ? d.intra_node_bytes_per_s : d.inter_node_bytes_per_s) * d.bus_ratios.of(kind) * d.link_efficiency;
  };
  auto message_latency = [&](double size) {
    const auto* m = measured(static_cast<int64_t>(size));
    return m ? m->message_latency_s : d.message_latency_s;
  };
  // A pipeline transfer is between two ranks (the slowest hop: across nodes if pp spans them).
  auto pp_bus = [&](double message) {
    return bus(Collective::kAllGather, cluster.world() / std::max(1, dims.pp), dims.pp, message, 2);
  };

  // One micro-batch's rows and how many micro-batches one step runs per rank.
  const int64_t rows = checked.pipeline ? checked.pipeline->microbatch_rows : cfg.training.local_batch_size;
  const int64_t micro_per_pass = checked.pipeline ? checked.pipeline->microbatches : 1;
  const int64_t passes = checked.global_batch / (cfg.training.local_batch_size * dims.dp());
  const double tokens = static_cast<double>(rows) * seq / cp;  // this rank's, one micro-batch

  // The routed experts' share of a block's active parameters: in float8 only where an expert
  // recipe exists for the precision (rowwise: quantize.grouped_mm.float8, which the layout's
  // command turns on, Layout::options); a tensorwise layout's experts run in bf16.
  double expert_active = 0;
  if (args.moe) {
    const model::Family& family = model::family(args.family);
    int64_t moe_blocks = 0;
    for (int64_t layer = 0; layer < args.n_layers; ++layer)
      moe_blocks += family.feed_forward(args, layer) == model::FeedForwardKind::kMoE ? 1 : 0;
    expert_active = 3.0 * dim * static_cast<double>(args.moe_hidden_dim) * static_cast<double>(args.moe->top_k) *
                    static_cast<double>(moe_blocks) / layers;
  }
  const double expert_rate = L.precision == "rowwise" ? linear_rate : mm_rate;
  LayerWork w;
  w.gemm_fwd = tokens * 2.0 * ((block_active - expert_active) / linear_rate + expert_active / expert_rate) / tp;
  // The attention kernel's query length: the sequence, or under CP a rank's seq / cp (its ring
  // blocks are that many queries against as many or half as many keys).
  w.attention_fwd = tokens * attention_fwd_per_token / tp / (mm_rate * d.attention_efficiency_at(seq / cp));
  w.attention_bwd = d.attention_backward_ratio * w.attention_fwd;
  const double elementwise = (16.0 * dim + 3.0 * hidden) * bytes;
  double cast_fwd = 0, cast_bwd = 0, weight_casts = 0;
  if (float8) {
    cast_fwd = 5.0 * (3.0 * dim + hidden);
    cast_bwd = 5.0 * (attention_outputs + dim + 2.0 * hidden) + 3.0 * (3.0 * dim + hidden);
    weight_casts = 2.0 * 5.0 * block_params_all / tp;
  }
  w.memory_fwd = (tokens * (elementwise + cast_fwd) / tp + weight_casts / 2.0) / hbm;
  w.memory_bwd = (tokens * (2.0 * elementwise + cast_bwd) / tp + weight_casts / 2.0) / hbm;
  const double act = tokens * dim * bytes;
  // A ring collective over g ranks: g - 1 messages' fixed cost before its bytes.
  auto messages = [&](double g) { return (g - 1.0) * message_latency(g); };
  // TP, either direction: two all-gathers and two reduce-scatters.
  if (dims.tp > 1)
    w.tp_comm = 2.0 * act * (tp - 1) / tp *
                    (1.0 / bus(Collective::kAllGather, 1, dims.tp, act) + 1.0 / bus(Collective::kReduceScatter, 1, dims.tp, act)) +
                4.0 * messages(tp);
  if (dims.cp > 1) {
    // This rank's K and V (compute dtype) and their gradients (float32 accumulators).
    const double kv_local = tokens * kv / tp * bytes, dkv_local = kv_local / bytes * 4.0;
    auto cp_bus = [&](Collective kind, double message) { return bus(kind, dims.tp, dims.cp, message); };
    if (L.cp_method == "allgather") {
      // K and V gathered forward; backward gathers them again and reduce-scatters the float32
      // gradients of every rank's block.
      const double gather = (cp - 1) * kv_local / cp_bus(Collective::kAllGather, cp * kv_local);
      w.cp_comm = gather + messages(cp);
      w.cp_comm_b = gather + (cp - 1) * dkv_local / cp_bus(Collective::kReduceScatter, cp * dkv_local) + 2.0 * messages(cp);
    } else if (L.cp_method == "alltoall") {
      // The ring: cp - 1 steps passing K and V on, each step's transfer in flight while the
      // block of the K/V at hand computes (a cp-th of the rank's attention: the blocks are
      // equal, Note [Ring attention]); backward passes them again with each block's float32
      // gradient accumulator, which a last step hands to its owner. Each step is one message of
      // the group's ring (its fixed cost: the group's). Exposed: what a transfer exceeds its block.
      const double kv_step = kv_local / cp_bus(Collective::kAllGather, kv_local) + message_latency(cp);
      const double dkv_step = dkv_local / cp_bus(Collective::kAllGather, dkv_local) + message_latency(cp);
      w.cp_comm = (cp - 1) * std::max(0.0, kv_step - w.attention_fwd / cp);
      w.cp_comm_b = (cp - 1) * std::max(0.0, kv_step + dkv_step - w.attention_bwd / cp) + dkv_step;
    } else {  // titan_ulysses: q, k, v to head shards and the output back, each way (four
              // all-to-alls, each about a quarter of the bytes)
      const double moved = tokens * (q_dim + att.output + kv) * bytes / tp;
      w.cp_comm = w.cp_comm_b = moved * (cp - 1) / cp / cp_bus(Collective::kAllGather, moved / 4.0) + 4.0 * messages(cp);
    }
  }
  if (dims.ep > 1 && args.moe) {
    // Each routed row to its expert's rank and back, forward and backward. Rowwise experts
    // dispatch forward in float8 (the layout's command turns it on): e4m3 + a float32 scale per
    // row; the combine and both adjoints stay in the compute dtype.
    const double routed_rows = tokens * static_cast<double>(args.moe->top_k);
    auto all_to_all = [&](double row_bytes) {
      const double moved = routed_rows * row_bytes;
      return moved * (dims.ep - 1.0) / dims.ep / bus(Collective::kAllGather, dims.tp, dims.ep, moved) +
             messages(static_cast<double>(dims.ep));
    };
    const double dispatch_row = L.precision == "rowwise" ? dim + 4.0 : dim * bytes;
    w.ep_comm = all_to_all(dispatch_row) + all_to_all(dim * bytes);
    w.ep_comm_b = 2.0 * all_to_all(dim * bytes);
  }
  // FSDP's gather (compute dtype) and gradient reduce-scatter (float32) of `params` parameters.
  const int64_t fsdp_ranks = dims.dp_shard_cp();
  auto fsdp_gather_of = [&](double params) {
    const double full = params * bytes;
    return fsdp > 1 ? full * (fsdp - 1) / fsdp / bus(Collective::kAllGather, dims.tp, fsdp_ranks, full) + messages(fsdp)
                    : 0.0;
  };
  auto fsdp_reduce_scatter_of = [&](double params) {
    const double full = params * 4.0;
    return fsdp > 1 ? full * (fsdp - 1) / fsdp / bus(Collective::kReduceScatter, dims.tp, fsdp_ranks, full) + messages(fsdp)
                    : 0.0;
  };
  w.fsdp_gather = fsdp_gather_of(block_params_all / tp);
  w.fsdp_reduce_scatter = fsdp_reduce_scatter_of(block_params_all / tp);
  // The embedding's group and norm + output's: as large as all the blocks together in a small
  // model with a 128k vocabulary. A tied embedding's group stays gathered until the output's
  // backward (one gather; the output's group is the norm alone); untied, the embedding is
  // resharded after forward and gathered again in backward, and norm + output stay gathered.
  const double embedding_params = static_cast<double>(count.embedding) / tp;
  const double head_params = (dim + (args.tie_embeddings ? 0.0 : output_params)) / tp;
  const double embedding_gather = fsdp_gather_of(embedding_params);
  const double embedding_regather = args.tie_embeddings ? 0.0 : embedding_gather;  // backward
  const double embedding_reduce_scatter = fsdp_reduce_scatter_of(embedding_params);
  const double head_gather = fsdp_gather_of(head_params), head_reduce_scatter = fsdp_reduce_scatter_of(head_params);

  // Async TP hides a direction's TP traffic behind that direction's matmuls (backward: twice),
  // unless the transfers need the compute's own cores.
  const bool overlap = !d.comm_shares_compute;
  const double tp_exposed = L.async_tp && overlap ? std::max(0.0, w.tp_comm - w.gemm_fwd) : w.tp_comm;
  const double tp_b_exposed = L.async_tp && overlap ? std::max(0.0, w.tp_comm - 2.0 * w.gemm_fwd) : w.tp_comm;
  // Dispatch: kOpsPerLayer operators per layer and micro-batch, a third of them forward.
  const double dispatch = kOpsPerLayer * d.op_dispatch_s;
  // Recompute per layer (in backward): the forward's work, its operators' dispatch, and its
  // collectives where the recomputed ops issue them again: full AC runs the whole block again (TP,
  // CP and EP traffic included); per-op AC keeps the TP reduce-scatters, the attention (ring
  // exchanges inside it) and the CP / EP all-to-alls, and gathers the TP activations again (half
  // the forward's TP traffic).
  double recompute = 0;
  if (L.ac == "full")
    recompute = w.gemm_fwd + w.attention_fwd + w.memory_fwd + dispatch / 3.0 + tp_exposed + w.cp_comm + w.ep_comm;
  else if (L.ac == "selective")
    recompute = 0.5 * w.gemm_fwd + w.memory_fwd + dispatch / 3.0 + 0.5 * tp_exposed;
  const double layer_f = w.gemm_fwd + w.attention_fwd + w.memory_fwd + dispatch / 3.0;
  const double layer_b = 2.0 * w.gemm_fwd + w.attention_bwd + w.memory_bwd + recompute + 2.0 * dispatch / 3.0;
  const double layer_f_comm = tp_exposed + w.cp_comm + w.ep_comm;
  const double layer_b_comm = tp_b_exposed + w.cp_comm_b + w.ep_comm_b;
  // FSDP exposed over one micro-batch of `n` layers (prefetch: see the Note), the embedding's
  // and norm + output's groups included: forward gathers the embedding (first: exposed), then
  // each block while the previous one computes, then norm + output during the last block;
  // backward reduce-scatters norm + output, then each block's gradients, gathering every block
  // again but the last (kept after forward, as norm + output are) and the embedding during the
  // first block's backward, and ends with the embedding's reduce-scatter.
  auto fsdp_exposed = [&](double n) {
    if (fsdp <= 1 || n <= 0) return std::make_pair(0.0, 0.0);
    const double per_b = w.fsdp_gather + w.fsdp_reduce_scatter;
    if (!overlap)
      return std::make_pair(embedding_gather + n * w.fsdp_gather + head_gather,
                            head_reduce_scatter + n * w.fsdp_reduce_scatter + (n - 1) * w.fsdp_gather +
                                embedding_regather + embedding_reduce_scatter);
    const double fwd = embedding_gather + w.fsdp_gather + (n - 1) * std::max(0.0, w.fsdp_gather - layer_f) +
                       std::max(0.0, head_gather - layer_f);
    const double bwd = std::max(0.0, head_reduce_scatter - layer_b) + w.fsdp_reduce_scatter +
                       (n - 1) * std::max(0.0, per_b - layer_b) + std::max(0.0, embedding_regather - layer_b) +
                       embedding_reduce_scatter;
    return std::make_pair(fwd, bwd);
  };
  const double out_f = tokens * 2.0 * output_params / tp / mm_rate + tokens * vocab * 4.0 * 2.0 / tp / hbm;
  const double embed = tokens * dim * bytes * 2.0 / hbm;

  double pass_seconds = 0, idle = 0;
  std::string pipeline_note;
  double sum_compute = 0, sum_memory = 0, sum_recompute = 0, sum_tp = 0, sum_cp = 0, sum_ep = 0, sum_fsdp = 0;
  double sum_dispatch = 0, fsdp_once = 0;
  if (checked.pipeline) {
    const auto& plan = *checked.pipeline;
    std::vector<StageCosts> costs(static_cast<size_t>(plan.num_stages()));
    // One activation (or its gradient) between two ranks: its bytes over the link, and the
    // message's fixed cost. Where transfers run on the compute's cores (device cpu: Gloo copies
    // through the ranks' own cores), the bytes occupy the sender's and the receiver's cores (F
    // sends its output forward and receives its input; B the gradients back), and only the
    // fixed cost is in flight; elsewhere all of it is in flight, beside the compute.
    const double transfer_bytes = static_cast<double>(rows) * seq / cp * dim * bytes;
    const double transfer_bytes_s = transfer_bytes / pp_bus(transfer_bytes);
    const double transfer = (overlap ? transfer_bytes_s : 0.0) + message_latency(2);
    auto remote_boundaries = [&](int s) {  // of stage s with its neighbours on other ranks
      const auto rank = [&](int i) { return plan.stage_rank[static_cast<size_t>(i)]; };
      return (s > 0 && rank(s - 1) != rank(s) ? 1.0 : 0.0) + (s + 1 < plan.num_stages() && rank(s + 1) != rank(s) ? 1.0 : 0.0);
    };
    // Under pp, FSDP gathers each of a rank's groups once per step and reduce-scatters its
    // gradients once (the gathered parameters and unsharded gradients stay all step, as the
    // memory estimate counts them): exposed, outside the pipeline passes; the step waits for the
    // rank with the most (the embedding's or the output's stage, often).
    std::vector<double> fsdp_of_rank(static_cast<size_t>(dims.pp), 0.0);
    std::vector<bool> rank_embeds(static_cast<size_t>(dims.pp), false);
    for (int s = 0; s < plan.num_stages(); ++s)
      for (const std::string& m : (*plan.stage_modules)[static_cast<size_t>(s)])
        if (m == "tok_embeddings") rank_embeds[static_cast<size_t>(plan.stage_rank[static_cast<size_t>(s)])] = true;
    for (int s = 0; s < plan.num_stages(); ++s) {
      double n = 0;
      bool output = false, embedding = false;
      for (const std::string& m : (*plan.stage_modules)[static_cast<size_t>(s)]) {
        if (model::parse_layer_path(m)) n += 1;
        output |= m == "output";
        embedding |= m == "tok_embeddings";
      }
      StageCosts& c = costs[static_cast<size_t>(s)];
      c.forward = n * (layer_f + layer_f_comm) + (output ? out_f : 0) + (embedding ? embed : 0);
      c.backward_weight = n * w.gemm_fwd + (output ? tokens * 2.0 * output_params / tp / mm_rate : 0);
      c.backward = n * (layer_b + layer_b_comm) + (output ? 2.0 * out_f : 0);
      if (!overlap) {
        const double copies = remote_boundaries(s) * transfer_bytes_s;
        c.forward += copies;
        c.backward += copies;
      }
      c.backward_input = std::max(0.0, c.backward - c.backward_weight);
      // A tied output whose embedding is on the same rank reads the embedding's group.
      const size_t r = static_cast<size_t>(plan.stage_rank[static_cast<size_t>(s)]);
      const double own_output = output && (!args.tie_embeddings || !rank_embeds[r]) ? output_params / tp : 0.0;
      fsdp_of_rank[r] += n * (w.fsdp_gather + w.fsdp_reduce_scatter) +
                         (embedding ? embedding_gather + embedding_reduce_scatter : 0.0) +
                         (output ? fsdp_gather_of(dim / tp + own_output) + fsdp_reduce_scatter_of(dim / tp + own_output) : 0.0);
    }
    // Ranks sharing fewer cores: a rank computes up to world / cores faster while others wait.
    const double max_speedup = d.host_cores > 0 ? static_cast<double>(cluster.world()) / d.host_cores : 1.0;
    const PipelineTiming t = simulate_pipeline(plan, costs, transfer, max_speedup);
    pass_seconds = t.step_seconds;
    idle = t.idle_fraction();
    std::ostringstream busy;
    busy << "pipeline ranks busy (simulated, share of a pass):";
    for (const double b : t.busy_seconds) busy << " " << std::lround(100.0 * b / pass_seconds) << "%";
    pipeline_note = busy.str();
    // Per-rank shares of the terms, for the breakdown: layers / pp of each, m micro-batches.
    const double m = static_cast<double>(micro_per_pass), per_rank_layers = layers / dims.pp;
    sum_compute = m * per_rank_layers * (3.0 * w.gemm_fwd + w.attention_fwd + w.attention_bwd);
    sum_memory = m * per_rank_layers * (w.memory_fwd + w.memory_bwd);
    sum_recompute = m * per_rank_layers * recompute;
    sum_dispatch = m * per_rank_layers * dispatch;
    sum_tp = m * per_rank_layers * (tp_exposed + tp_b_exposed);
    sum_cp = m * per_rank_layers * (w.cp_comm + w.cp_comm_b);
    sum_ep = m * per_rank_layers * (w.ep_comm + w.ep_comm_b);
    fsdp_once = *std::max_element(fsdp_of_rank.begin(), fsdp_of_rank.end());
  } else {
    const auto [ff, fb] = fsdp_exposed(layers);
    sum_compute = layers * (3.0 * w.gemm_fwd + w.attention_fwd + w.attention_bwd) + 3.0 * tokens * 2.0 * output_params / tp / mm_rate;
    sum_memory = layers * (w.memory_fwd + w.memory_bwd) + 3.0 * tokens * vocab * 8.0 / tp / hbm + 3.0 * embed;
    sum_recompute = layers * recompute;
    sum_dispatch = layers * dispatch;
    sum_tp = layers * (tp_exposed + tp_b_exposed);
    sum_cp = layers * (w.cp_comm + w.cp_comm_b);
    sum_ep = layers * (w.ep_comm + w.ep_comm_b);
    sum_fsdp = ff + fb;
    pass_seconds = sum_compute + sum_memory + sum_recompute + sum_dispatch + sum_tp + sum_cp + sum_ep + sum_fsdp;
  }
  const double local_params = static_cast<double>(count.total) / (dims.pp * tp * fsdp);
  const double optimizer = local_params * 28.0 / (d.hbm_bytes_per_s * d.optimizer_efficiency);
  // The replicas' sum, bucket by bucket (Note [Gradient buckets] in parallel/gradients.cpp):
  // each bucket one ring's 2 (r - 1) messages; the bytes copied into the kept bucket and back
  // (each read once and written once both ways).
  double hsdp = 0;
  if (dims.dp_replicate > 1) {
    const double grad_bytes = local_params * 4.0;
    const double buckets = std::max(1.0, std::ceil(grad_bytes / static_cast<double>(parallel::kReduceBucketBytes)));
    const double message = std::min(grad_bytes, static_cast<double>(parallel::kReduceBucketBytes));
    const double link = bus(Collective::kAllReduce, int64_t(dims.tp) * dims.cp * dims.dp_shard, dims.dp_replicate, message);
    hsdp = 2.0 * (dims.dp_replicate - 1.0) / dims.dp_replicate * grad_bytes / link +
           buckets * 2.0 * messages(static_cast<double>(dims.dp_replicate)) + 4.0 * grad_bytes / hbm;
  }
  const double np = static_cast<double>(passes);
  p.step_seconds = np * pass_seconds + fsdp_once + hsdp + optimizer;
  const double global_tokens = static_cast<double>(checked.global_batch) * seq;
  p.tokens_per_second_per_gpu = global_tokens / p.step_seconds / static_cast<double>(cluster.world());
  p.mfu = model::flops_per_token(args, cfg.training.seq_len) * p.tokens_per_second_per_gpu / d.peak_bf16;
  p.pipeline_idle = idle;
  p.exposed_comm_seconds = np * (sum_tp + sum_cp + sum_ep + sum_fsdp) + fsdp_once + hsdp;
  p.terms = {{"compute (GEMMs, attention)", np * sum_compute},
             {"memory-bound (elementwise, casts, loss)", np * sum_memory},
             {"AC recompute", np * sum_recompute},
             {"operator dispatch (host)", np * sum_dispatch},
             {"TP exposed", np * sum_tp},
             {"CP exposed", np * sum_cp},
             {"EP exposed", np * sum_ep},
             {"FSDP exposed", np * sum_fsdp + fsdp_once},
             {"HSDP all-reduce", hsdp},
             {"optimizer", optimizer}};
  if (checked.pipeline) p.terms.push_back({"pipeline idle (simulated order)", np * pass_seconds * idle});
  std::ostringstream os;
  os << passes << " pass" << (passes == 1 ? "" : "es") << " of " << micro_per_pass << " micro-batch"
     << (micro_per_pass == 1 ? "" : "es") << " of " << rows << " rows per step";
  p.notes.push_back(os.str());
  if (!pipeline_note.empty()) p.notes.push_back(pipeline_note);
  return p;
}

}  // namespace titan::planner
