#include "trainer/observe/memory_snapshot.h"

#include <ATen/core/Dict.h>
#include <ATen/core/List.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <unordered_map>

#include "model/scope.h"
#include "trainer/observe/memory_plot.h"
#include "util/atomic_file.h"

#ifdef TITAN_WITH_CUDA
#include <torch/csrc/cuda/memory_snapshot.h>
#endif

namespace titan::trainer::observe {
namespace {

using c10::IValue;
using Dict = c10::Dict<IValue, IValue>;
using List = c10::List<IValue>;

Dict make_dict() { return Dict(c10::AnyType::get(), c10::AnyType::get()); }
List make_list() { return List(c10::AnyType::get()); }

// Frames of a scope path, innermost first (PyTorch's order), memoized per scope id.
class FrameCache {
 public:
  List frames(int32_t scope) {
    auto it = cache_.find(scope);
    if (it != cache_.end()) return it->second;
    List out = make_list();
    const auto path = model::scope_path(scope);
    for (auto p = path.rbegin(); p != path.rend(); ++p) {
      Dict f = make_dict();
      f.insert("name", *p);
      f.insert("filename", "titan scope");
      f.insert("line", int64_t{0});
      out.push_back(f);
    }
    cache_.emplace(scope, out);
    return out;
  }

 private:
  std::unordered_map<int32_t, List> cache_;
};

Dict trace_entry(const char* action, const MemoryEvent& e, FrameCache& frames) {
  Dict d = make_dict();
  d.insert("action", action);
  d.insert("addr", static_cast<int64_t>(e.addr));
  d.insert("size", e.size);
  d.insert("stream", int64_t{0});
  d.insert("time_us", e.time_us);
  d.insert("frames", frames.frames(e.scope));
  d.insert("category", model::memory_category_name(static_cast<model::MemoryCategory>(e.category)));
  return d;
}

// Whole or not at all (util/atomic_file.h): a full disk must not leave a truncated .pickle that
// the memory viewer then fails on, nor an empty OOM exit snapshot.
void write_file(const std::string& path, const std::string& bytes) {
  try {
    util::write_file_atomic(path, bytes);
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("memory snapshot not written: ") + e.what());
  }
}

}  // namespace

void start_memory_recording(c10::Device device) {
#ifdef TITAN_WITH_CUDA
  if (device.is_cuda()) {
    torch::cuda::_record_memory_history("all", "all", "all", /*max_entries=*/100000);
    set_cuda_memory_recording(true);  // titan's categorized record, for the HTML picture
    return;
  }
#endif
  (void)device;
  set_cpu_memory_recording(true);
}

std::string cpu_memory_snapshot_pickle(const MemoryRecord& record) {
  FrameCache frames;
  List segments = make_list();
  for (const auto& [addr, a] : record.live) {
    Dict block = make_dict();
    block.insert("address", static_cast<int64_t>(addr));
    block.insert("size", a.size);
    block.insert("requested_size", a.size);
    block.insert("state", "active_allocated");
    block.insert("frames", frames.frames(a.scope));
    List blocks = make_list();
    blocks.push_back(block);
    Dict seg = make_dict();
    seg.insert("device", int64_t{0});
    seg.insert("address", static_cast<int64_t>(addr));
    seg.insert("total_size", a.size);
    seg.insert("allocated_size", a.size);
    seg.insert("active_size", a.size);
    seg.insert("requested_size", a.size);
    seg.insert("stream", int64_t{0});
    seg.insert("segment_type", a.size < (1 << 20) ? "small" : "large");
    seg.insert("segment_pool_id", c10::ivalue::Tuple::create(int64_t{0}, int64_t{0}));
    seg.insert("is_expandable", false);
    seg.insert("frames", frames.frames(a.scope));
    seg.insert("blocks", blocks);
    seg.insert("category", model::memory_category_name(static_cast<model::MemoryCategory>(a.category)));
    segments.push_back(seg);
  }
  List trace = make_list();
  for (const MemoryEvent& e : record.events) {
    switch (e.action) {
      case MemoryEvent::kAlloc: trace.push_back(trace_entry("alloc", e, frames)); break;
      case MemoryEvent::kFree:
        // No caching on the CPU: the free is requested and completed at once.
        trace.push_back(trace_entry("free_requested", e, frames));
        trace.push_back(trace_entry("free_completed", e, frames));
        break;
      case MemoryEvent::kOom: trace.push_back(trace_entry("oom", e, frames)); break;
    }
  }
  List device_traces = make_list();
  device_traces.push_back(trace);
  Dict top = make_dict();
  top.insert("segments", segments);
  top.insert("device_traces", device_traces);
  top.insert("allocator_settings", make_dict());
  top.insert("external_annotations", make_list());
  top.insert("device", "cpu");

  std::string out;
  torch::jit::Pickler pickler([&](const char* data, size_t n) { out.append(data, n); }, nullptr,
                              nullptr, nullptr, nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(top);
  pickler.stop();
  return out;
}

std::string write_memory_snapshot(c10::Device device, const std::string& dir, int rank,
                                  const std::string& title) {
  std::filesystem::create_directories(dir);
  const std::string base = (std::filesystem::path(dir) / ("rank" + std::to_string(rank) +
                                                          "_memory_snapshot")).string();
  const std::string label = "rank " + std::to_string(rank) + " (" + device.str() + "), " + title;
#ifdef TITAN_WITH_CUDA
  if (device.is_cuda()) {
    write_file(base + ".pickle", torch::cuda::_memory_snapshot_pickled());
    write_file(base + ".html", memory_timeline_html(memory_record(device), label));
    return base + ".pickle";
  }
#endif
  const MemoryRecord record = memory_record(device);
  write_file(base + ".pickle", cpu_memory_snapshot_pickle(record));
  write_file(base + ".html", memory_timeline_html(record, label));
  return base + ".pickle";
}

}  // namespace titan::trainer::observe
