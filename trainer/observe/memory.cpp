#include "trainer/observe/memory.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <unordered_map>
#include <vector>
#include <chrono>
#include <fstream>
#include <mutex>
#include <stdexcept>
#include <string>

#include "model/scope.h"

#ifdef TITAN_WITH_CUDA
#include <ATen/Context.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#endif

namespace titan::trainer::observe {
namespace {

std::atomic<int64_t> g_current{0};
std::atomic<int64_t> g_peak{0};
std::atomic<bool> g_installed{false};
std::atomic<int64_t> g_limit{0};
std::atomic<bool> g_recording{false};

// A record, guarded by its mutex; touched only while recording (one relaxed load otherwise).
// One for the CPU allocator, one for the CUDA caching allocator's trace.
struct Recorder {
  std::mutex mu;
  MemoryRecord record;
};

Recorder& cpu_recorder() {
  static auto* r = new Recorder();  // outlives static destruction: storages free at exit
  return *r;
}

std::atomic<bool> g_cuda_recording{false};
Recorder& cuda_recorder() {
  static auto* r = new Recorder();
  return *r;
}

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch()).count();
}

void record_event(Recorder& r, MemoryEvent::Action action, uintptr_t addr, int64_t size,
                  int32_t scope, uint8_t category) {
  std::lock_guard<std::mutex> lock(r.mu);
  MemoryRecord& rec = r.record;
  if (action == MemoryEvent::kAlloc) {
    rec.live[addr] = {size, scope, category};
  } else if (action == MemoryEvent::kFree) {
    auto it = rec.live.find(addr);
    if (it == rec.live.end()) return;  // allocated before recording started
    scope = it->second.scope;
    category = it->second.category;
    rec.live.erase(it);
  }
  if (rec.events.size() >= kMaxRecordedEvents) {
    rec.events_truncated = true;
    return;
  }
  rec.events.push_back({action, category, scope, addr, size, now_us()});
}

void record_event(MemoryEvent::Action action, uintptr_t addr, int64_t size, int32_t scope,
                  uint8_t category) {
  record_event(cpu_recorder(), action, addr, size, scope, category);
}

void restart_trace(Recorder& r) {
  std::lock_guard<std::mutex> lock(r.mu);
  r.record.events.clear();
  r.record.events_truncated = false;
  r.record.category_bytes_at_restart.fill(0);
  for (const auto& [addr, a] : r.record.live) r.record.category_bytes_at_restart[a.category % 8] += a.size;
}

MemoryRecord copy_record(Recorder& r) {
  std::lock_guard<std::mutex> lock(r.mu);
  return r.record;
}

// Note [Tracked DataPtr]: the DataPtr handed out keeps data == context (LibTorch's
// Allocator::raw_allocate asserts it, and bf16 kernels allocate that way) and uses
// tracked_delete as its deleter and as raw_deleter(). The byte count of each live allocation
// lives in a side table keyed by the pointer; the base allocator (c10's default CPU
// allocator, whose DataPtrs also have data == context) frees the memory.
struct LiveAllocations {
  std::mutex mu;
  std::unordered_map<void*, int64_t> bytes;
};
LiveAllocations& live_allocations() {
  static auto* table = new LiveAllocations();  // outlives static destruction, like the allocator
  return *table;
}
std::atomic<c10::DeleterFnPtr> g_base_deleter{nullptr};

// Note [Large blocks cached by size]: glibc's heap fragments under a CPU training step's
// pattern (large activation and communication buffers freed by other threads, between small
// storages): with context parallelism on 4 ranks the resident set grew 60 MB per step of the
// debug model (the 100M model: 6.4 GB per rank after 3 steps, OOM-killed) while live tensor bytes
// stayed at 0.06 / 0.61 GiB; tcmalloc held it flat. So storages of kCachedBlockMin bytes and
// more are whole pages mapped for them, and a freed one waits in a cache keyed by its size for
// the next request of that size (a step asks for the same sizes every step), up to
// kBlockCacheBytes in all; a block that would pass that bound, or a mapping that fails, first
// unmaps every cached block.
// The pages stay mapped from one step to the next, so they are not faulted in and zeroed again
// either (what glibc's mmap threshold used to cost: Note [Freed memory kept for the next step]).
constexpr size_t kCachedBlockMin = 128 << 10;
constexpr size_t kBlockCacheBytes = size_t{1} << 30;

// A block's mapped size: its request rounded up to whole pages (the request is what the live
// table keeps, so a freed block's size is known again from it).
size_t block_bytes(size_t n) {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return (n + page - 1) / page * page;
}

