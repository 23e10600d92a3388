// parallel/comm/process_group.h — c10d stores + Gloo process groups behind one small wrapper, Comm,
// through which every collective of titan goes (STYLE: "all collectives through one wrapper").
//
// Each Comm call records a sequence number, op, bytes and group name; a failure or timeout is
// rethrown as CommError naming the rank, the group, the collective and its sequence number.
// Every collective is also recorded in the flight recorder (parallel/comm/comm_trace.h), which a
// failure or timeout writes to its file (named in the CommError) before throwing.
//
// Note [Asynchronous collectives]: every collective is issued by an `*_async` call that returns
// a CommWork handle; the blocking calls are `*_async(...).wait()`. Between the two the tensors
// belong to the collective: the caller neither reads the output nor writes the input. On Gloo
// (CPU) the collective runs on the process group's worker threads; on NCCL (CUDA) on NCCL's own
// streams, and wait() makes the current stream wait on its event, never the device. wait() does
// the timing and the error capture. Time is counted twice: `total_seconds` from issue to the end
// of wait() (communication in flight, overlapped or not) and `exposed_seconds` inside wait()
// only (the compute thread blocked on communication), which is what overlap reduces.
// Sub-groups (TP, FSDP, ...) are Comms of their own over a PrefixStore of the job's store.
//
// Gloo's headers do not ship with the torch wheel; Debian's libgloo-dev stands in for them.
// See Note [Gloo headers from Debian] in process_group.cpp for what that allows and forbids.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Store.hpp>  // callers hold the store (intrusive_ptr)
#include <torch/csrc/distributed/c10d/Work.hpp>   // CommWork holds a Work

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>


namespace c10d {
class Backend;  // ProcessGroupGloo stays out of this header: See Note [Gloo headers from Debian]
}  // namespace c10d

namespace titan::parallel::comm {

// A collective (or group creation) failed or timed out; the message carries the rank, group,
// collective, sequence number and tensor.
class CommError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class ReduceOp { kSum, kMax };

const char* reduce_op_name(ReduceOp op);  // "sum", "max"

struct CollectiveRecord {
  uint64_t seq = 0;    // 1, 2, ... per Comm, in issue order (identical on every member)
  std::string op;      // "all_reduce(sum)", "all_gather_into_tensor", ...
  int64_t bytes = 0;   // bytes of this rank's input tensor
  std::string group;   // Comm name
};

class Comm;

// What an error says of a collective's tensor: dtype, shape, device and layout, taken as values
// when the collective is issued and put in words only when it fails (no formatting per collective).
struct TensorSummary {
  TensorSummary() = default;
  explicit TensorSummary(const at::Tensor& t);
  std::string describe() const;  // "Float [16] on cpu", "BFloat16 [4, 8] on cpu (non-contiguous)"

  bool defined = false;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  c10::SmallVector<int64_t, 5> sizes;
  c10::Device device{c10::kCPU};
  bool contiguous = true;
};

// A collective in flight (See Note [Asynchronous collectives]). Move-only; an empty handle (or
// one already waited for) waits for nothing. A handle dropped without wait() waits in its
// destructor (errors then are logged to stderr, not thrown), so no collective outlives its
// buffers.
class CommWork {
 public:
  CommWork() = default;
  CommWork(CommWork&& other) noexcept;
  CommWork& operator=(CommWork&& other) noexcept;
  CommWork(const CommWork&) = delete;
  CommWork& operator=(const CommWork&) = delete;
  ~CommWork();

  // Blocks until the collective completed; throws CommError naming rank, group, op, sequence
  // number and bytes when it failed or timed out.
  void wait();
  bool pending() const { return work_.defined(); }
  const CollectiveRecord& record() const { return record_; }

