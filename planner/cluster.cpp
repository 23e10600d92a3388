// planner/cluster.cpp — see cluster.h.
#include "planner/cluster.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/sum.h>
#include <ATen/Parallel.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <future>
#include <numeric>
#include <sstream>
#include <thread>
#include <utility>

#include "model/activation_checkpoint_ops.h"
#include "model/family.h"
#include "model/flavors.h"
#include "model/linear.h"
#include "parallel/comm/process_group.h"
#include "trainer/config/parallel_options.h"

namespace titan::planner {
namespace {

using Clock = std::chrono::steady_clock;
constexpr double kT = 1e12, kG = 1e9;

// Data sheets (NVIDIA, dense figures: the sparse ones halved), SXM parts, one GPU: bf16 and float8
// tensor-core peaks, HBM capacity and bandwidth, NVLink per direction (half the bidirectional
// figure), and one 400 Gb/s NIC per GPU (ConnectX-7; A100 systems: 200 Gb/s HDR). Efficiencies,
// one per kind: GEMMs 0.78 (titan-bench-matmul's bf16 8192^3 on an H200, 2026-11-27: 774 of 989
// TFLOP/s; the same Hopper core on H100; Blackwell and Ampere assumed alike), links 0.8 (NCCL's
// bus bandwidth on NVLink and InfiniBand for large messages), memory-bound work 0.22: the
// elementwise, reduction, copy and loss kernels of titan's 8B_4layers bf16 step on an H200 took
// 44 ms (scripts/gpu_profile.sh + trace_summary.py, 2026-11-27, after the one-pass AdamW) where
// the traffic model of planner/predict.cpp counts 47 GB, i.e. 1.07 TB/s of the 4.8 (the model
// counts only the unavoidable traffic; launch gaps, float32 loss math and strided copies are in
// this factor); the optimizer 0.82: the same step's AdamW kernel moved 1.92 B x 28 bytes in
// 13.6 ms (3.95 TB/s).
DeviceSpec table_device(const std::string& kind) {
  DeviceSpec d;
  d.gemm_efficiency = 0.78;
  d.link_efficiency = 0.8;
  d.hbm_efficiency = 0.22;
  d.optimizer_efficiency = 0.82;
  d.message_latency_s = 10e-6;
  if (kind == "h100") {
    d.name = "H100 SXM";
    d.peak_bf16 = 989.4 * kT, d.peak_fp8 = 1978.9 * kT, d.memory_bytes = 80e9, d.hbm_bytes_per_s = 3.35e12;
    d.intra_node_bytes_per_s = 450 * kG, d.inter_node_bytes_per_s = 50 * kG;
  } else if (kind == "h200") {
    d.name = "H200 SXM";
    d.peak_bf16 = 989.4 * kT, d.peak_fp8 = 1978.9 * kT, d.memory_bytes = 141e9, d.hbm_bytes_per_s = 4.8e12;
    d.intra_node_bytes_per_s = 450 * kG, d.inter_node_bytes_per_s = 50 * kG;
  } else if (kind == "b200") {
    d.name = "B200";
    d.peak_bf16 = 2250 * kT, d.peak_fp8 = 4500 * kT, d.memory_bytes = 180e9, d.hbm_bytes_per_s = 7.7e12;
    d.intra_node_bytes_per_s = 900 * kG, d.inter_node_bytes_per_s = 50 * kG;
  } else if (kind == "a100") {
    d.name = "A100 SXM 80GB";
    d.peak_bf16 = 312 * kT, d.peak_fp8 = 0, d.memory_bytes = 80e9, d.hbm_bytes_per_s = 2.039e12;
    d.intra_node_bytes_per_s = 300 * kG, d.inter_node_bytes_per_s = 25 * kG;
  }
  return d;
}

// The median of `repeats` timed calls after a warm-up: one call slowed by the machine's other
// work (or the first calls' clock ramp) must not decide a rate every prediction scales with (the
// mean of 4 GEMMs swung by 50% between planner runs here).
template <typename F>
double seconds_of(F&& f, int repeats) {
  f();  // warm-up
  std::vector<double> each;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = Clock::now();
    f();
    each.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::nth_element(each.begin(), each.begin() + repeats / 2, each.end());
  return each[static_cast<size_t>(repeats / 2)];
}

// FLOP/s of `threads` threads side by side, each multiplying a x b on one intra-op thread (the
// caller sets it) for about `window_s` of wall clock after a common start: each thread's calls
// that ended inside the window over the time its last one ended, summed over the threads.
double shared_gemm_rate(const at::Tensor& a, const at::Tensor& b, int64_t threads, double window_s) {
  const double flops = 2.0 * static_cast<double>(a.size(0)) * a.size(1) * b.size(1);
  const auto window = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(window_s));
  std::atomic<int64_t> ready{0};
  std::atomic<bool> go{false};
  Clock::time_point start;
  std::vector<double> rate(static_cast<size_t>(threads), 0.0);
  std::vector<std::thread> pool;
  for (int64_t r = 0; r < threads; ++r)
    pool.emplace_back([&, r] {
      const at::Tensor x = a.clone(), y = b.clone();
      model::times_transposed(x, y);  // warm-up: the packed buffers, the pages
      ++ready;
      while (!go.load()) std::this_thread::yield();
      int64_t calls = 0;
      Clock::time_point last = start;
      while (true) {
        model::times_transposed(x, y);  // the linears' product (training.cpu_float32_gemm's library)
        const Clock::time_point now = Clock::now();
        if (now - start >= window) break;
        ++calls;
        last = now;
      }
      const double s = std::chrono::duration<double>(last - start).count();
      rate[static_cast<size_t>(r)] = s > 0 ? flops * static_cast<double>(calls) / s : 0;
    });
  while (ready.load() < threads) std::this_thread::yield();
  start = Clock::now();
  go = true;
  for (std::thread& t : pool) t.join();
  return std::accumulate(rate.begin(), rate.end(), 0.0);
}

// Bytes per second through a TCP connection on 127.0.0.1 (Gloo's transport between ranks of one
// host), one direction.
double loopback_bytes_per_s() {
  const int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (listener < 0 || bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      listen(listener, 1) != 0 || getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (listener >= 0) close(listener);
    return 0;
  }
  constexpr size_t kBytes = 256u << 20, kChunk = 1u << 20;
  std::thread sender([addr] {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0) {
      std::vector<char> chunk(kChunk, 1);
      for (size_t sent = 0; sent < kBytes;) {
        const ssize_t n = send(fd, chunk.data(), chunk.size(), MSG_NOSIGNAL);
        if (n <= 0) break;
        sent += static_cast<size_t>(n);
      }
    }
    close(fd);
  });
  const int conn = accept(listener, nullptr, nullptr);
  std::vector<char> buf(kChunk);
  size_t got = 0;
  const auto t0 = Clock::now();
  while (conn >= 0 && got < kBytes) {
    const ssize_t n = recv(conn, buf.data(), buf.size(), 0);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  sender.join();
  if (conn >= 0) close(conn);
  close(listener);
  return s > 0 ? static_cast<double>(got) / s : 0;
}

// Gloo's own collectives among `ranks` threads of this process (ranks as threads: the copies,
// the reductions and the TCP transport on this machine's cores, as titan's ranks run them),
// while `busy` more threads keep cores busy (the world's other ranks computing), each timed on
// the slowest rank: the fixed cost of one ring step, from all-gather + reduce-scatter pairs of a
// small message, for t(bytes) = (ranks - 1) x (step + bytes / ranks / rate); and each
// collective's bus bandwidth from a large message on its own (NCCL's definition: (g - 1) / g of
// the bytes over the time for an all-gather or a reduce-scatter, 2 (g - 1) / g for an
// all-reduce). On GPUs the three are alike; Gloo's differ: its reduce-scatter is an all-reduce
// underneath, so it moves twice an all-gather's bytes (4 ranks here: all-gather 0.53 GB/s bus
// bandwidth, reduce-scatter 0.51x that, all-reduce 1.72x).
// Returns the group's figures (bytes_per_s: the all-gather's, which a point-to-point transfer
// and an all-to-all get too); all zero if the group could not form.
DeviceSpec::GroupLink gloo_probe(int ranks, int busy, double cores) {
  const bool shared_cores = ranks + busy > cores;
  std::atomic<bool> stop{false};
  std::vector<std::thread> spinners;
  for (int i = 0; i < busy; ++i)
    spinners.emplace_back([&stop] {
      const at::Tensor x = at::randn({384, 384}), y = at::randn({384, 384});
      while (!stop.load(std::memory_order_relaxed)) at::mm(x, y);  // a rank's GEMMs, one thread each
    });
  struct Join {  // the spinners stop however the probe ends
    std::atomic<bool>& stop;
    std::vector<std::thread>& threads;
    ~Join() {
      stop = true;
      for (std::thread& t : threads) t.join();
    }
  } join{stop, spinners};
  using parallel::comm::Comm;
  // Bytes of the full (gathered) tensor: the fixed cost's pair, then the two bandwidths'.
  constexpr int64_t kSmall = 16 << 10, kMedium = static_cast<int64_t>(kProbeMessageBytes),
                    kLarge = static_cast<int64_t>(kProbeLargeMessageBytes);
  constexpr int kRepeats = 15, kLargeRepeats = 3;  // the large ones take 0.1-1 s each here
  // Per rank: the small pair, then the all-gather, reduce-scatter and all-reduce of the medium
  // message, then of the large one.
  std::vector<std::array<double, 7>> seconds(static_cast<size_t>(ranks));
  std::promise<int> port_promise;
  std::shared_future<int> port = port_promise.get_future().share();
  std::atomic<bool> failed{false};
  parallel::comm::issue_under_process_lock();  // ranks as threads of one process
  std::vector<std::thread> threads;
  for (int rank = 0; rank < ranks; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        const auto timeout = std::chrono::milliseconds(60000);
        c10::intrusive_ptr<c10d::Store> store;
        if (rank == 0) {
          try {
            store = parallel::comm::create_tcp_store("127.0.0.1", 0, 0, ranks, timeout);
            port_promise.set_value(parallel::comm::store_port(store));
          } catch (...) {
            port_promise.set_exception(std::current_exception());
            throw;
          }
        } else {
          store = parallel::comm::create_tcp_store("127.0.0.1", port.get(), rank, ranks, timeout);
        }
        Comm comm(store, rank, ranks, "plan_probe");
        const auto full_of = [&](int64_t bytes) { return bytes / 4 / ranks * ranks; };
        // The small message's fixed cost: where every thread has a core of its own, the fastest
        // pair (a wake-up delayed by whatever else the machine runs is noise, not the cost, and
        // swung the median from 230 to 1,900 us between runs); where the threads outnumber the
        // cores (4 ranks on 2), the mean of more pairs: there a woken rank waits for a core as a
        // rule (Linux's scheduler lets the running thread finish its slice), that wait is the
        // cost, and it spreads from 0.2 to 4.5 ms (the median jumps between the two ends).
        {
          const int64_t full = full_of(kSmall), part = full / ranks;
          const at::Tensor gathered = at::empty({full}, at::kFloat), mine = at::ones({part}, at::kFloat);
          const at::Tensor summed = at::ones({full}, at::kFloat), out = at::empty({part}, at::kFloat);
          auto pair = [&] {
            comm.all_gather_into_tensor_async(gathered, mine).wait();
            comm.reduce_scatter_tensor_async(out, summed).wait();
          };
          pair();  // warm-up
          const int repeats = shared_cores ? 4 * kRepeats : kRepeats;
          std::vector<double> pairs;
          for (int i = 0; i < repeats; ++i) {
            const auto t0 = Clock::now();
            pair();
            pairs.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / 2.0);
          }
          seconds[static_cast<size_t>(rank)][0] = shared_cores ? std::accumulate(pairs.begin(), pairs.end(), 0.0) / repeats
                                                               : *std::min_element(pairs.begin(), pairs.end());
        }
        auto& mine_s = seconds[static_cast<size_t>(rank)];
        // One message size: its all-gather, reduce-scatter and all-reduce into mine_s[first..first+2].
        auto time_collectives = [&](int64_t bytes, size_t first, int repeats) {
          const int64_t full = full_of(bytes), part = full / ranks;
          const at::Tensor gathered = at::empty({full}, at::kFloat), mine = at::ones({part}, at::kFloat);
          const at::Tensor summed = at::ones({full}, at::kFloat), out = at::empty({part}, at::kFloat);
          mine_s[first] = seconds_of([&] { comm.all_gather_into_tensor_async(gathered, mine).wait(); }, repeats);
          mine_s[first + 1] = seconds_of([&] { comm.reduce_scatter_tensor_async(out, summed).wait(); }, repeats);
          mine_s[first + 2] = seconds_of([&] { comm.all_reduce_async(summed).wait(); }, repeats);
        };
        time_collectives(kMedium, 1, kRepeats);
        time_collectives(kLarge, 4, kLargeRepeats);
      } catch (const std::exception&) {
        failed = true;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  if (failed) return {};
  auto slowest = [&](size_t what) {
    double s = 0;
    for (const auto& r : seconds) s = std::max(s, r[what]);
    return s;
  };
  const double steps = ranks - 1.0;
  DeviceSpec::GroupLink g;
  g.message_latency_s = slowest(0) / steps;
  auto rates = [&](double bytes, size_t first, double& all_gather, DeviceSpec::BusRatios& ratios) {
    all_gather = steps / ranks * bytes / slowest(first);
    ratios.reduce_scatter = steps / ranks * bytes / slowest(first + 1) / all_gather;
    ratios.all_reduce = 2.0 * steps / ranks * bytes / slowest(first + 2) / all_gather;
  };
  rates(static_cast<double>(kMedium), 1, g.bytes_per_s, g.ratios);
  rates(static_cast<double>(kLarge), 4, g.large_bytes_per_s, g.large_ratios);
  return g;
}

// Attention's rate over the GEMMs', both on one thread: the model's own causal attention
// (model::attention_op: LibTorch's flash kernel in float32, titan's kernel in bf16) forward and
// backward at its head_dim and seq_len, against a x b. On this machine, the debug model's float32
// attention at head_dim 16 runs at a third to a half of the GEMMs' rate (this probe: 0.34-0.40;
// a one-process step's profile: 214 ms where the GEMM rate would give 102).
// At `length` positions (the caller caps it: an 8B model's whole attention at seq 8192 would take
// the probe minutes); the heads are capped (the rate per head does not depend on the count): at
// most 2 key/value heads with their query heads, one above 1,024 positions. The shapes are the family's declaration's
// (Family::attention_activations at TP 1): heads, the q/k head from q's width, the v head from
// the output's, the key/value heads from k + v's width (grouped-query: n_kv_heads; latent
// attention: every head).
struct AttentionRate {
  double forward_efficiency;  // the forward's FLOP rate over the GEMMs'
  double backward_ratio;      // the backward's time over the forward's
};
AttentionRate attention_over_gemm_rate(const trainer::config::JobConfig& cfg, at::ScalarType dtype, const at::Tensor& a,
                                       const at::Tensor& b, int64_t length) {
  const model::ModelArgs args = model::model_flavor(cfg.model.name, cfg.model.flavor);
  model::AttentionActivationsQuery whole;
  whole.compute_bytes = dtype == at::kFloat ? 4 : 2;
  whole.seq_len = cfg.training.seq_len;
  const model::AttentionActivations att =
      model::family(args.family).attention_activations(args, args.n_layers - 1, whole);
  const int64_t all_heads = static_cast<int64_t>(att.heads);
  const int64_t qk_head = static_cast<int64_t>(att.q_width) / all_heads, v_head = static_cast<int64_t>(att.output) / all_heads;
  const int64_t kv_heads = static_cast<int64_t>(att.kv_width) / (qk_head + v_head);
  const int64_t kv = std::min<int64_t>(kv_heads, length > 1024 ? 1 : 2), heads = kv * (all_heads / kv_heads);
  const int64_t seq = length;
  auto make = [&](int64_t h, int64_t d) { return at::randn({1, h, seq, d}).to(dtype).requires_grad_(true); };
  const at::Tensor q = make(heads, qk_head), k = make(kv, qk_head), v = make(kv, v_head);
  const int pool_threads = at::get_num_threads();
  at::set_num_threads(1);
  const int reps = length > 1024 ? 3 : 5;
  // The forward as training runs it: recording its graph and keeping what the backward reads.
  const double forward_s = seconds_of([&] { model::attention_op(q, k, v); }, reps);
  const double both_s = seconds_of([&] {
    const at::Tensor out = model::attention_op(q, k, v);
    out.backward(at::ones_like(out));
  }, reps);
  const double gemm_s = seconds_of([&] { model::times_transposed(a, b); }, 5);
  at::set_num_threads(pool_threads);
  // The score and value products of the forward (4 x heads x head_dim x seq^2 where the heads are
  // alike: torchtitan's count, the whole square).
  const double forward_flops = 2.0 * static_cast<double>(heads * (qk_head + v_head)) * seq * seq;
  const double gemm_flops = 2.0 * static_cast<double>(a.size(0)) * a.size(1) * b.size(1);
  return {(forward_flops / forward_s) / (gemm_flops / gemm_s), std::max(0.0, both_s - forward_s) / forward_s};
}

// This machine, shared by `processes` ranks: each gets 1/processes of the cores' GEMM rate and
// memory bandwidth (titan's ranks on one host split the cores between them).
DeviceSpec cpu_device(const trainer::config::JobConfig& cfg, int64_t processes) {
  DeviceSpec d;
  d.host_cores = std::max(1u, std::thread::hardware_concurrency());
  d.name = "cpu (this machine, measured; " + std::to_string(static_cast<int>(d.host_cores)) + " cores shared by " +
           std::to_string(processes) + " ranks)";
  const at::ScalarType dtype = trainer::config::dtype_from_name(cfg.training.mixed_precision_param,
                                                                "training.mixed_precision_param");
  // The GEMM probes multiply through the library the job's linears will use (Note [float32
  // GEMMs on the CPU] in model/linear.h), restored when the probes end.
  const model::CpuFloat32GemmScope gemm_library(trainer::config::cpu_float32_gemm_of(cfg));
  d.peak_label = dtype == at::kFloat ? "float32 (" + cfg.training.cpu_float32_gemm + ")" : "bf16";
  constexpr int64_t n = 768;
  const at::Tensor a = at::randn({n, n}).to(dtype), b = at::randn({n, n}).to(dtype);
  // A rank's GEMM rate with every rank computing at once: `processes` threads, one per rank,
  // each calling one-thread GEMMs for the same wall-clock window; the GEMMs all of them finished,
  // over the window, shared by the ranks (times the cores each rank has beyond one). A count over
  // a window is what the ranks get from the machine, time slicing and shared caches included,
  // and it is steady where a per-call time is not: on 4 threads over 2 cores the slowest
  // thread's median call swung from 0.029 to 0.050 TFLOP/s between planner runs here (how a
  // call's time falls across the scheduler's slices), the window's count from 0.035 to 0.043,
  // about what this machine's own float32 GEMM throughput moves from one second to the next.
  const int pool_threads = at::get_num_threads();
  at::set_num_threads(1);
  const double gemm_rate = shared_gemm_rate(a, b, processes, /*window_s=*/1.0);
  at::set_num_threads(pool_threads);
  d.peak_bf16 = gemm_rate / static_cast<double>(processes) * std::max(1.0, d.host_cores / static_cast<double>(processes));
  d.peak_fp8 = 0;  // float8 on the CPU is an emulation: never faster
  const at::Tensor big = at::empty({64 << 20}, at::kFloat), dst = at::empty({64 << 20}, at::kFloat);
  const double copy_s = seconds_of([&] { dst.copy_(big); }, 7);
  d.hbm_bytes_per_s = 2.0 * static_cast<double>(big.nbytes()) / copy_s / static_cast<double>(processes);
  d.memory_bytes = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE) / static_cast<double>(processes);
  // Gloo's collectives among `processes` ranks on this machine, measured; a single rank has no
  // collectives (then, or if the probe cannot form its group, the raw loopback bandwidth only
  // fills the table).
  const DeviceSpec::GroupLink world =
      processes > 1 ? gloo_probe(static_cast<int>(processes), 0, d.host_cores) : DeviceSpec::GroupLink{};
  // Groups smaller than the world (TP, CP or FSDP within a larger world, a pipeline's
  // transfers): their collectives run while the other ranks compute, which on shared cores
  // delays every hand-off (a woken rank waits for a core). Measured so, for each group size.
  if (world.bytes_per_s > 0) d.group_links[processes] = world;
  for (int64_t g = 2; g < processes; ++g) {
    if (processes % g != 0) continue;
    at::set_num_threads(1);  // the computing ranks' GEMMs each on one thread
    const DeviceSpec::GroupLink group = gloo_probe(static_cast<int>(g), static_cast<int>(processes - g), d.host_cores);
    at::set_num_threads(pool_threads);
    if (group.bytes_per_s > 0) d.group_links[g] = group;
  }
  const bool measured = world.bytes_per_s > 0;
  d.intra_node_bytes_per_s = d.inter_node_bytes_per_s = measured ? world.bytes_per_s : loopback_bytes_per_s();
  d.message_latency_s = world.message_latency_s;
  if (measured) d.bus_ratios = world.ratios;
  d.comm_shares_compute = true;
  // Attention at each query length a layout gives its kernel: seq_len / cp for every cp that
  // divides the ranks, measured up to 2,048 positions (titan-bench-attention --seq-sweep: LibTorch's
  // float32 flash kernel runs 1.9x faster per FLOP at 2,048 than at 512, titan's bf16 kernel
  // alike from 512 on), and the job's own length the scalar.
  for (int64_t cp = processes; cp >= 1; --cp) {
    if (processes % cp != 0 || cfg.training.seq_len % cp != 0) continue;
    const int64_t length = std::min<int64_t>(cfg.training.seq_len / cp, 2048);
    if (length < 64 || (!d.attention_efficiency_by_length.empty() &&
                        d.attention_efficiency_by_length.back().first >= static_cast<double>(length)))
      continue;
    const AttentionRate rate = attention_over_gemm_rate(cfg, dtype, a, b, length);
    d.attention_efficiency_by_length.emplace_back(static_cast<double>(length), rate.forward_efficiency);
    d.attention_backward_ratio = rate.backward_ratio;  // the longest length's: the job's own
  }
  d.attention_efficiency = d.attention_efficiency_at(static_cast<double>(cfg.training.seq_len));
  // A tiny step through autograd, as titan's layers dispatch theirs: a matmul of 2 x 2 tensors,
  // a sum, and the backward (mm, sum, the engine's ones, SumBackward's expand, MmBackward's two
  // transposes and two matmuls, two AccumulateGrads: 10 operators), on one thread as each rank.
  // The median of 51 runs of 100 steps (~0.2 s): with 9 (~40 ms in all) one planner run in six
  // read 8.3 us where the others read 4.2-5.1, a moment's slowdown of the machine taking most of
  // the probe, and the debug model's predictions moved by half with it.
  const at::Tensor x = at::ones({2, 2}).requires_grad_(true), wt = at::ones({2, 2}).requires_grad_(true);
  at::set_num_threads(1);
  d.op_dispatch_s = seconds_of([&] {
                      for (int i = 0; i < 100; ++i) {
                        x.mutable_grad().reset();
                        wt.mutable_grad().reset();
                        at::mm(x, wt).sum().backward();
                      }
                    }, 51) / 1000.0;
  at::set_num_threads(pool_threads);
  // One thread's dispatch is CPU work like the rest: where the ranks outnumber the cores, each
  // gets cores / ranks of one while all compute (the rates above are shared the same way).
  d.op_dispatch_s *= std::max(1.0, static_cast<double>(processes) / d.host_cores);
  // The probes are the machine's own rates: nothing left to discount.
  d.gemm_efficiency = d.link_efficiency = d.hbm_efficiency = d.optimizer_efficiency = 1.0;
  return d;
}

