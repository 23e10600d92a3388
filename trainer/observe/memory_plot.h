// trainer/observe/memory_plot.h — a self-contained HTML picture of memory (CPU or CUDA) over one
// recorded window.
//
// Live tensor bytes over the recorded events (x: allocator event number, y: GiB), stacked by
// category (parameters, gradients, optimizer state, activations, float8 casts, communication
// buffers, other), as inline SVG with a legend and a per-category table at the peak. No
// script, no external resource: it opens offline in any browser.
#pragma once

#include <string>

#include "trainer/observe/memory.h"

namespace titan::trainer::observe {

std::string memory_timeline_html(const MemoryRecord& record, const std::string& title);

}  // namespace titan::trainer::observe
