// parallel/comm/process_group.cpp — see process_group.h.
//
// Note [Gloo headers from Debian]: ProcessGroupGloo.hpp includes <gloo/...> headers that the
// torch wheel does not ship; Debian's libgloo-dev (git 2022-05-18) provides them. Every gloo
// type the header names reaches our code through a pointer (shared_ptr<gloo::Context>,
// shared_ptr<gloo::transport::Device>, ...), so ProcessGroupGloo's layout does not depend on
// gloo's version, and all the code that touches gloo objects runs inside libtorch_cpu.so,
// compiled against torch's own gloo. What would break: any *inline* code from the header that
// reaches into gloo, compiled here against the 2022 declarations. Two are known:
//  - ProcessGroupGloo::GlooStore: Debian's gloo::rendezvous::Store lacks the v2 virtuals
//    (has_v2_support, multi_get, multi_set, append, add) that torch's gloo has. Constructing a
//    GlooStore here would emit a shorter vtable that, exported from our binary, interposes
//    libtorch's weak copy: gloo would then call through missing slots.
//  - ProcessGroupGloo::setTimeout: calls gloo::Context::setTimeout through 2022 declarations.
// So this file never names GlooStore, never calls setTimeout or any other gloo member, and
// only passes the opaque device pointer from createDeviceFor*() back into the options.
// tests/test_comm.cpp checks all collectives against closed forms with these headers.
#include "parallel/comm/process_group.h"
#include "parallel/comm/comm_trace.h"
#include "parallel/comm/simulated_link.h"

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#ifdef TITAN_WITH_CUDA
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <cstdio>
#include <thread>
#include <cstdlib>
#include <atomic>
#include <mutex>
#include <sstream>

#include "model/scope.h"

namespace titan::parallel::comm {
namespace {

using Clock = std::chrono::steady_clock;

// Note [Issuing under one lock] (in Comm::issue).
std::atomic<bool> ranks_share_process{false};
std::mutex& issue_lock() {
  static std::mutex lock;
  return lock;
}

// c10::Error::what() appends a C++ backtrace of c10's internals; the first part is the message.
std::string error_text(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    return c10_error->what_without_backtrace();
  }
  return e.what();
}

std::string join(const std::vector<int>& values) {
  std::ostringstream os;
  for (size_t i = 0; i < values.size(); ++i) os << (i ? ", " : "") << values[i];
  return os.str();
}

std::shared_ptr<::gloo::transport::Device> create_device(const CommOptions& options) {
  using Gloo = c10d::ProcessGroupGloo;
  if (!options.device_interface.empty()) {
    return Gloo::createDeviceForInterface(options.device_interface);
  }
  if (!options.device_hostname.empty()) {
    return Gloo::createDeviceForHostname(options.device_hostname);
  }
  return Gloo::createDefaultDevice();
}

}  // namespace

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kMax: return "max";
  }
  return "?";
}

c10::intrusive_ptr<c10d::Store> create_tcp_store(const std::string& host, int port, int rank,
                                                 int world_size,
                                                 std::chrono::milliseconds timeout,
                                                 std::optional<bool> serve) {
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<std::uint16_t>(port);
  opts.isServer = serve.value_or(rank == 0);
  opts.numWorkers = static_cast<std::size_t>(world_size);
  // Rank 0 must return at once: with port 0 it has to hand the chosen port to the others
  // before they can connect. Group formation (Comm) waits for everyone anyway.
  opts.waitWorkers = false;
  opts.timeout = timeout;
  try {
    return c10::make_intrusive<c10d::TCPStore>(host, opts);
  } catch (const std::exception& e) {
    std::ostringstream os;
    os << "[rank " << rank << "] could not " << (rank == 0 ? "serve" : "reach")
       << " the TCPStore at " << host << ":" << port << " (world size " << world_size
       << ", timeout " << timeout.count() << " ms): " << error_text(e);
    if (rank != 0) os << "\nhint: is rank 0 running, and are MASTER_ADDR/MASTER_PORT right?";
    if (rank == 0 && port != 0) os << "\nhint: is another job using port " << port << "?";
    throw CommError(os.str());
  }
}

int store_port(const c10::intrusive_ptr<c10d::Store>& store) {
  auto* tcp = dynamic_cast<c10d::TCPStore*>(store.get());
  TORCH_CHECK(tcp != nullptr, "store_port: the store is not a TCPStore");
  return tcp->getPort();
}