// The reduce-scatter's and the all-reduce's bus bandwidth against the all-gather's, where they
// differ (device cpu: Gloo).
std::string bus_ratio_text(const DeviceSpec::BusRatios& r) {
  if (r.reduce_scatter == 1.0 && r.all_reduce == 1.0) return "";
  std::ostringstream os;
  os.precision(3);
  os << " (reduce-scatter x" << r.reduce_scatter << ", all-reduce x" << r.all_reduce << ")";
  return os.str();
}

}  // namespace

double DeviceSpec::GroupLink::bus_bytes_per_s(Collective kind, double message_bytes) const {
  const double small = bytes_per_s * ratios.of(kind);
  if (large_bytes_per_s <= 0 || message_bytes <= kProbeMessageBytes) return small;
  const double large = large_bytes_per_s * large_ratios.of(kind);
  if (message_bytes >= kProbeLargeMessageBytes) return large;
  const double t = std::log(message_bytes / kProbeMessageBytes) / std::log(kProbeLargeMessageBytes / kProbeMessageBytes);
  return std::exp((1.0 - t) * std::log(small) + t * std::log(large));
}

const std::vector<std::string>& device_kinds() {
  static const std::vector<std::string> kinds = {"h100", "h200", "b200", "a100"};
  return kinds;
}