 private:
  friend class Comm;
  Comm* comm_ = nullptr;
  c10::intrusive_ptr<c10d::Work> work_;
  CollectiveRecord record_;
  TensorSummary tensor_;  // described only in an error message
  std::chrono::steady_clock::time_point start_;
  uint64_t trace_id_ = 0;  // its entry in comm_trace() (0: not recorded)
  bool p2p_ = false;       // a send or receive (See Note [Point-to-point]), not a collective
};

struct CommOptions {
  // Gloo's per-operation timeout, and the store's timeout while the group is being formed.
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};
  // The address this rank's Gloo device binds and advertises. 127.0.0.1 is right for one
  // node. Empty: Gloo's default device (this host's resolved hostname, loopback as fallback).
  std::string device_hostname = "127.0.0.1";
  // A network interface name (e.g. "eth0"); when set it takes precedence over device_hostname.
  std::string device_interface;
  // init_process_group only: how long to wait for every rank to reach the store and join
  // (0 = `timeout`). Lets rendezvous wait for slow starters longer than a collective may take.
  std::chrono::milliseconds init_timeout{0};
  // "gloo" (CPU tensors) or, in CUDA builds, "nccl" (CUDA tensors); "none": no transport,
  // for the start-up dry run (collectives fail; the store may be null).
  std::string backend = "gloo";
  // A slower network for overlap tests and benchmarks (comm.debug_link_*): the transport is
  // wrapped in a simulated link when either is set (See Note [Simulated link] in
  // simulated_link.h). 0 and 0 = off: the Comm talks to its transport directly.
  double debug_link_latency_ms = 0;
  double debug_link_bytes_per_second = 0;
};

// The job's key-value store: rank 0 serves it on `port` (0: a free port, read it back with
// store_port()), every other rank connects to host:port. Every rank holds its own connection
// (threads standing in for ranks each create their own client).
// `serve` overrides "rank 0 serves": torchrun's agent already serves the store at
// MASTER_ADDR:MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True), so there every rank is a client.
c10::intrusive_ptr<c10d::Store> create_tcp_store(const std::string& host, int port, int rank,
                                                 int world_size,
                                                 std::chrono::milliseconds timeout,
                                                 std::optional<bool> serve = std::nullopt);

// The port a store from create_tcp_store listens on / connects to.
int store_port(const c10::intrusive_ptr<c10d::Store>& store);

class Comm {
 public:
  // Forms the Gloo group `name` of `size` ranks over `store` (keys under "<name>/"); every
  // member calls this with the same name and size. Blocks until all have joined (or timeout).
  // `global_ranks[i]` is the job-wide rank of group rank i (messages only; default identity).
  Comm(c10::intrusive_ptr<c10d::Store> store, int rank, int size, std::string name,
       CommOptions options = {}, std::vector<int> global_ranks = {});
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  // A sub-group of this Comm's ranks (`ranks` are ranks of this Comm, in the sub-group's
  // order). Only members call it, all with the same ranks and a name unique in the job;
  // non-members get nullptr. Group ranks are renumbered 0 .. ranks.size()-1.
  std::unique_ptr<Comm> new_group(const std::vector<int>& ranks, const std::string& name) const;

  // In place on every rank: tensor = op over ranks of tensor.
  CommWork all_reduce_async(const at::Tensor& tensor, ReduceOp op = ReduceOp::kSum);
  // output [size * N] = concatenation of every rank's input [N] in rank order (flat view).
  CommWork all_gather_into_tensor_async(const at::Tensor& output, const at::Tensor& input);
  // output [N] = sum over ranks of input[rank * N : (rank + 1) * N]. SUM only: Gloo rejects
  // AVG, so averaging callers divide afterwards. (Gloo emulates this with a full all-reduce.)
  CommWork reduce_scatter_tensor_async(const at::Tensor& output, const at::Tensor& input);
  // output = the rank-th slice of every rank's input, in rank order: input and output [size * N]
  // (flat views, equal slices), slice j of the input goes to rank j, slice j of the output came
  // from rank j (c10d's all_to_all_single with equal splits).
  CommWork all_to_all_single_async(const at::Tensor& output, const at::Tensor& input);
  // The same exchange with rows of any count (c10d's all_to_all_single with split sizes):
  // input_splits[j] rows (dim 0) of `input` go to rank j, output_splits[j] rows of `output` come
  // from rank j, in rank order; rows have the same shape on every rank. Every rank's
  // input_splits[j] must be rank j's output_splits[me] (the callers exchange the counts first).
  CommWork all_to_all_async(const at::Tensor& output, const at::Tensor& input, std::vector<int64_t> output_splits,
                            std::vector<int64_t> input_splits);
  // In place: every rank's tensor = root's tensor (root is a group rank).
  CommWork broadcast_async(const at::Tensor& tensor, int root);
  CommWork barrier_async();
  // Note [Point-to-point]: one tensor to / from one peer (a group rank), matched by `tag`
  // (unique among this pair's transfers in flight), so the two sides may post in any order.
  // These are not collectives: only two members take part, so they have a sequence of their
  // own (p2p_sequence_number) and leave the collectives' numbering, which every member shares,
  // alone. Gloo completes a send once the peer has posted the matching receive; the peer's
  // death or the timeout surfaces in wait() like a collective's.
  CommWork send_async(const at::Tensor& tensor, int peer, int tag);
  CommWork recv_async(const at::Tensor& tensor, int peer, int tag);