Comm::Comm(c10::intrusive_ptr<c10d::Store> store, int rank, int size, std::string name,
           CommOptions options, std::vector<int> global_ranks)
    : store_(std::move(store)),
      rank_(rank),
      size_(size),
      name_(std::move(name)),
      options_(std::move(options)),
      global_ranks_(std::move(global_ranks)) {
  if (global_ranks_.empty()) {
    for (int r = 0; r < size_; ++r) global_ranks_.push_back(r);
  }
  if (size_ < 1 || rank_ < 0 || rank_ >= size_ ||
      global_ranks_.size() != static_cast<size_t>(size_)) {
    std::ostringstream os;
    os << "group '" << name_ << "': rank " << rank_ << " / size " << size_ << " with "
       << global_ranks_.size() << " global ranks [" << join(global_ranks_)
       << "] is inconsistent (need 0 <= rank < size == number of global ranks)";
    throw CommError(os.str());
  }
  last_.group = name_;
  // "none": ranks and sizes without a transport (the start-up dry run shards for one rank of a
  // layout it does not run); issuing a collective on it fails in issue().
  if (options_.backend == "none") return;
  try {
#ifdef TITAN_WITH_CUDA
    if (options_.backend == "nccl") {
      auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
      nccl_options->timeout = options_.timeout;
      nccl_options->group_name = name_;
      for (int g : global_ranks_) nccl_options->global_ranks_in_group.push_back(g);
      auto prefixed = c10::make_intrusive<c10d::PrefixStore>(name_ + "/", store_);
      backend_ = c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, rank_, size_, nccl_options);
    }
#endif
    if (!backend_ && options_.backend != "gloo")
      throw std::invalid_argument("backend '" + options_.backend + "' is not available in this build "
                                  "(gloo" +
#ifdef TITAN_WITH_CUDA
                                  std::string(", nccl") +
#else
                                  std::string() +
#endif
                                  ")");
    if (!backend_) {
      auto gloo_options = c10d::ProcessGroupGloo::Options::create(options_.timeout);
      gloo_options->devices.push_back(create_device(options_));
      gloo_options->group_name = name_;
      for (int g : global_ranks_) gloo_options->global_ranks_in_group.push_back(g);
      // Every group gets its own key space: Gloo's rendezvous keys would collide otherwise.
      auto prefixed = c10::make_intrusive<c10d::PrefixStore>(name_ + "/", store_);
      backend_ = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, rank_, size_, gloo_options);
    }
    // Note [Simulated link]: only when a debug key asks for it, a wrapper around the transport.
    if (options_.debug_link_latency_ms > 0 || options_.debug_link_bytes_per_second > 0)
      backend_ = with_simulated_link(backend_, options_.debug_link_latency_ms, options_.debug_link_bytes_per_second);
  } catch (const std::exception& e) {
    std::ostringstream os;
    os << "could not form the group (timeout " << options_.timeout.count()
       << " ms; device " << (options_.device_interface.empty()
                                  ? "host '" + options_.device_hostname + "'"
                                  : "interface '" + options_.device_interface + "'")
       << "): " << error_text(e)
       << "\nhint: every member must create group '" << name_ << "' with size " << size_;
    fail("group creation", os.str());
  }
}

Comm::~Comm() = default;

std::unique_ptr<Comm> Comm::new_group(const std::vector<int>& ranks,
                                      const std::string& name) const {
  std::vector<int> global;
  int my_rank = -1;
  for (size_t i = 0; i < ranks.size(); ++i) {
    int r = ranks[i];
    if (r < 0 || r >= size_) {
      fail("new_group '" + name + "'",
           "rank " + std::to_string(r) + " in [" + join(ranks) + "] is outside [0, " +
               std::to_string(size_) + ")");
    }
    if (std::count(ranks.begin(), ranks.end(), r) > 1) {
      fail("new_group '" + name + "'", "rank " + std::to_string(r) + " is listed twice in [" +
                                           join(ranks) + "]");
    }
    if (r == rank_) my_rank = static_cast<int>(i);
    global.push_back(global_ranks_[static_cast<size_t>(r)]);
  }
  if (my_rank < 0) return nullptr;
  return std::make_unique<Comm>(store_, my_rank, static_cast<int>(ranks.size()), name, options_,
                                std::move(global));
}

std::string Comm::where() const {
  std::ostringstream os;
  os << "[rank " << global_rank() << "] group '" << name_ << "' (rank " << rank_ << " of "
     << size_ << ", global ranks [" << join(global_ranks_) << "])";
  return os.str();
}

TensorSummary::TensorSummary(const at::Tensor& t) : defined(t.defined()) {
  if (!defined) return;
  dtype = t.scalar_type();
  sizes.assign(t.sizes().begin(), t.sizes().end());
  device = t.device();
  contiguous = t.is_contiguous();
}

