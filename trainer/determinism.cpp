#include "trainer/determinism.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>

#include <cstdlib>
#include <string>

#include "util/logging.h"

namespace titan::trainer {

namespace {
// cuBLAS's documented deterministic workspace setting (":16:8" is the other; torchtitan uses this).
constexpr const char* kCublasWorkspaceConfig = ":4096:8";
}  // namespace

void apply_determinism(bool deterministic) {
  at::Context& context = at::globalContext();
  context.setDeterministicAlgorithms(deterministic, /*warn_only=*/false);
  context.setDeterministicCuDNN(deterministic);
  context.setBenchmarkCuDNN(false);  // LibTorch's default; deterministic runs require it
  context.setDeterministicMkldnn(deterministic);
  if (!deterministic) return;

  const char* previous = std::getenv("CUBLAS_WORKSPACE_CONFIG");
  std::string workspace_note;
  if (previous != nullptr && std::string(previous) != kCublasWorkspaceConfig)
    workspace_note = " (was '" + std::string(previous) + "')";
  ::setenv("CUBLAS_WORKSPACE_CONFIG", kCublasWorkspaceConfig, /*overwrite=*/1);
  util::log_info(std::string("deterministic: ATen deterministic algorithms on (an op without a "
                             "deterministic kernel is an error), cuDNN deterministic + benchmark off, "
                             "oneDNN deterministic, CUBLAS_WORKSPACE_CONFIG=") +
                 kCublasWorkspaceConfig + workspace_note +
                 "; CPU results are bit-identical across reruns with the same thread count (now " +
                 std::to_string(at::get_num_threads()) + "); expect slower steps");
}

}  // namespace titan::trainer
