// parallel/context_parallel/attention.h — causal attention over a sequence split across the ranks of a context
// parallel group: ring attention (K/V gathered at once or passed around the ring) and titan's
// head-parallel all-to-all mode (DeepSpeed Ulysses).
//
// Every function takes this rank's load-balanced share of the sequence (See Note [Sequence
// split] in sequence_shard.h): with n ranks the sequence is cut into 2n chunks of c positions and
// rank r holds chunks r and 2n-1-r, in that order, so q/k/v are [B, heads, L = 2c, hd]. Results
// are this rank's rows of the unsplit causal attention. v's head size may differ from q's and
// k's (the output takes v's), and the softmax scale is the caller's `scale`, unset 1 / sqrt(qk_hd)
// (See Note [Attention head sizes and scale] in model/kernels/attention.h): every block, and the
// head-parallel mode's local attention, takes both as they come.
//
// Note [Ring attention]: rank r's queries meet every rank's keys as blocks (Note [Attention by
// blocks] in model/attention_blocks.h). Against rank j's keys (chunks j and 2n-1-j):
//   j == r: all of q against all of k, causal (chunk r precedes chunk 2n-1-r, so the causal mask
//           over the two concatenated chunks is exactly the global one);
//   j <  r: all of q against k's first chunk (j < r < 2n-1-r: entirely in the past), no mask;
//           k's second chunk (2n-1-j > every query chunk) is in the future: skipped;
//   j >  r: only q's second chunk (2n-1-r > 2n-1-j > j) sees any of k, all of it, no mask; q's
//           first chunk sees none of it: skipped.
// So every rank computes the same amount: one causal L x L block and n-1 unmasked blocks of
// L x c positions. Blocks are merged in float32 by their log-sum-exp, in the order j = r, r-1, ...
// (mod n) for both exchanges, so "allgather" and "alltoall" forwards give the same bits (their
// backwards sum a block's dK/dV over ranks in different orders: a reduce-scatter vs the ring).
// K and V travel as one flat buffer (k's elements, then v's), one transfer for both whatever their
// head sizes.
//   allgather: one all-gather of every rank's K/V (n x the local K/V in memory), then the blocks;
//              the backward re-gathers and returns dK/dV with one reduce-scatter.
//   alltoall:  (torchtitan's name) K/V passed around the ring, n-1 point-to-point steps, each
//              step's transfer in flight while the current block computes (2 K/V buffers in
//              memory); in the backward each block's dK/dV accumulator travels with its K/V and a
//              last step hands it to its owner.
// The forward runs inside checkpointable_op("sdpa"): per-op activation checkpointing keeps its
// output and log-sum-exp, so the recompute exchanges nothing. Full AC recomputes the forward,
// exchange included (the other ranks' K/V are not kept).
//
// Note [Ring attention over documents]: under block-causal attention (model/document_attention.h)
// a query sees only the earlier keys of its own document. Every (query chunk, key chunk) pair of a
// ring block is two contiguous ranges of the row, so the mask restricted to it is a set of
// rectangles, one per document the two chunks share: unmasked when the key chunk is in the past,
// a causal square when it is the query chunk itself; a pair whose chunks share no document, and
// every key chunk in the future, is skipped (no work, no exchange saved: the K/V still travel
// whole). The rectangles ("tiles") of every block are found once per call from the documents of
// the whole rows, which every rank has (Note [Sequence split]), and each tile is one block of Note
// [Attention by blocks]: merged exactly by its log-sum-exp into the rows it covers, its backward
// from the merged out and lse. Each query meets at least itself (its diagonal tile), so no row is
// left at -inf. Head-parallel mode gathers whole rows and runs the unsplit per-document form.
//
// Note [Ring attention with a window]: under a sliding window of W keys (a query sees the W
// positions up to its own: Note [Banded attention masks] in model/attention_blocks.h) the two
// concatenated chunks of a rank are not one band, so every ring block is cut into its (query
// chunk, key chunk) pairs as above, one tile of every row per pair (or per shared document,
// block-causal), each given causal (the diagonal), the window and its key_offset: the queries'
// first position minus the keys' in the whole row. A pair whose nearest positions (its first
// query, its last key) are W or more apart is skipped: at a window shorter than a chunk, a rank
// computes its two diagonal squares and the chunk just before each query chunk, not n blocks of
// L x c; the K/V still travel whole. The tiles merge as block-causal's do; each query still meets itself.
// window 0 is the causal attention as above, bit for bit.
//
// Note [Head-parallel attention] (titan_ulysses): all-to-alls re-shard q, k, v from "every head,
// this rank's positions" to "1/n of the heads, every position" (reordered into sequence order),
// the local causal attention_op runs on whole sequences, and one all-to-all returns the output
// to sequence shards. Four all-to-alls of the local activation size, no per-block work; needs
// the local head count divisible by n (kv heads are repeated to the query heads when theirs is
// not). Each all-to-all's output is on per-op AC's save list ("cp_all_to_all").
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

namespace titan::parallel::comm {
class Comm;
}

namespace titan::parallel::context_parallel {

enum class KvExchange { kAllGather, kRing };

// The point-to-point tags of one rank's ring calls: every rank of the group makes the same calls
// in the same order (same layers, same recomputes), so a counter per rank agrees across the group.
struct RingTags {
  int64_t calls = 0;
};

// q [B, H, L, qk_hd], k [B, KV, L, qk_hd], v [B, KV, L, v_hd] (H a multiple of KV), L even ->
// [B, H, L, v_hd]. Differentiable in q, k, v. `documents`: undefined (causal) or the documents of
// the whole rows [B, n L] (block-causal: See Note [Ring attention over documents]). `scale`: of
// q . k, unset 1 / sqrt(qk_hd). `window`: a query sees only the `window` positions up to its own
// (0: every earlier one; See Note [Ring attention with a window]), with documents or without.
// `sinks` [H] (undefined: none): a sink per head joins the merged rows (Note [Attention sinks] in
// model/sink_attention.h), differentiable; the gradient is this rank's rows' part.
// `tags` must outlive the backward.
at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& documents,
                          comm::Comm& cp, KvExchange exchange, RingTags& tags,
                          std::optional<double> scale = std::nullopt, int64_t window = 0,
                          const at::Tensor& sinks = at::Tensor());

// The same result by head-parallel all-to-alls (See Note [Head-parallel attention]): H and, after
// any repetition, the kv heads divisible by cp.size(). A window or sinks as ring_attention's: the
// whole rows of this rank's heads through model/sink_attention.h.
at::Tensor head_parallel_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& documents, comm::Comm& cp,
                                   std::optional<double> scale = std::nullopt, int64_t window = 0,
                                   const at::Tensor& sinks = at::Tensor());

}  // namespace titan::parallel::context_parallel