std::string TensorSummary::describe() const {
  if (!defined) return "undefined tensor";
  std::ostringstream os;
  os << dtype << " " << c10::IntArrayRef(sizes) << " on " << device << (contiguous ? "" : " (non-contiguous)");
  return os.str();
}

std::string Comm::describe_tensor(const at::Tensor& t) const { return TensorSummary(t).describe(); }

void Comm::fail(const std::string& what, const std::string& reason) const {
  throw CommError(where() + ": " + what + " failed: " + reason);
}

// Owns the sequence numbering and the record of every collective; each public collective is a
// check plus one c10d call. The handle's wait() owns the timing and the error capture.
template <typename Launch>
CommWork Comm::issue(std::string op, const at::Tensor& tensor, Launch&& launch, bool p2p) {
  if (!backend_) fail(op, "this group has no transport (backend 'none', the start-up dry run)");
  CommWork w;
  w.comm_ = this;
  CollectiveRecord record;
  record.seq = p2p ? ++p2p_seq_ : last_.seq + 1;  // See Note [Point-to-point]
  record.op = std::move(op);
  record.bytes = tensor.defined() ? static_cast<int64_t>(tensor.numel() * tensor.element_size()) : 0;
  record.group = last_.group;
  if (!p2p) last_ = record;
  total_bytes_ += record.bytes;
  w.record_ = record;
  w.p2p_ = p2p;
  w.tensor_ = TensorSummary(tensor);
  const std::string kind = p2p ? "point-to-point " : "collective ";
  // A named range in profiler traces; memory allocated inside counts as communication buffers.
  model::NamedScope scope(kind + w.record_.op, model::MemoryCategory::kCommunication);
  w.start_ = Clock::now();
  w.trace_id_ = comm_trace().on_issue(name_, w.record_.seq, w.record_.op, w.record_.bytes);
  try {
    // Note [Issuing under one lock]: ProcessGroupGloo records every collective it enqueues in
    // LibTorch's process-wide flight recorder, whose table of groups is read and extended without
    // a lock; groups issuing from several threads of one process (the tests' ranks as threads)
    // crashed there about once in thirty runs. A training process issues from one thread (the
    // checkpoint thread issues nothing), so the lock is taken only where ranks share a process:
    // tests/rank_threads.h turns it on before its ranks form their groups.
    std::unique_lock<std::mutex> hold(issue_lock(), std::defer_lock);
    if (ranks_share_process.load(std::memory_order_relaxed)) hold.lock();
    w.work_ = launch();
  } catch (const std::exception& e) {
    w.work_.reset();
    comm_trace().on_state(w.trace_id_, CollectiveState::kFailed);
    throw CommError(where() + ": " + kind + w.record_.op + " #" + std::to_string(w.record_.seq) + " (" +
                    std::to_string(w.record_.bytes) + " bytes, " + w.tensor_.describe() +
                    ") could not be issued: " + error_text(e));
  }
  return w;
}

CommWork::CommWork(CommWork&& other) noexcept { *this = std::move(other); }

CommWork& CommWork::operator=(CommWork&& other) noexcept {
  if (this != &other) {
    if (work_.defined()) {
      try {
        wait();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "%s\n", e.what());
      }
    }
    comm_ = other.comm_;
    work_ = std::move(other.work_);
    other.work_.reset();
    record_ = std::move(other.record_);
    tensor_ = std::move(other.tensor_);
    start_ = other.start_;
    trace_id_ = other.trace_id_;
    p2p_ = other.p2p_;
  }
  return *this;
}

CommWork::~CommWork() {
  if (!work_.defined()) return;
  try {
    wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
  }
}

