// trainer/observe/memory.h — what titan can measure of memory, per device.
//
// CPU: a counting allocator installed with c10::SetCPUAllocator before the first tensor exists.
// It tracks the bytes of live tensor storages (the CPU analogue of the CUDA caching allocator's
// "allocated" bytes) and their peak since the last reset. Memory that LibTorch kernels take
// outside tensors (oneDNN scratch, thread stacks) is not counted; the process's resident set is
// reported beside it at start-up.
// CUDA: the caching allocator's reserved-bytes peak, as torchtitan reports.
#pragma once

#include <c10/core/Device.h>

#include <array>
#include <cstdint>
#include <map>
#include <vector>

namespace titan::trainer::observe {

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

// ---- CPU limit and recording (the same counting allocator) ----

// Live tensor bytes above `bytes` make the next allocation throw c10::OutOfMemoryError (a test
// can exercise the out-of-memory path on any machine). 0 = no limit.
void set_cpu_memory_limit(int64_t bytes);
int64_t cpu_memory_limit();

// One recorded allocator event. `scope` is model::current_scope_path_id() and `category` a
// model::MemoryCategory at the time of the allocation (a free repeats its allocation's).
struct MemoryEvent {
  enum Action : uint8_t { kAlloc, kFree, kOom };
  Action action;
  uint8_t category;
  int32_t scope;
  uintptr_t addr;
  int64_t size;
  int64_t time_us;  // microseconds since the Unix epoch
};
struct LiveAllocation {
  int64_t size;
  int32_t scope;
  uint8_t category;
};
struct MemoryRecord {
  std::vector<MemoryEvent> events;            // since the last restart, oldest first
  bool events_truncated = false;              // more than kMaxRecordedEvents happened
  std::map<uintptr_t, LiveAllocation> live;   // every live recorded allocation by address
  std::array<int64_t, 8> category_bytes_at_restart{};  // live bytes per category then
  int64_t current_bytes = 0, peak_bytes = 0;  // memory_stats()' counters when copied
};
constexpr size_t kMaxRecordedEvents = 2'000'000;

// While enabled, every CPU allocation and free is recorded with its size, time and scope.
// Enable before the model is built so parameters are part of the record.
void set_cpu_memory_recording(bool enabled);
bool cpu_memory_recording();
// CUDA builds: the caching allocator's alloc / free_completed / oom events, through an
// allocator trace tracker, with titan's scope and category at the time of the allocation, so a
// GPU rank gets the same HTML picture as a CPU one (PyTorch's own snapshot pickle is written
// beside it). Sizes are the caching allocator's (rounded) block sizes. Throws without CUDA.
void set_cuda_memory_recording(bool enabled);
// Drops the recorded events of `device`'s record (keeping the live set), e.g. at the start of
// a profiled step.
void restart_memory_trace(c10::Device device);
// A consistent copy of `device`'s record, with memory_stats(device)'s counters.
MemoryRecord memory_record(c10::Device device);

int64_t process_rss_bytes();      // VmRSS of this process
int64_t process_peak_rss_bytes(); // VmHWM of this process
int64_t total_ram_bytes();

}  // namespace titan::trainer::observe
