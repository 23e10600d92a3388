// parallel/context_parallel/attention.cpp — see attention.h.
#include "parallel/context_parallel/attention.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/repeat_interleave.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "parallel/comm/autograd_comm.h"
#include "model/attention_blocks.h"
#include "model/document_attention.h"
#include "model/sink_attention.h"
#include "model/activation_checkpoint_ops.h"
#include "parallel/comm/process_group.h"

namespace titan::parallel::context_parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// One rectangle of a ring block (See Notes [Ring attention over documents], [Ring attention with
// a window]): queries [q_start, q_start + q_len) of row `row` (-1: every row) of this rank's share
// against keys [k_start, k_start + k_len) of the block's share; `causal` on the diagonal (the same
// positions), else unmasked but for the window; `key_offset`: the queries' first position minus
// the keys' in the whole row (0 on the diagonal), the block's offset for the window.
struct Tile {
  int64_t row, q_start, q_len, k_start, k_len;
  bool causal;
  int64_t key_offset;
};

// Whether a tile of queries from global position q_begin against keys [k_begin, k_end) has any
// pair inside a window of `window` keys (0: none): its nearest pair, the first query and the last
// key, is q_begin - (k_end - 1) apart.
bool within_window(int64_t q_begin, int64_t k_end, int64_t window) {
  return window == 0 || q_begin - (k_end - 1) < window;
}

// Rank r's queries (chunks r and 2n-1-r of c positions) against rank j's keys (chunks j and
// 2n-1-j) under the documents of `rows` (positions of the whole rows): for every pair of a query
// chunk and a key chunk not in its future, every document they share gives one tile, unless the
// window leaves none of its pairs.
std::vector<Tile> document_tiles(const std::vector<std::vector<model::DocumentSpan>>& rows, int r, int j, int n,
                                 int64_t c, int64_t window) {
  std::vector<Tile> tiles;
  const int64_t q_chunks[2] = {r, 2 * n - 1 - r}, k_chunks[2] = {j, 2 * n - 1 - j};
  for (int qi = 0; qi < 2; ++qi) {
    for (int ki = 0; ki < 2; ++ki) {
      const int64_t q_begin = q_chunks[qi] * c, k_begin = k_chunks[ki] * c;
      if (k_begin > q_begin) continue;  // keys in the queries' future
      for (size_t b = 0; b < rows.size(); ++b) {
        for (const model::DocumentSpan& d : rows[b]) {
          const int64_t end = d.start + d.length;
          const int64_t qs = std::max(d.start, q_begin), qe = std::min(end, q_begin + c);
          const int64_t ks = std::max(d.start, k_begin), ke = std::min(end, k_begin + c);
          if (qs >= qe || ks >= ke) continue;  // the document is not in both chunks
          if (!within_window(qs, ke, window)) continue;
          tiles.push_back({static_cast<int64_t>(b), qi * c + qs - q_begin, qe - qs, ki * c + ks - k_begin, ke - ks,
                           k_begin == q_begin, qs - ks});
        }
      }
    }
  }
  return tiles;
}

// The same pairs of chunks without documents under a window (See Note [Ring attention with a
// window]): one tile of every row per pair not in the future and not wholly outside the window.
std::vector<Tile> window_tiles(int r, int j, int n, int64_t c, int64_t window) {
  std::vector<Tile> tiles;
  const int64_t q_chunks[2] = {r, 2 * n - 1 - r}, k_chunks[2] = {j, 2 * n - 1 - j};
  for (int qi = 0; qi < 2; ++qi) {
    for (int ki = 0; ki < 2; ++ki) {
      const int64_t q_begin = q_chunks[qi] * c, k_begin = k_chunks[ki] * c;
      if (k_begin > q_begin || !within_window(q_begin, k_begin + c, window)) continue;
      tiles.push_back({-1, qi * c, c, ki * c, c, k_begin == q_begin, q_begin - k_begin});
    }
  }
  return tiles;
}

// One rank's K and V as one flat buffer [numel(k) + numel(v)], so one transfer carries both
// whatever their head sizes (v's may differ from k's: See Note [Attention head sizes and scale] in
// model/kernels/attention.h). For k and v of one shape it is the memory of stack({k, v}).
struct KvPacking {
  std::vector<int64_t> k_shape, v_shape;  // [B, KV, L, qk_hd], [B, KV, L, v_hd]
  int64_t k_numel = 0, v_numel = 0;