void CommWork::wait() {
  if (!work_.defined()) return;
  c10::intrusive_ptr<c10d::Work> work = std::move(work_);
  work_.reset();
  model::NamedScope scope("wait " + record_.op, model::MemoryCategory::kCommunication);
  const auto waited_from = Clock::now();
  comm_trace().on_state(trace_id_, CollectiveState::kStarted);
  try {
    work->wait();
  } catch (const std::exception& e) {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start_);
    // Gloo's errors do not say "timeout" reliably; having waited the whole timeout does.
    const bool timed_out = ms >= comm_->options_.timeout;
    comm_trace().on_state(trace_id_, timed_out ? CollectiveState::kTimedOut : CollectiveState::kFailed);
    std::ostringstream os;
    os << (p2p_ ? "point-to-point " : "collective ") << record_.op << " #" << record_.seq << " (" << record_.bytes
       << " bytes, "
       << tensor_.describe() << ") " << (timed_out ? "timed out" : "failed") << " after " << ms.count()
       << " ms (timeout " << comm_->options_.timeout.count() << " ms): " << error_text(e);
    const std::string message = comm_->where() + ": " + os.str();
    std::string dump_error;
    const std::string dumped = comm_trace().dump(message, &dump_error);
    if (!dumped.empty()) {
      os << "\nthe last " << comm_trace().capacity() << " collectives of this rank (flight recorder) -> "
         << dumped << " (compare the ranks' files: the rank that stopped has the lowest last seq)";
    } else if (!dump_error.empty()) {
      os << "\nwriting the flight recorder failed: " << dump_error;
    }
    throw CommError(comm_->where() + ": " + os.str());
  }
  comm_trace().on_state(trace_id_, CollectiveState::kCompleted);
  const auto done = Clock::now();
  comm_->total_seconds_ += std::chrono::duration<double>(done - start_).count();
  comm_->exposed_seconds_ += std::chrono::duration<double>(done - waited_from).count();
}

CommWork Comm::all_reduce_async(const at::Tensor& tensor, ReduceOp op) {
  std::string name = std::string("all_reduce(") + reduce_op_name(op) + ")";
  if (!tensor.defined() || !tensor.is_contiguous()) {
    fail(name, "tensor must be defined and contiguous, got " + describe_tensor(tensor));
  }
  return issue(name, tensor, [&] {
    std::vector<at::Tensor> tensors = {tensor};
    c10d::AllreduceOptions opts;
    opts.reduceOp = op == ReduceOp::kSum ? c10d::ReduceOp::SUM : c10d::ReduceOp::MAX;
    return backend_->allreduce(tensors, opts);
  });
}

CommWork Comm::all_gather_into_tensor_async(const at::Tensor& output, const at::Tensor& input) {
  const char* name = "all_gather_into_tensor";
  if (!input.defined() || !output.defined() || !input.is_contiguous() ||
      !output.is_contiguous() || output.scalar_type() != input.scalar_type() ||
      output.numel() != input.numel() * size_) {
    fail(name, "need contiguous tensors of one dtype with output.numel() == " +
                   std::to_string(size_) + " * input.numel(); got input " +
                   describe_tensor(input) + ", output " + describe_tensor(output));
  }
  return issue(name, input, [&] {
    at::Tensor out = output;
    at::Tensor in = input;
    return backend_->_allgather_base(out, in);
  });
}

CommWork Comm::reduce_scatter_tensor_async(const at::Tensor& output, const at::Tensor& input) {
  const char* name = "reduce_scatter_tensor(sum)";
  if (!input.defined() || !output.defined() || !input.is_contiguous() ||
      !output.is_contiguous() || output.scalar_type() != input.scalar_type() ||
      input.numel() != output.numel() * size_) {
    fail(name, "need contiguous tensors of one dtype with input.numel() == " +
                   std::to_string(size_) + " * output.numel(); got input " +
                   describe_tensor(input) + ", output " + describe_tensor(output));
  }
  return issue(name, input, [&] {
    at::Tensor out = output;
    at::Tensor in = input;
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = c10d::ReduceOp::SUM;
    return backend_->_reduce_scatter_base(out, in, opts);
  });
}

CommWork Comm::all_to_all_single_async(const at::Tensor& output, const at::Tensor& input) {
  const char* name = "all_to_all_single";
  if (!input.defined() || !output.defined() || !input.is_contiguous() || !output.is_contiguous() ||
      output.scalar_type() != input.scalar_type() || output.numel() != input.numel() ||
      input.numel() % size_ != 0) {
    fail(name, "need contiguous tensors of one dtype and equal sizes divisible by " + std::to_string(size_) +
                   "; got input " + describe_tensor(input) + ", output " + describe_tensor(output));
  }
  return issue(name, input, [&] {
    at::Tensor out = output.view({-1});
    at::Tensor in = input.view({-1});
    std::vector<int64_t> equal_splits;  // empty: size_ equal slices
    return backend_->alltoall_base(out, in, equal_splits, equal_splits);
  });
}

