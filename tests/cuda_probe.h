// tests/cuda_probe.h — whether [cuda] test cases can run (see Note [Skipped, never passed] in
// tests/catch_main.cpp). The main defines the hook as null (no CUDA); test executables linked
// with LibTorch add tests/cuda_probe.cpp, which points it at at::hasCUDA() before main runs.
#pragma once

namespace titan::testing {
extern bool (*cuda_device_probe)();
}  // namespace titan::testing