  KvPacking(const at::Tensor& k, const at::Tensor& v)
      : k_shape(k.sizes().vec()), v_shape(v.sizes().vec()), k_numel(k.numel()), v_numel(v.numel()) {}
  int64_t numel() const { return k_numel + v_numel; }
  at::Tensor pack(const at::Tensor& k, const at::Tensor& v) const { return at::cat({k.reshape(-1), v.reshape(-1)}); }
  at::Tensor k_of(const at::Tensor& flat) const { return flat.narrow(0, 0, k_numel).view(k_shape); }
  at::Tensor v_of(const at::Tensor& flat) const { return flat.narrow(0, k_numel, v_numel).view(v_shape); }
};

// What a ring attention's backward needs besides its group (See Note [A Comm through autograd]).
struct RingState : torch::CustomClassHolder {
  KvExchange exchange = KvExchange::kRing;
  RingTags* tags = nullptr;
  std::optional<double> scale;  // of q . k (unset: 1 / sqrt(qk_hd))
  int64_t window = 0;           // keys a query sees, itself included (0: every earlier one)
  // Block-causal or windowed: the tiles of every rank j's block, by j (found once, used by the
  // forward, any recompute and the backward); empty: causal (Note [Ring attention]).
  std::vector<std::vector<Tile>> tiles;
};

// Row `row` (-1: every row), positions [start, start + len) of a [B, X, L, ...] tensor.
at::Tensor tile_of(const at::Tensor& t, int64_t row, int64_t start, int64_t len) {
  return (row < 0 ? t : t.narrow(0, row, 1)).narrow(2, start, len);
}

// A transfer's tag: unique per (call, purpose, ring step) among the transfers a pair has in
// flight (See Note [Point-to-point] in process_group.h). Calls wrap after 2^16, long after any
// transfer of that call completed.
enum TagSlot { kKvForward = 0, kKvBackward = 1, kGradKv = 2 };
int ring_tag(int64_t call, TagSlot slot, int step) {
  return static_cast<int>(((call & 0xFFFF) << 12) | (static_cast<int64_t>(slot) << 10) | (step & 0x3FF));
}

// One ring step's transfers: `outgoing` to the next rank, `incoming` from the previous one.
// Posted in an order that cannot deadlock where a pair's transfers are matched in issue order on
// one stream (NCCL; at cp 2 the next and the previous rank are the same peer): even ranks send
// first, odd ranks receive first. Gloo matches by tag and would accept either order.
std::pair<comm::CommWork, comm::CommWork> ring_step(comm::Comm& comm, const at::Tensor& outgoing, const at::Tensor& incoming, int tag) {
  const int r = comm.rank(), n = comm.size();
  comm::CommWork send, recv;
  if (r % 2 == 0) {
    send = comm.send_async(outgoing, (r + 1) % n, tag);
    recv = comm.recv_async(incoming, (r - 1 + n) % n, tag);
  } else {
    recv = comm.recv_async(incoming, (r - 1 + n) % n, tag);
    send = comm.send_async(outgoing, (r + 1) % n, tag);
  }
  return {std::move(send), std::move(recv)};
}

// Rank j's K/V block in this rank's ring order: step s holds rank (r - s) mod n's.
int block_at(int rank, int step, int n) { return ((rank - step) % n + n) % n; }

// Every rank's packed K/V block kv [numel] (KvPacking) -> [n, numel] (gathered as the
// concatenation along dim 0, the shape Gloo checks).
at::Tensor gather_blocks(const at::Tensor& kv, comm::Comm& comm) {
  at::Tensor all = at::empty({comm.size() * kv.numel()}, kv.options());
  comm.all_gather_into_tensor_async(all, kv).wait();
  return all.view({comm.size(), kv.numel()});
}

