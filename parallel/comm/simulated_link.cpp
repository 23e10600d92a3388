// parallel/comm/simulated_link.cpp — see simulated_link.h (Note [Simulated link]).
#include "parallel/comm/simulated_link.h"

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>
#include <vector>

namespace titan::parallel::comm {
namespace {

using Clock = std::chrono::steady_clock;

int64_t bytes_of(const at::Tensor& t) { return t.defined() ? static_cast<int64_t>(t.numel() * t.element_size()) : 0; }
int64_t bytes_of(const std::vector<at::Tensor>& ts) {
  int64_t n = 0;
  for (const auto& t : ts) n += bytes_of(t);
  return n;
}

// The real collective's Work; waiting for it also waits until the link has carried it.
class LinkWork : public c10d::Work {
 public:
  LinkWork(c10::intrusive_ptr<c10d::Work> inner, Clock::time_point carried)
      : inner_(std::move(inner)), carried_(carried) {}
  bool wait(std::chrono::milliseconds timeout) override {
    const bool done = inner_->wait(timeout);
    std::this_thread::sleep_until(carried_);
    return done;
  }
  bool isCompleted() override { return inner_->isCompleted() && Clock::now() >= carried_; }
  bool isSuccess() const override { return inner_->isSuccess(); }
  std::exception_ptr exception() const override { return inner_->exception(); }
  std::vector<at::Tensor> result() override { return inner_->result(); }
  void synchronize() override { inner_->synchronize(); }
  void abort() override { inner_->abort(); }

 private:
  c10::intrusive_ptr<c10d::Work> inner_;
  Clock::time_point carried_;
};

class SimulatedLinkBackend : public c10d::Backend {
 public:
  SimulatedLinkBackend(c10::intrusive_ptr<c10d::Backend> inner, double latency_ms, double bytes_per_second)
      : c10d::Backend(inner->getRank(), inner->getSize()),
        inner_(std::move(inner)),
        latency_ms_(latency_ms),
        bytes_per_second_(bytes_per_second) {}

  const std::string getBackendName() const override { return inner_->getBackendName(); }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    return carry(bytes_of(tensors), inner_->broadcast(tensors, opts));
  }
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    return carry(bytes_of(tensors), inner_->allreduce(tensors, opts));
  }
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override {
    return carry(bytes_of(output), inner_->_allgather_base(output, input, opts));
  }
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override {
    return carry(bytes_of(input), inner_->_reduce_scatter_base(output, input, opts));
  }
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override {
    return carry(bytes_of(input), inner_->alltoall_base(output, input, output_splits, input_splits, opts));
  }
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    return carry(0, inner_->barrier(opts));
  }
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    return carry(bytes_of(tensors), inner_->send(tensors, dst, tag));
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    return carry(bytes_of(tensors), inner_->recv(tensors, src, tag));
  }

 private:
  // The link is busy from max(now, free) for latency + bytes / bandwidth.
  c10::intrusive_ptr<c10d::Work> carry(int64_t bytes, c10::intrusive_ptr<c10d::Work> work) {
    const double seconds =
        latency_ms_ / 1e3 + (bytes_per_second_ > 0 ? static_cast<double>(bytes) / bytes_per_second_ : 0.0);
    const Clock::time_point begin = std::max(Clock::now(), link_free_);
    link_free_ = begin + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    return c10::make_intrusive<LinkWork>(std::move(work), link_free_);
  }

  c10::intrusive_ptr<c10d::Backend> inner_;
  double latency_ms_;
  double bytes_per_second_;
  Clock::time_point link_free_{};
};

}  // namespace

c10::intrusive_ptr<c10d::Backend> with_simulated_link(c10::intrusive_ptr<c10d::Backend> inner, double latency_ms,
                                                      double bytes_per_second) {
  TORCH_CHECK(latency_ms > 0 || bytes_per_second > 0, "with_simulated_link: nothing to simulate");
  return c10::make_intrusive<SimulatedLinkBackend>(std::move(inner), latency_ms, bytes_per_second);
}

}  // namespace titan::parallel::comm