CommWork Comm::all_to_all_async(const at::Tensor& output, const at::Tensor& input, std::vector<int64_t> output_splits,
                                std::vector<int64_t> input_splits) {
  const char* name = "all_to_all(splits)";
  auto total = [](const std::vector<int64_t>& splits) {
    int64_t sum = 0;
    for (int64_t n : splits) sum += n < 0 ? -1 : n;
    return sum;
  };
  const bool shapes_ok = input.defined() && output.defined() && input.dim() >= 1 && output.dim() == input.dim() &&
                         input.sizes().slice(1) == output.sizes().slice(1);
  if (!shapes_ok || !input.is_contiguous() || !output.is_contiguous() || output.scalar_type() != input.scalar_type() ||
      static_cast<int>(input_splits.size()) != size_ || static_cast<int>(output_splits.size()) != size_ ||
      total(input_splits) != input.size(0) || total(output_splits) != output.size(0)) {
    fail(name, "need contiguous tensors of one dtype and row shape, " + std::to_string(size_) +
                   " split sizes each adding up to the rows; got input " + describe_tensor(input) + ", output " +
                   describe_tensor(output) + ", " + std::to_string(input_splits.size()) + " input and " +
                   std::to_string(output_splits.size()) + " output splits");
  }
  return issue(name, input, [&] {
    at::Tensor out = output;
    at::Tensor in = input;
    return backend_->alltoall_base(out, in, output_splits, input_splits);
  });
}

CommWork Comm::broadcast_async(const at::Tensor& tensor, int root) {
  std::string name = "broadcast(root " + std::to_string(root) + ")";
  if (root < 0 || root >= size_) {
    fail(name, "root must be a group rank in [0, " + std::to_string(size_) + ")");
  }
  if (!tensor.defined() || !tensor.is_contiguous()) {
    fail(name, "tensor must be defined and contiguous, got " + describe_tensor(tensor));
  }
  return issue(name, tensor, [&] {
    std::vector<at::Tensor> tensors = {tensor};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    return backend_->broadcast(tensors, opts);
  });
}

CommWork Comm::barrier_async() {
  return issue("barrier", at::Tensor(), [&] { return backend_->barrier(); });
}

CommWork Comm::send_async(const at::Tensor& tensor, int peer, int tag) { return point_to_point(tensor, peer, tag, true); }

CommWork Comm::recv_async(const at::Tensor& tensor, int peer, int tag) { return point_to_point(tensor, peer, tag, false); }

CommWork Comm::point_to_point(const at::Tensor& tensor, int peer, int tag, bool send) {
  std::string name = std::string(send ? "send(to " : "recv(from ") + std::to_string(peer) + ", tag " +
                     std::to_string(tag) + ")";
  if (peer < 0 || peer >= size_ || peer == rank_)
    fail(name, "the peer must be another group rank in [0, " + std::to_string(size_) + ")");
  if (!tensor.defined() || !tensor.is_contiguous())
    fail(name, "tensor must be defined and contiguous, got " + describe_tensor(tensor));
  return issue(name, tensor, [&] {
    std::vector<at::Tensor> tensors = {tensor};
    return send ? backend_->send(tensors, peer, tag) : backend_->recv(tensors, peer, tag);
  }, /*p2p=*/true);
}

void issue_under_process_lock() { ranks_share_process.store(true); }

std::unique_ptr<Comm> init_process_group(const Rendezvous& world, CommOptions options) {
  if (!world.single_node && options.device_hostname == "127.0.0.1" && options.device_interface.empty()) {
    // Loopback cannot reach other nodes. GLOO_SOCKET_IFNAME is the variable users know from
    // PyTorch; it is read here and nowhere else.
    if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname) {
      options.device_interface = ifname;
    } else {
      options.device_hostname.clear();
    }
  }
  const auto init_timeout = options.init_timeout.count() > 0 ? options.init_timeout : options.timeout;
  const char* agent_store = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  const bool torchrun_serves = agent_store != nullptr && std::string(agent_store) == "True";
  auto store = create_tcp_store(world.master_addr, world.master_port, world.rank,
                                world.world_size, init_timeout,
                                torchrun_serves ? std::optional<bool>(false) : std::nullopt);
  // Join barrier on the store, bounded by the init timeout: once every rank is here, forming
  // the groups is quick, so their (training) timeout can be shorter than rendezvous may take.
  try {
    store->set("titan/joined/" + std::to_string(world.rank), std::vector<uint8_t>{1});
    std::vector<std::string> keys;
    for (int r = 0; r < world.world_size; ++r) keys.push_back("titan/joined/" + std::to_string(r));
    store->wait(keys, init_timeout);
  } catch (const std::exception& e) {
    std::ostringstream os;
    os << "[rank " << world.rank << "] not every one of the " << world.world_size
       << " ranks joined at " << world.master_addr << ":" << world.master_port << " within "
       << init_timeout.count() << " ms (comm.init_timeout_seconds): " << error_text(e);
    throw CommError(os.str());
  }
  return std::make_unique<Comm>(store, world.rank, world.world_size, "world", options);
}

}  // namespace titan::parallel::comm
