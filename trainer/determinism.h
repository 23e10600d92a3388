// trainer/determinism.h — training.deterministic: the process-wide switches that make reruns
// bit-identical, as torchtitan's set_determinism (torchtitan/distributed/utils.py).
#pragma once

namespace titan::trainer {

// deterministic = true, on every rank, before the model is built and before the first CUDA
// GEMM (cuBLAS reads CUBLAS_WORKSPACE_CONFIG when it creates its handle):
//   - ATen deterministic algorithms (torch.use_deterministic_algorithms(True)): an op that has
//     no deterministic kernel on this device is an error, and new uninitialized memory is filled
//     with NaN, so a read of it cannot pass unnoticed;
//   - cuDNN deterministic, cuDNN benchmark off (no autotuned algorithm choice);
//   - CUBLAS_WORKSPACE_CONFIG=":4096:8" (cuBLAS's deterministic workspace layout);
//   - oneDNN deterministic, the CPU twin of the cuDNN switch (beyond torchtitan, which has no CPU
//     training path).
// ATen's CPU kernels are run-to-run deterministic for a fixed thread count already; reductions
// split by thread, so bit-identical CPU reruns also need the same training.num_threads.
// Logs one line saying what it set. deterministic = false restores LibTorch's defaults for the
// ATen, cuDNN and oneDNN switches (so a later Trainer in the same process is not affected) and
// leaves the environment alone.
void apply_determinism(bool deterministic);

}  // namespace titan::trainer
