// parallel/comm/autograd_comm.h — how a Comm travels through autograd.
//
// Note [A Comm through autograd]: a collective that is an autograd Function (TP's sequence
// gather and reduce-scatter, async TP's chunks, ring and head-parallel attention) needs its
// group again in backward, which runs after forward returned. Every such Function takes the
// group as its last apply() argument, a `comm::Comm*`, and keeps it with save_comm; its backward
// reads it with saved_comm. What is kept is the address: a Comm belongs to the DeviceMesh, which
// outlives every graph of the run. This is the one way parallel/ does it; state that a Function
// shares with others (async TP's chunks in flight, the ring's transfer tags) travels beside it,
// without the group.
#pragma once

#include <torch/csrc/autograd/custom_function.h>

#include <ATen/ops/zeros.h>

#include <cstdint>
#include <vector>

#include "parallel/comm/process_group.h"

namespace titan::parallel::comm {

inline void save_comm(torch::autograd::AutogradContext* ctx, Comm& comm) {
  ctx->saved_data["comm"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(&comm));
}

inline Comm& saved_comm(torch::autograd::AutogradContext* ctx) {
  return *reinterpret_cast<Comm*>(static_cast<intptr_t>(ctx->saved_data.at("comm").toInt()));
}

// A storage-less tensor of `shape` standing for data that exists elsewhere (a collective's
// output still in flight, a float8 chunk): autograd needs a tensor, nobody reads its values
// (See Note [Deferred collective results] in parallel/tensor_parallel/async_tp.cpp).
inline at::Tensor stand_in(const std::vector<int64_t>& shape, const at::TensorOptions& options) {
  return at::zeros({}, options).expand(shape);
}

}  // namespace titan::parallel::comm
