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

#include <cstdint>

#include "parallel/comm/process_group.h"

namespace titan::parallel::comm {

inline void save_comm(torch::autograd::AutogradContext* ctx, Comm& comm) {
  ctx->saved_data["comm"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(&comm));
}

inline Comm& saved_comm(torch::autograd::AutogradContext* ctx) {
  return *reinterpret_cast<Comm*>(static_cast<intptr_t>(ctx->saved_data.at("comm").toInt()));
}

}  // namespace titan::parallel::comm
