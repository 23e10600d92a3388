// trainer/memory.h — what titan can measure of memory, per device.
//
// CPU: a counting allocator installed with c10::SetCPUAllocator before the first tensor exists.
// It tracks the bytes of live tensor storages (the CPU analogue of the CUDA caching allocator's
// "allocated" bytes) and their peak since the last reset. Memory that LibTorch kernels take
// outside tensors (oneDNN scratch, thread stacks) is not counted; the process's resident set is
// reported beside it at start-up.
// CUDA: the caching allocator's reserved-bytes peak, as torchtitan reports.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>

namespace titan::trainer {

// Installs the counting CPU allocator. Call first thing in main(); idempotent.
void install_cpu_memory_tracker();
bool cpu_memory_tracker_installed();

struct MemoryStats {
  int64_t current_bytes = 0;
  int64_t peak_bytes = 0;      // since the last reset_peak_memory
  int64_t device_capacity = 0; // total RAM for the CPU; total device memory for CUDA
};
MemoryStats memory_stats(c10::Device device);
void reset_peak_memory(c10::Device device);

int64_t process_rss_bytes();      // VmRSS of this process
int64_t process_peak_rss_bytes(); // VmHWM of this process
int64_t total_ram_bytes();

}  // namespace titan::trainer
