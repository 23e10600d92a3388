// trainer/observe/memory_snapshot.h — memory snapshots in PyTorch's pickle layout, per rank.
//
// CUDA: PyTorch's own recorder (torch::cuda::_record_memory_history) and its pickled snapshot.
// CPU: the counting allocator's record (memory.h) written in the SAME layout as the CUDA
// snapshot (torch.cuda.memory._dump_snapshot's file): a plain protocol-2 pickle of a dict with
//   segments        one per live allocation (the CPU allocator does not cache: every
//                   allocation is its own segment, holding one "active_allocated" block),
//   device_traces   [[entry, ...]]: action alloc | free_requested | free_completed | oom,
//                   addr, size, stream 0, time_us, frames, plus titan's `category`,
//   allocator_settings {}, external_annotations [].
// frames are titan's scope path, innermost first ({name: "attention", filename: "titan scope",
// line: 0}), so `python -m torch.cuda._memory_viz trace_plot F -o x.html` and pickle.load read
// it. Beside each snapshot (CPU and CUDA), memory_plot.h draws a self-contained HTML picture
// from titan's own categorized record (memory.h).
#pragma once

#include <c10/core/Device.h>

#include <string>

#include "trainer/observe/memory.h"

namespace titan::trainer::observe {

// Starts recording allocations on `device` (CPU: the counting allocator; CUDA: PyTorch's
// recorder, keeping the last 100000 events, plus titan's categorized record).
void start_memory_recording(c10::Device device);

// The CPU record as a plain pickle (bytes).
std::string cpu_memory_snapshot_pickle(const MemoryRecord& record);

// Writes `dir`/rank{rank}_memory_snapshot.pickle and .html beside it; returns
// the pickle's path. `title` heads the picture ("step 10", "out of memory at step 3").
std::string write_memory_snapshot(c10::Device device, const std::string& dir, int rank,
                                  const std::string& title);

}  // namespace titan::trainer::observe
