// parallel/tensor_parallel/async_tp.h — async tensor parallel: the sequence all-gather before column-parallel
// linears and the reduce-scatter after row-parallel ones, in chunks overlapped with the GEMMs.
//
// Note [Async TP]: (parallelism.enable_async_tensor_parallel; torchtitan gets the same from
// torch.compile's micro-pipeline pass, titan builds it on asynchronous collectives, Note
// [Asynchronous collectives] in process_group.h.) On a TP group of n ranks with sequence shards
// of s rows, split into c chunks of s/c rows:
//   all-gather -> GEMM (attention's wq/wk/wv, feed_forward's w1/w3): the module's input hook
//     issues c all-gathers at once, chunk k holding rows [k s/c, (k+1) s/c) of every rank's
//     shard; a column-parallel linear multiplies chunk k as soon as it has arrived, while the
//     later chunks are in flight (See Note [Sequence chunks] in model/linear.h), and the
//     outputs are put back in sequence order. A float8 tensorwise recipe gets its chunks in
//     float8 with the one global-amax scale (as the synchronous float8 gather).
//   GEMM -> reduce-scatter (wo, w2): the partial products of chunk k (its rows for every
//     destination rank) are computed and their reduce-scatter issued while chunk k+1 is
//     multiplied; the outputs are waited for and concatenated at the end.
//   backward, mirrored: a gathered chunk's gradient is reduce-scattered as soon as the readers'
//     grad_input GEMMs of that chunk are done, waited for only when the shard's gradient is
//     assembled; the reduce-scatter's backward all-gathers every chunk's gradient up front and
//     each chunk's GEMMs wait only for their own.
// Every chunk keeps its data and scale together: a (B, S, K) activation cast per row carries a
// (B, S, 1) scale, and a chunk's (B, S/c, K) rows carry (B, S/c, 1) (the 3-D-scale crash
// torchtitan had under async TP + float8 rowwise + AC cannot arise: the float8 compute casts each
// chunk itself, Note [Scale follows data]).
// Numerics: every value is the synchronous one except that each GEMM runs on S/c rows at a
// time, and the weight gradient is the sum of c chunk products (float32 reduction order).
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <optional>

#include "float8/recipe.h"
#include "model/linear.h"
#include "model/transformer.h"
#include "parallel/comm/process_group.h"

namespace titan::parallel::tensor_parallel {

// The float8 cast a module's readers share for a float8 chunk gather (tensorwise dynamic).
struct Float8ChunkCast {
  float8::CastConfig cast;
  bool round_scales_to_power_of_2 = false;
};

// The module input hook of async TP: x [B, s, D] (this rank's sequence shard) -> an operand
// whose chunks arrive as described in Note [Async TP]. `float8`: the chunks travel as float8
// bytes with one global scale (one MAX all-reduce up front).
model::ModuleInputHook make_async_sequence_gather(comm::Comm& comm, int chunks, std::optional<Float8ChunkCast> float8);

// Row-parallel product + reduce-scatter to sequence shards, chunked and overlapped (Note [Async
// TP]): x [B, S, K/n] -> [B, S/n, N] summed over the group. `multiply` is the inner compute.
at::Tensor chunked_matmul_reduce_scatter(const at::Tensor& x, const model::LinearOperand& weight,
                                         model::LinearCompute& multiply, comm::Comm& comm, int chunks);

}  // namespace titan::parallel::tensor_parallel
