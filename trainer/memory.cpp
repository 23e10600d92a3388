#include "trainer/memory.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <string>

#ifdef TITAN_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#endif

namespace titan::trainer {
namespace {

std::atomic<int64_t> g_current{0};
std::atomic<int64_t> g_peak{0};
std::atomic<bool> g_installed{false};

// The base allocation's pointer and deleter travel with the DataPtr so that a free can be
// counted and then handed back to the allocator that made it.
struct TrackedContext {
  void* base_context;
  c10::DeleterFnPtr base_deleter;
  int64_t bytes;
};

void tracked_delete(void* ctx) {
  auto* tracked = static_cast<TrackedContext*>(ctx);
  g_current.fetch_sub(tracked->bytes, std::memory_order_relaxed);
  if (tracked->base_deleter) tracked->base_deleter(tracked->base_context);
  delete tracked;
}

class CountingCPUAllocator final : public c10::Allocator {
 public:
  explicit CountingCPUAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = base_->allocate(n);
    void* data = inner.get();
    c10::DeleterFnPtr deleter = inner.get_deleter();
    void* context = inner.release_context();
    auto* tracked = new TrackedContext{context, deleter, static_cast<int64_t>(n)};
    const int64_t now = g_current.fetch_add(tracked->bytes, std::memory_order_relaxed) + tracked->bytes;
    int64_t peak = g_peak.load(std::memory_order_relaxed);
    while (now > peak && !g_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
    return {data, tracked, &tracked_delete, c10::Device(c10::kCPU)};
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

 private:
  c10::Allocator* base_;
};

int64_t read_status_kib(const char* key) {
  std::ifstream status("/proc/self/status");
  std::string line;
  const std::string prefix = std::string(key) + ":";
  while (std::getline(status, line))
    if (line.rfind(prefix, 0) == 0) return std::stoll(line.substr(prefix.size())) * 1024;
  return 0;
}

}  // namespace

void install_cpu_memory_tracker() {
  if (g_installed.exchange(true)) return;
  // Lives for the whole program: storages freed at exit still call into it.
  static auto* allocator = new CountingCPUAllocator(c10::GetCPUAllocator());
  c10::SetCPUAllocator(allocator, /*priority=*/100);
}

bool cpu_memory_tracker_installed() { return g_installed.load(); }

int64_t total_ram_bytes() {
  return static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
}
int64_t process_rss_bytes() { return read_status_kib("VmRSS"); }
int64_t process_peak_rss_bytes() { return read_status_kib("VmHWM"); }

MemoryStats memory_stats(c10::Device device) {
  MemoryStats stats;
#ifdef TITAN_WITH_CUDA
  if (device.is_cuda()) {
    const auto index = device.has_index() ? device.index() : c10::cuda::current_device();
    auto s = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
    stats.current_bytes = s.reserved_bytes[0].current;
    stats.peak_bytes = s.reserved_bytes[0].peak;
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess)
      stats.device_capacity = static_cast<int64_t>(total_bytes);
    return stats;
  }
#endif
  stats.current_bytes = g_current.load();
  stats.peak_bytes = g_peak.load();
  stats.device_capacity = total_ram_bytes();
  return stats;
}

void reset_peak_memory(c10::Device device) {
#ifdef TITAN_WITH_CUDA
  if (device.is_cuda()) {
    c10::cuda::CUDACachingAllocator::resetPeakStats(
        device.has_index() ? device.index() : c10::cuda::current_device());
    return;
  }
#endif
  g_peak.store(g_current.load());
}

}  // namespace titan::trainer