// The forward of Note [Ring attention]: out [B, H, L, v_hd] (q's dtype), lse [B, H, L] float32.
std::vector<at::Tensor> ring_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, comm::Comm& comm,
                                     const RingState& state, int64_t call) {
  const KvExchange exchange = state.exchange;
  const int r = comm.rank(), n = comm.size();
  const int64_t c = q.size(2) / 2;
  const std::optional<double> scale = state.scale;
  const KvPacking packing(k, v);
  at::Tensor acc_out = at::zeros({q.size(0), q.size(1), q.size(2), v.size(3)}, q.options().dtype(at::kFloat));
  at::Tensor acc_lse = at::full({q.size(0), q.size(1), q.size(2)}, -std::numeric_limits<double>::infinity(),
                                q.options().dtype(at::kFloat));
  at::Tensor acc_out_tail = acc_out.narrow(2, c, c), acc_lse_tail = acc_lse.narrow(2, c, c);
  auto block = [&](int j, const at::Tensor& kv) {
    const at::Tensor kj = packing.k_of(kv), vj = packing.v_of(kv);
    if (!state.tiles.empty()) {
      for (const Tile& t : state.tiles[static_cast<size_t>(j)]) {
        at::Tensor out_tile = tile_of(acc_out, t.row, t.q_start, t.q_len);
        at::Tensor lse_tile = tile_of(acc_lse, t.row, t.q_start, t.q_len);
        model::merge_attention_block(
            out_tile, lse_tile,
            model::attention_block_forward(tile_of(q, t.row, t.q_start, t.q_len), tile_of(kj, t.row, t.k_start, t.k_len),
                                           tile_of(vj, t.row, t.k_start, t.k_len), t.causal, scale, state.window,
                                           t.key_offset));
      }
    } else if (j == r) {
      model::merge_attention_block(acc_out, acc_lse, model::attention_block_forward(q, kj, vj, true, scale));
    } else if (j < r) {
      model::merge_attention_block(
          acc_out, acc_lse, model::attention_block_forward(q, kj.narrow(2, 0, c), vj.narrow(2, 0, c), false, scale));
    } else {
      model::merge_attention_block(acc_out_tail, acc_lse_tail,
                                   model::attention_block_forward(q.narrow(2, c, c), kj, vj, false, scale));
    }
  };
  const at::Tensor kv = packing.pack(k, v);  // one transfer for both
  if (exchange == KvExchange::kAllGather) {
    at::Tensor all = gather_blocks(kv, comm);
    for (int s = 0; s < n; ++s) block(block_at(r, s, n), all.select(0, block_at(r, s, n)));
  } else {
    at::Tensor current = kv;
    for (int s = 0; s < n; ++s) {
      at::Tensor next;
      comm::CommWork recv, send;
      if (s + 1 < n) {  // the next block travels while this one computes
        next = at::empty_like(kv);
        std::tie(send, recv) = ring_step(comm, current, next, ring_tag(call, kKvForward, s));
      }
      block(block_at(r, s, n), current);
      recv.wait();
      send.wait();
      current = next;
    }
  }
  return {acc_out.to(q.scalar_type()), acc_lse};
}

// The gradients of q (float32, accumulated into dq) and of rank j's packed K/V block (returned,
// float32 [numel], KvPacking) through the blocks of Note [Ring attention].
at::Tensor block_grads(int j, int r, const RingState& state, const KvPacking& packing, const at::Tensor& kv,
                       const at::Tensor& dout, const at::Tensor& q, const at::Tensor& out, const at::Tensor& lse,
                       at::Tensor& dq) {
  const int64_t c = q.size(2) / 2;
  const std::optional<double> scale = state.scale;
  const at::Tensor kj = packing.k_of(kv), vj = packing.v_of(kv);
  at::Tensor dkv = at::zeros({packing.numel()}, kv.options().dtype(at::kFloat));
  at::Tensor dk = packing.k_of(dkv), dv = packing.v_of(dkv);
  if (!state.tiles.empty()) {
    // Tiles of one block may share keys (two query chunks against one key chunk): accumulate.
    for (const Tile& t : state.tiles[static_cast<size_t>(j)]) {
      auto [gq, gk, gv] = model::attention_block_backward(
          tile_of(dout, t.row, t.q_start, t.q_len), tile_of(q, t.row, t.q_start, t.q_len),
          tile_of(kj, t.row, t.k_start, t.k_len), tile_of(vj, t.row, t.k_start, t.k_len),
          tile_of(out, t.row, t.q_start, t.q_len), tile_of(lse, t.row, t.q_start, t.q_len), t.causal, scale,
          state.window, t.key_offset);
      tile_of(dq, t.row, t.q_start, t.q_len).add_(gq);
      tile_of(dk, t.row, t.k_start, t.k_len).add_(gk);
      tile_of(dv, t.row, t.k_start, t.k_len).add_(gv);
    }
  } else if (j == r) {
    auto [gq, gk, gv] = model::attention_block_backward(dout, q, kj, vj, out, lse, true, scale);
    dq.add_(gq);
    dk.copy_(gk);
    dv.copy_(gv);
  } else if (j < r) {
    auto [gq, gk, gv] =
        model::attention_block_backward(dout, q, kj.narrow(2, 0, c), vj.narrow(2, 0, c), out, lse, false, scale);
    dq.add_(gq);
    dk.narrow(2, 0, c).copy_(gk);
    dv.narrow(2, 0, c).copy_(gv);
  } else {
    auto [gq, gk, gv] = model::attention_block_backward(dout.narrow(2, c, c), q.narrow(2, c, c), kj, vj,
                                                        out.narrow(2, c, c), lse.narrow(2, c, c), false, scale);
    dq.narrow(2, c, c).add_(gq);
    dk.copy_(gk);
    dv.copy_(gv);
  }
  return dkv;
}

