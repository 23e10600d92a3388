// parallel/comm/simulated_link.h — a slower network for overlap tests and benchmarks
// (comm.debug_link_latency_ms / comm.debug_link_bytes_per_second), as a c10d::Backend that wraps
// the real one.
//
// Note [Simulated link]: each Comm whose options ask for it gets one link that carries one
// collective at a time: a collective issued at t occupies it from max(t, link free) for
// latency + bytes / bytes_per_second (bytes: the larger of its input and output), and waiting
// for it returns no sooner than that. The real collective runs as usual underneath. Compute
// done between issue and wait hides this time; a blocking call shows all of it. The wrapper is
// installed when the Comm is formed, and only when a debug key is set: a production Comm talks
// to its backend directly and runs none of this.
#pragma once

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

namespace titan::parallel::comm {

// `inner` behind a simulated link of `latency_ms` per collective and `bytes_per_second` (0: no
// bandwidth limit). Both 0 is a caller error (nothing to simulate).
c10::intrusive_ptr<c10d::Backend> with_simulated_link(c10::intrusive_ptr<c10d::Backend> inner, double latency_ms,
                                                      double bytes_per_second);

}  // namespace titan::parallel::comm