Cluster cluster_from_config(const trainer::config::JobConfig& cfg) {
  const auto& p = cfg.plan;
  Cluster c;
  c.nodes = p.nodes;
  c.gpus_per_node = p.gpus_per_node;
  c.device = p.device == "cpu" ? cpu_device(cfg, c.world()) : table_device(p.device);
  DeviceSpec& d = c.device;
  auto take = [](double key, double scale, double& into) {
    if (key > 0) into = key * scale;
  };
  take(p.peak_tflops_bf16, kT, d.peak_bf16);
  take(p.peak_tflops_fp8, kT, d.peak_fp8);
  take(p.memory_gib, kGiB, d.memory_bytes);
  take(p.hbm_tbps, 1e12, d.hbm_bytes_per_s);
  take(p.intra_node_gbps, kG, d.intra_node_bytes_per_s);
  take(p.inter_node_gbps, kG, d.inter_node_bytes_per_s);
  take(p.gemm_efficiency, 1, d.gemm_efficiency);
  take(p.link_efficiency, 1, d.link_efficiency);
  for (const std::string& precision : p.precisions)
    if (precision != "bf16" && d.peak_fp8 <= 0 && p.device != "cpu")
      throw trainer::config::ConfigError("plan.precisions '" + precision + "': the " + d.name +
                                         " has no float8 tensor cores (plan.peak_tflops_fp8 sets a rate)");
  return c;
}