struct RingAttention : public torch::autograd::Function<RingAttention> {
  // `sinks` [H] (a stand-in of 0 elements when !has_sinks: a Function's tensor arguments must be
  // defined): See Note [Attention sinks] in model/sink_attention.h.
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& sinks, bool has_sinks, c10::intrusive_ptr<RingState> state,
                               comm::Comm* cp) {
    TORCH_CHECK(q.size(2) % 2 == 0 && k.size(2) == q.size(2), "ring attention: this rank's share must be two chunks of "
                "equal length, got ", q.size(2), " queries and ", k.size(2), " keys");
    // out and lse kept or recomputed together (per-op AC keeps "sdpa": See Note [Ring attention]).
    auto r = model::checkpointable_op_multi("sdpa", [&] {
      std::vector<at::Tensor> merged = ring_forward(q, k, v, *cp, *state, state->tags->calls++);
      if (has_sinks) {  // the sink column joins the merged rows: (out', lse'), which the backward takes
        const model::SinkRescale rescale = model::rescale_by_sinks(merged[1], sinks);
        merged[0] = (merged[0].to(at::kFloat) * rescale.factor).to(q.scalar_type());
        merged[1] = rescale.lse;
      }
      return merged;
    });
    ctx->save_for_backward({q, k, v, r[0], r[1], sinks});
    ctx->saved_data["has_sinks"] = has_sinks;
    ctx->saved_data["state"] = c10::IValue::make_capsule(c10::intrusive_ptr<torch::CustomClassHolder>(state));
    comm::save_comm(ctx, *cp);
    return {r[0]};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto state = c10::static_intrusive_pointer_cast<RingState>(ctx->saved_data.at("state").toCapsule());
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    const at::Tensor& sinks = saved[5];
    const at::Tensor dout = grads[0].contiguous();
    comm::Comm& comm = comm::saved_comm(ctx);
    const int r = comm.rank(), n = comm.size();
    const int64_t call = state->tags->calls++;
    at::Tensor dq = at::zeros(q.sizes(), q.options().dtype(at::kFloat));
    const KvPacking packing(k, v);
    const at::Tensor kv = packing.pack(k, v);
    at::Tensor dkv_mine;
    if (state->exchange == KvExchange::kAllGather) {
      at::Tensor all = gather_blocks(kv, comm);
      at::Tensor dkv_all = at::empty(all.sizes(), all.options().dtype(at::kFloat));
      for (int s = 0; s < n; ++s) {
        const int j = block_at(r, s, n);
        dkv_all.select(0, j).copy_(block_grads(j, r, *state, packing, all.select(0, j), dout, q, out, lse, dq));
      }
      dkv_mine = at::empty(kv.sizes(), dkv_all.options());
      // Gloo wants the concatenation along dim 0: [n, numel] viewed as [n numel].
      comm.reduce_scatter_tensor_async(dkv_mine, dkv_all.flatten()).wait();
    } else {
      // Step s: this rank holds block j = r - s and the accumulator of j's gradient from ranks
      // j .. r-1; it adds its own and passes both on. After n steps each accumulator has every
      // rank's part and sits one hop before its owner: the last transfer delivers it.
      at::Tensor current = kv;
      comm::CommWork acc_recv, acc_send;
      at::Tensor acc_in, acc_sent;
      for (int s = 0; s < n; ++s) {
        at::Tensor next;
        comm::CommWork recv, send;
        if (s + 1 < n) {
          next = at::empty_like(kv);
          std::tie(send, recv) = ring_step(comm, current, next, ring_tag(call, kKvBackward, s));
        }
        at::Tensor g = block_grads(block_at(r, s, n), r, *state, packing, current, dout, q, out, lse, dq);
        if (s > 0) {
          acc_recv.wait();
          g.add_(acc_in);  // the earlier ranks' part, then this rank's: the same order on every rank
        }
        acc_send.wait();  // the previous accumulator left: its buffer may go
        acc_sent = g;
        acc_in = at::empty_like(g);
        if (n > 1) {
          std::tie(acc_send, acc_recv) = ring_step(comm, acc_sent, acc_in, ring_tag(call, kGradKv, s));
        }
        recv.wait();
        send.wait();
        current = next;
      }
      if (n > 1) {
        acc_recv.wait();
        acc_send.wait();
        dkv_mine = acc_in;
      } else {
        dkv_mine = acc_sent;
      }
    }
    // This rank's rows' part of the sinks' gradient (the data-parallel reduction over dp_cp sums it).
    const at::Tensor dsinks = ctx->saved_data["has_sinks"].toBool()
                                  ? model::sinks_gradient(dout, out, lse, sinks).to(sinks.scalar_type())
                                  : at::Tensor();
    return {dq.to(q.scalar_type()), packing.k_of(dkv_mine).to(k.scalar_type()),
            packing.v_of(dkv_mine).to(v.scalar_type()), dsinks, at::Tensor(), at::Tensor(),
            at::Tensor()};  // has_sinks, state, group
  }
};