  // The blocking forms: issue, then wait.
  void all_reduce(const at::Tensor& tensor, ReduceOp op = ReduceOp::kSum) { all_reduce_async(tensor, op).wait(); }
  void all_gather_into_tensor(const at::Tensor& output, const at::Tensor& input) {
    all_gather_into_tensor_async(output, input).wait();
  }
  void reduce_scatter_tensor(const at::Tensor& output, const at::Tensor& input) {
    reduce_scatter_tensor_async(output, input).wait();
  }
  void broadcast(const at::Tensor& tensor, int root) { broadcast_async(tensor, root).wait(); }
  void barrier() { barrier_async().wait(); }

  int rank() const { return rank_; }  // rank in this group
  int size() const { return size_; }
  int global_rank() const { return global_ranks_[static_cast<size_t>(rank_)]; }
  const std::vector<int>& global_ranks() const { return global_ranks_; }
  const std::string& name() const { return name_; }
  const CommOptions& options() const { return options_; }
  uint64_t sequence_number() const { return last_.seq; }  // collectives issued so far
  uint64_t p2p_sequence_number() const { return p2p_seq_; }  // sends and receives issued so far
  const CollectiveRecord& last_collective() const { return last_; }
  int64_t total_bytes() const { return total_bytes_; }
  // Seconds of this Comm's collectives from issue to the end of their wait(), summed; and of
  // those, the seconds the caller spent blocked inside wait() (See Note [Asynchronous
  // collectives]).
  double total_seconds() const { return total_seconds_; }
  double exposed_seconds() const { return exposed_seconds_; }

 private:
  friend class CommWork;
  template <typename Launch>
  CommWork issue(std::string op, const at::Tensor& tensor, Launch&& launch,
                 bool p2p = false);
  CommWork point_to_point(const at::Tensor& tensor, int peer, int tag, bool send);
  [[noreturn]] void fail(const std::string& what, const std::string& reason) const;
  std::string where() const;
  std::string describe_tensor(const at::Tensor& t) const;

  c10::intrusive_ptr<c10d::Store> store_;  // unprefixed: sub-groups add their own prefix
  c10::intrusive_ptr<c10d::Backend> backend_;
  int rank_;
  int size_;
  std::string name_;
  CommOptions options_;
  std::vector<int> global_ranks_;
  CollectiveRecord last_;
  uint64_t p2p_seq_ = 0;
  int64_t total_bytes_ = 0;
  double total_seconds_ = 0;
  double exposed_seconds_ = 0;
};

// Where the job's ranks meet: this rank, how many there are, whether they share one node, and
// the store's address. The trainer fills it from the launcher's environment (titan-run,
// torchrun or Slurm), which this layer does not read.
struct Rendezvous {
  int rank = 0;
  int world_size = 1;
  bool single_node = true;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
};

// Ranks running as threads of one process (tests/rank_threads.h) call this once before forming
// their groups: from then on every collective is issued under one process-wide lock (See Note
// [Issuing under one lock] in process_group.cpp). A training process never does.
void issue_under_process_lock();

// The job-wide Comm "world": rank 0 serves the TCPStore on master_addr:master_port, Gloo binds
// 127.0.0.1 on one node; on several nodes it uses GLOO_SOCKET_IFNAME when set, else this host's
// default device.
std::unique_ptr<Comm> init_process_group(const Rendezvous& world, CommOptions options = {});

}  // namespace titan::parallel::comm