double DeviceSpec::attention_efficiency_at(double length) const {
  const auto& t = attention_efficiency_by_length;
  if (t.empty()) return attention_efficiency;
  if (length <= t.front().first) return t.front().second;
  if (length >= t.back().first) return t.back().second;
  size_t i = 1;
  while (t[i].first < length) ++i;
  const double x = (std::log(length) - std::log(t[i - 1].first)) / (std::log(t[i].first) - std::log(t[i - 1].first));
  return t[i - 1].second + x * (t[i].second - t[i - 1].second);
}

std::vector<std::string> Cluster::describe() const {
  std::ostringstream os;
  os.precision(4);
  os << nodes << " node" << (nodes == 1 ? "" : "s") << " x " << gpus_per_node << " " << device.name << " = " << world()
     << " GPUs";
  std::vector<std::string> lines = {os.str()};
  os.str("");
  os << "per GPU: " << device.peak_label << " " << device.peak_bf16 / kT << " TFLOP/s";
  if (device.peak_fp8 > 0) os << ", float8 " << device.peak_fp8 / kT << " TFLOP/s";
  os << " (GEMMs at " << device.gemm_efficiency << " of peak";
  if (device.attention_efficiency_by_length.size() > 1) {
    os << ", attention at";
    for (const auto& [length, efficiency] : device.attention_efficiency_by_length)
      os << " " << efficiency << " (" << length << ")";
    os << " of the GEMMs' rate (by query length), backward " << device.attention_backward_ratio << "x forward";
  } else if (device.attention_efficiency != 1.0) {
    os << ", attention at " << device.attention_efficiency << " of the GEMMs' rate";
  }
  os << "), memory " << device.memory_bytes / kGiB << " GiB at "
     << device.hbm_bytes_per_s / 1e12 << " TB/s (" << device.hbm_efficiency << " reached)";
  lines.push_back(os.str());
  os.str("");
  os << "links per GPU and direction: in a node " << device.intra_node_bytes_per_s / kG << " GB/s, between nodes "
     << device.inter_node_bytes_per_s / kG << " GB/s (collectives at " << device.link_efficiency << ")"
     << bus_ratio_text(device.bus_ratios) << ", " << device.message_latency_s * 1e6 << " us per message"
     << (device.comm_shares_compute ? "; transfers share the compute's cores (no overlap)" : "");
  for (const auto& [g, l] : device.group_links) {
    os << (g == world() ? "; all " : "; groups of ") << g << (g == world() ? "" : " with the other ranks computing")
       << ": " << l.bytes_per_s / kG << " GB/s" << bus_ratio_text(l.ratios);
    if (l.large_bytes_per_s > 0)
      os << " (" << kProbeMessageBytes / (1 << 20) << " MiB messages), " << l.large_bytes_per_s / kG << " GB/s"
         << bus_ratio_text(l.large_ratios) << " (" << kProbeLargeMessageBytes / (1 << 20) << " MiB)";
    os << ", " << l.message_latency_s * 1e6 << " us per message";
  }
  if (device.op_dispatch_s > 0) {
    lines.push_back(os.str());
    os.str("");
    os << "host: " << device.op_dispatch_s * 1e6 << " us per operator dispatch";
  }
  lines.push_back(os.str());
  return lines;
}

}  // namespace titan::planner