// ---------------------------------------------------------------- head-parallel all-to-all

// x [B, X, L, hd] (X heads, every one of them, this rank's two chunks) -> [B, X/n, S = nL, hd]
// (this rank's 1/n of the heads, every position in sequence order). See Note [Head-parallel
// attention].
at::Tensor sequence_to_heads(const at::Tensor& x, comm::Comm& comm) {
  const int64_t n = comm.size(), b = x.size(0), h = x.size(1) / n, len = x.size(2), c = len / 2, hd = x.size(3);
  const at::Tensor send = x.reshape({b, n, h, len, hd}).transpose(0, 1).contiguous();  // [n(dest), B, h, L, hd]
  at::Tensor recv = at::empty_like(send);                                              // [n(src), B, h, L, hd]
  comm.all_to_all_single_async(recv, send).wait();
  // Source rank s sent chunks s and 2n-1-s: chunks 0..n-1 are the sources' first halves in
  // rank order, chunks n..2n-1 their second halves in reverse rank order.
  const at::Tensor halves = recv.view({n, b, h, 2, c, hd});
  const at::Tensor chunks = at::cat({halves.select(3, 0), halves.select(3, 1).flip(0)}, 0);  // [2n, B, h, c, hd]
  return chunks.permute({1, 2, 0, 3, 4}).reshape({b, h, 2 * n * c, hd});
}

// The inverse: y [B, h, S, hd] -> [B, n h, L, hd].
at::Tensor heads_to_sequence(const at::Tensor& y, comm::Comm& comm) {
  const int64_t n = comm.size(), b = y.size(0), h = y.size(1), c = y.size(2) / (2 * n), hd = y.size(3);
  const at::Tensor chunks = y.reshape({b, h, 2 * n, c, hd}).permute({2, 0, 1, 3, 4});  // [2n, B, h, c, hd]
  // Destination d gets chunks d and 2n-1-d.
  const at::Tensor send =
      at::stack({chunks.narrow(0, 0, n), chunks.narrow(0, n, n).flip(0)}, 3).contiguous();  // [n, B, h, 2, c, hd]
  at::Tensor recv = at::empty_like(send);  // [n(src: head group), B, h, 2, c, hd]
  comm.all_to_all_single_async(recv, send).wait();
  return recv.view({n, b, h, 2 * c, hd}).transpose(0, 1).reshape({b, n * h, 2 * c, hd});
}

