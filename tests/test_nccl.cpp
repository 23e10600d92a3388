// NCCL through titan's Comm on one GPU (built only in the CUDA-enabled variant).
//
// The GPU machines this project gets have a single GPU, and NCCL refuses two ranks on one device,
// so this exercises the NCCL code path with one-rank groups: init_process_group with backend
// "nccl" (a TCPStore served on a free port of 127.0.0.1), a sub-group from new_group (how FSDP and
// TP form theirs), and every collective titan issues, in every dtype it issues it with:
//   all_reduce sum / max     float32 (grad norm, amax), bfloat16 (TP partial sums)
//   all_gather_into_tensor   bfloat16 (FSDP, TP sequence), float32, uint8 (float8 weight bytes)
//   reduce_scatter_tensor    float32, bfloat16 (FSDP gradients, TP)
//   broadcast, barrier
// With one rank every closed form is the identity (sum or max over one input, gather or scatter
// of one block), which is exact: the results must equal the inputs bit for bit. What a one-rank
// group cannot show (data moving between devices) is left to the 2-GPU runs in
// scripts/gpu_check.sh (FSDP 2, float8 all-gather), which start when a machine has 2+ GPUs.
//
// Without a CUDA device there is nothing to run: main() prints why and returns kSkipReturnCode,
// which ctest reports as skipped (SKIP_RETURN_CODE in tests/CMakeLists.txt), never as passed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <ATen/ATen.h>
#include <ATen/Context.h>

#include <cstdio>
#include <memory>
#include <string>

#include "parallel/comm/process_group.h"

using titan::parallel::comm::Comm;
using titan::parallel::comm::CommError;
using titan::parallel::comm::CommOptions;
using titan::parallel::comm::ReduceOp;

namespace {

constexpr int kSkipReturnCode = 77;  // the automake convention ctest's SKIP_RETURN_CODE names

std::unique_ptr<Comm> one_rank_nccl_world() {
  titan::parallel::comm::Rendezvous world;  // rank 0 of 1
  world.master_addr = "127.0.0.1";
  world.master_port = 0;  // rank 0 serves the store on a free port
  CommOptions options;
  options.backend = "nccl";
  options.timeout = std::chrono::seconds(60);  // a hang fails the check instead of blocking it
  return titan::parallel::comm::init_process_group(world, options);
}

// Values that survive every dtype here exactly: small integers (and their negatives).
at::Tensor ramp(int64_t n, at::ScalarType dtype) {
  return (at::arange(n, at::TensorOptions().dtype(at::kFloat)) - n / 2)
      .to(at::TensorOptions().dtype(dtype).device(at::kCUDA));
}

void check_collectives(Comm& comm) {
  REQUIRE(comm.size() == 1);
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    CAPTURE(dtype);
    at::Tensor x = ramp(1000, dtype), expected = x.clone();
    comm.all_reduce(x, ReduceOp::kSum);
    CHECK(at::equal(x, expected));
    comm.all_reduce(x, ReduceOp::kMax);
    CHECK(at::equal(x, expected));
    CHECK(comm.last_collective().op == "all_reduce(max)");
    CHECK(comm.last_collective().bytes == 1000 * x.element_size());

    at::Tensor out = at::full_like(x, 7);
    comm.reduce_scatter_tensor(out, x);
    CHECK(at::equal(out, expected));
  }
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kByte}) {
    CAPTURE(dtype);
    at::Tensor shard = dtype == at::kByte
                           ? at::arange(256, at::TensorOptions().dtype(at::kInt)).to(at::kCUDA, at::kByte)
                           : ramp(513, dtype);
    at::Tensor gathered = at::zeros_like(shard);
    comm.all_gather_into_tensor(gathered, shard);
    CHECK(at::equal(gathered, shard));
  }
  at::Tensor b = ramp(64, at::kFloat), before = b.clone();
  comm.broadcast(b, 0);
  CHECK(at::equal(b, before));
  comm.barrier();
  CHECK(comm.last_collective().op == "barrier");
  // A bad call still gets titan's error (the wrapper's checks run before NCCL sees anything).
  at::Tensor wrong = at::zeros({3}, at::TensorOptions().device(at::kCUDA));
  CHECK_THROWS_AS(comm.all_gather_into_tensor(wrong, at::zeros({2}, wrong.options())), CommError);
}

}  // namespace

TEST_CASE("one-rank NCCL world: every collective titan issues", "[cuda][nccl]") {
  auto world = one_rank_nccl_world();
  REQUIRE(world->options().backend == "nccl");
  check_collectives(*world);
  // 3 per reduced dtype (sum, max, reduce-scatter) x 2 + 3 gathers + broadcast + barrier; the
  // rejected gather is refused before it is issued, so it takes no sequence number.
  CHECK(world->sequence_number() == 11);
}

TEST_CASE("one-rank NCCL sub-group (as FSDP and TP form theirs)", "[cuda][nccl]") {
  auto world = one_rank_nccl_world();
  std::unique_ptr<Comm> shard = world->new_group({0}, "dp_shard");
  REQUIRE(shard != nullptr);
  CHECK(shard->name() == "dp_shard");
  check_collectives(*shard);
  // The parent group still works after a sibling communicator exists on the same device.
  at::Tensor x = ramp(10, at::kFloat), expected = x.clone();
  world->all_reduce(x, ReduceOp::kSum);
  CHECK(at::equal(x, expected));
}

int main(int argc, char** argv) {
  if (!at::hasCUDA()) {
    std::printf("test_nccl: SKIPPED - no CUDA device visible (the NCCL checks need a GPU)\n");
    return kSkipReturnCode;
  }
  return Catch::Session().run(argc, argv);
}