struct BlockCache {
  std::mutex mu;
  std::unordered_map<size_t, std::vector<void*>> free_by_size;  // by block_bytes
  size_t cached_bytes = 0;

  // A block for a request of `n` bytes (n >= kCachedBlockMin), or null if the system has none.
  void* take(size_t n) {
    const size_t size = block_bytes(n);
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = free_by_size.find(size);
      if (it != free_by_size.end() && !it->second.empty()) {
        void* block = it->second.back();
        it->second.pop_back();
        cached_bytes -= size;
        return block;
      }
    }
    void* block = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (block == MAP_FAILED) {  // the cache's blocks back to the system, then once more
      std::unique_lock<std::mutex> lock(mu);
      unmap(drain(), lock);
      block = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    }
    return block == MAP_FAILED ? nullptr : block;
  }

  // `block`, taken for `n` bytes, is free. A block that would take the cache over its bound
  // first empties it: sizes asked for before (another shape, an evaluation) give way to the ones
  // asked for now.
  void give_back(void* block, size_t n) {
    const size_t size = block_bytes(n);
    std::unique_lock<std::mutex> lock(mu);
    std::vector<std::pair<void*, size_t>> unmapped;
    if (cached_bytes + size > kBlockCacheBytes) unmapped = drain();
    if (size > kBlockCacheBytes) {
      unmapped.emplace_back(block, size);
    } else {
      free_by_size[size].push_back(block);
      cached_bytes += size;
    }
    unmap(unmapped, lock);
  }

 private:
  // Under `mu`: every cached block, out of the cache.
  std::vector<std::pair<void*, size_t>> drain() {
    std::vector<std::pair<void*, size_t>> blocks;
    for (auto& [size, list] : free_by_size)
      for (void* b : list) blocks.emplace_back(b, size);
    free_by_size.clear();
    cached_bytes = 0;
    return blocks;
  }

  // Unmaps `blocks` after releasing `lock` (munmap takes long; other threads need not wait).
  static void unmap(const std::vector<std::pair<void*, size_t>>& blocks, std::unique_lock<std::mutex>& lock) {
    lock.unlock();
    for (const auto& [b, size] : blocks) munmap(b, size);
  }
};
BlockCache& block_cache() {
  static auto* cache = new BlockCache();  // outlives static destruction, like the allocator
  return *cache;
}

void tracked_delete(void* data) {
  int64_t bytes = 0;
  {
    LiveAllocations& table = live_allocations();
    std::lock_guard<std::mutex> lock(table.mu);
    auto it = table.bytes.find(data);
    if (it != table.bytes.end()) {
      bytes = it->second;
      table.bytes.erase(it);
    }
  }
  g_current.fetch_sub(bytes, std::memory_order_relaxed);
  if (g_recording.load(std::memory_order_relaxed))
    record_event(MemoryEvent::kFree, reinterpret_cast<uintptr_t>(data), bytes, 0, 0);
  if (static_cast<size_t>(bytes) >= kCachedBlockMin)  // Note [Large blocks cached by size]
    block_cache().give_back(data, static_cast<size_t>(bytes));
  else
    g_base_deleter.load(std::memory_order_relaxed)(data);
}

std::string gib_text(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3f GiB", bytes / double(1ull << 30));
  return buf;
}

