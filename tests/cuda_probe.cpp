// Installs the CUDA probe of tests/cuda_probe.h: true when this build has CUDA and sees a device.
#include <ATen/Context.h>

#include "tests/cuda_probe.h"

namespace {
const bool installed = [] {
  titan::testing::cuda_device_probe = [] { return at::hasCUDA(); };
  return true;
}();
}  // namespace