// One re-shard as an autograd Function (its gradient is the inverse re-shard), run through the
// op layer so per-op AC keeps its output instead of repeating the all-to-all.
template <bool kToHeads>
struct HeadReshard : public torch::autograd::Function<HeadReshard<kToHeads>> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, comm::Comm* cp) {
    comm::save_comm(ctx, *cp);
    return {model::checkpointable_op("cp_all_to_all", [&] {
      return kToHeads ? sequence_to_heads(x, *cp) : heads_to_sequence(x, *cp);
    })};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    comm::Comm& cp = comm::saved_comm(ctx);
    const at::Tensor g = grads[0].contiguous();
    return {kToHeads ? heads_to_sequence(g, cp) : sequence_to_heads(g, cp), at::Tensor()};
  }
};

}  // namespace

at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& documents,
                          comm::Comm& cp, KvExchange exchange, RingTags& tags, std::optional<double> scale,
                          int64_t window, const at::Tensor& sinks) {
  TORCH_CHECK(window >= 0, "ring attention: the window must be >= 0 keys (0: none), got ", window);
  auto state = c10::make_intrusive<RingState>();
  state->exchange = exchange;
  state->tags = &tags;
  state->scale = scale;
  state->window = window;
  const int n = cp.size();
  const int64_t c = q.size(2) / 2;
  if (documents.defined()) {
    TORCH_CHECK(documents.dim() == 2 && documents.size(0) == q.size(0) && documents.size(1) == 2 * n * c,
                "ring attention: documents must be [batch ", q.size(0), ", whole row ", 2 * n * c, "], got ",
                documents.sizes());
    const auto rows = model::document_spans(documents);
    for (int j = 0; j < n; ++j) state->tiles.push_back(document_tiles(rows, cp.rank(), j, n, c, window));
  } else if (window > 0) {
    for (int j = 0; j < n; ++j) state->tiles.push_back(window_tiles(cp.rank(), j, n, c, window));
  }
  const bool has_sinks = sinks.defined();
  return RingAttention::apply(q, k, v, has_sinks ? sinks : at::empty({0}, q.options().dtype(at::kFloat)), has_sinks,
                              state, &cp)[0];
}

at::Tensor head_parallel_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& documents, comm::Comm& cp, std::optional<double> scale,
                                   int64_t window, const at::Tensor& sinks) {
  const int64_t n = cp.size();
  TORCH_CHECK(q.size(1) % n == 0, "head-parallel attention: ", q.size(1), " local query heads are not divisible by ",
              "the context parallel degree ", n);
  at::Tensor kk = k, vv = v;
  if (k.size(1) % n != 0) {  // too few kv heads to split: each rank takes its query heads' kv heads
    kk = k.repeat_interleave(q.size(1) / k.size(1), 1);
    vv = v.repeat_interleave(q.size(1) / v.size(1), 1);
  }
  const at::Tensor qh = HeadReshard<true>::apply(q, &cp)[0];
  const at::Tensor kh = HeadReshard<true>::apply(kk, &cp)[0];
  const at::Tensor vh = HeadReshard<true>::apply(vv, &cp)[0];
  // Whole rows in sequence order after the re-shard: block-causal is the unsplit per-document form,
  // a window or sinks the unsplit sink attention over this rank's heads (rank r holds heads
  // [r h, (r + 1) h) of the local H: sequence_to_heads), with their sinks.
  at::Tensor out;
  if (window > 0 || sinks.defined()) {
    const int64_t h = q.size(1) / n;
    const at::Tensor my_sinks = sinks.defined() ? sinks.narrow(0, cp.rank() * h, h) : at::Tensor();
    out = model::sink_attention(qh, kh, vh, documents, window, my_sinks, scale);
  } else {
    out = documents.defined() ? model::document_causal_attention(qh, kh, vh, documents, scale)
                              : model::attention_op(qh, kh, vh, scale);
  }
  return HeadReshard<false>::apply(out, &cp)[0];
}

}  // namespace titan::parallel::context_parallel