class CountingCPUAllocator final : public c10::Allocator {
 public:
  explicit CountingCPUAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t n) override {
    const int64_t limit = g_limit.load(std::memory_order_relaxed);
    if (limit > 0 && g_current.load(std::memory_order_relaxed) + static_cast<int64_t>(n) > limit) {
      if (g_recording.load(std::memory_order_relaxed))
        record_event(MemoryEvent::kOom, 0, static_cast<int64_t>(n), model::current_scope_path_id(),
                     static_cast<uint8_t>(model::current_memory_category()));
      C10_THROW_ERROR(OutOfMemoryError,
                      "CPU out of memory: tried to allocate " + gib_text(static_cast<int64_t>(n)) +
                          " with " + gib_text(g_current.load()) + " of tensors live; the limit " +
                          "(training.cpu_memory_limit_gib) is " + gib_text(limit) +
                          ". Raise the limit, lower training.local_batch_size or seq_len, or "
                          "enable activation_checkpoint.mode = full");
    }
    void* data = nullptr;
    if (n >= kCachedBlockMin) {  // Note [Large blocks cached by size]
      data = block_cache().take(n);
      if (data == nullptr)
        C10_THROW_ERROR(OutOfMemoryError, "CPU out of memory: the system refused " + gib_text(static_cast<int64_t>(n)) +
                                              " with " + gib_text(g_current.load()) + " of tensors live");
    } else {
      c10::DataPtr inner = base_->allocate(n);
      data = inner.get();
      if (data == nullptr) return inner;  // zero-byte storage: nothing to count
      TORCH_INTERNAL_ASSERT(inner.get_context() == data,
                            "the base CPU allocator must hand out data == context (See Note [Tracked DataPtr])");
      g_base_deleter.store(inner.get_deleter(), std::memory_order_relaxed);
      inner.release_context();
    }
    const int64_t bytes = static_cast<int64_t>(n);
    {
      LiveAllocations& table = live_allocations();
      std::lock_guard<std::mutex> lock(table.mu);
      table.bytes[data] = bytes;
    }
    if (g_recording.load(std::memory_order_relaxed))
      record_event(MemoryEvent::kAlloc, reinterpret_cast<uintptr_t>(data), bytes,
                   model::current_scope_path_id(),
                   static_cast<uint8_t>(model::current_memory_category()));
    const int64_t now = g_current.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    int64_t peak = g_peak.load(std::memory_order_relaxed);
    while (now > peak && !g_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
    return {data, data, &tracked_delete, c10::Device(c10::kCPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &tracked_delete; }

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

void set_cpu_memory_limit(int64_t bytes) { g_limit.store(bytes < 0 ? 0 : bytes); }
int64_t cpu_memory_limit() { return g_limit.load(); }

void set_cpu_memory_recording(bool enabled) {
  if (!enabled) {
    g_recording.store(false);
    return;
  }
  Recorder& r = cpu_recorder();
  {
    std::lock_guard<std::mutex> lock(r.mu);
    r.record = MemoryRecord{};
  }
  g_recording.store(true);
}

bool cpu_memory_recording() { return g_recording.load(); }

void set_cuda_memory_recording(bool enabled) {
#ifdef TITAN_WITH_CUDA
  if (enabled) {
    Recorder& r = cuda_recorder();
    {
      std::lock_guard<std::mutex> lock(r.mu);
      r.record = MemoryRecord{};
    }
    static std::once_flag attached;
    std::call_once(attached, [] {
      // Called with the allocator's lock held, on the allocating thread for an alloc (so the
      // scope and category are the caller's); takes only the recorder's own mutex.
      c10::cuda::CUDACachingAllocator::attachAllocatorTraceTracker(
          [](const c10::CachingDeviceAllocator::TraceEntry& e) {
            if (!g_cuda_recording.load(std::memory_order_relaxed)) return;
            using A = c10::CachingDeviceAllocator::TraceEntry::Action;
            MemoryEvent::Action action;
            switch (e.action_) {
              case A::ALLOC: action = MemoryEvent::kAlloc; break;
              case A::FREE_COMPLETED: action = MemoryEvent::kFree; break;
              case A::OOM: action = MemoryEvent::kOom; break;
              default: return;  // free_requested, segment and snapshot events
            }
            record_event(cuda_recorder(), action, e.action_ == A::OOM ? 0 : e.addr_,
                         static_cast<int64_t>(e.size_), model::current_scope_path_id(),
                         static_cast<uint8_t>(model::current_memory_category()));
          });
    });
  }
  g_cuda_recording.store(enabled);
#else
  if (enabled)
    throw std::runtime_error("CUDA memory recording: this titan was built without CUDA (-DTITAN_CUDA=OFF)");
#endif
}

void restart_memory_trace(c10::Device device) {
  restart_trace(device.is_cuda() ? cuda_recorder() : cpu_recorder());
}

MemoryRecord memory_record(c10::Device device) {
  MemoryRecord copy = copy_record(device.is_cuda() ? cuda_recorder() : cpu_recorder());
  const MemoryStats stats = memory_stats(device);
  copy.current_bytes = stats.current_bytes;
  copy.peak_bytes = stats.peak_bytes;
  return copy;
}

int64_t total_ram_bytes() {
  return static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
}
int64_t process_rss_bytes() { return read_status_kib("VmRSS"); }
int64_t process_peak_rss_bytes() { return read_status_kib("VmHWM"); }

MemoryStats memory_stats(c10::Device device) {
  MemoryStats stats;
#ifdef TITAN_WITH_CUDA
  if (device.is_cuda()) {
    // The caching allocator exists only once CUDA is initialized; before the first allocation
    // (the start-up memory check) its statistics call would fail with "Invalid device argument".
    at::globalContext().lazyInitDevice(at::kCUDA);
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
    at::globalContext().lazyInitDevice(at::kCUDA);
    c10::cuda::CUDACachingAllocator::resetPeakStats(
        device.has_index() ? device.index() : c10::cuda::current_device());
    return;
  }
#endif
  g_peak.store(g_current.load());
}

}  // namespace titan::trainer::observe
