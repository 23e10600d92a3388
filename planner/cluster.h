// planner/cluster.h — what the layout planner knows of the machines: one GPU kind's data-sheet
// peaks (or, for device cpu, this machine measured), how many per node, and the two links a
// process group can cross (docs/planner.md says where each number comes from).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "trainer/config/job_config.h"

namespace titan::planner {

constexpr double kGiB = 1073741824.0;  // bytes

enum class Collective { kAllGather, kReduceScatter, kAllReduce };

// The message sizes device cpu's Gloo probe measures (DeviceSpec::GroupLink).
constexpr double kProbeMessageBytes = 4 << 20, kProbeLargeMessageBytes = 64 << 20;

struct DeviceSpec {
  std::string name;               // "H100 SXM", "cpu (this machine, measured)"
  double peak_bf16 = 0;           // FLOP/s, dense
  // What peak_bf16 is the rate of: "bf16" on the GPUs of the table; device cpu measures the job's
  // compute dtype, "float32 (aten)" or "float32 (onednn)" by training.cpu_float32_gemm.
  std::string peak_label = "bf16";
  double peak_fp8 = 0;            // FLOP/s, dense; 0: no float8 tensor cores
  double memory_bytes = 0;
  double hbm_bytes_per_s = 0;
  double intra_node_bytes_per_s = 0;  // per GPU and direction
  double inter_node_bytes_per_s = 0;
  double gemm_efficiency = 0;     // of the peak, large GEMMs and flash attention
  // Attention's FLOP rate (torchtitan's count: 4 x heads x head_dim x seq_len per token forward,
  // the whole square) over the GEMMs': 1 on GPUs, where flash attention runs near the GEMMs'
  // efficiency; device cpu measures it at the model's head_dim and seq_len.
  double attention_efficiency = 1.0;
  // Where measured (device cpu): the efficiency by the attention kernel's query length (the
  // whole sequence, or a CP rank's seq_len / cp), ascending; between the points interpolated in
  // log length, beyond them the nearest point's. Empty: attention_efficiency at every length.
  std::vector<std::pair<double, double>> attention_efficiency_by_length;
  double attention_efficiency_at(double length) const;
  // The attention backward's time over its forward's. A flash kernel recomputes the scores and
  // their softmax from the log-sum-exp and runs five products against the forward's two: 2.5
  // (titan-bench-attention --seq-sweep, LibTorch's and titan's CPU kernels: 2.4-3.2); device cpu
  // measures it at the job's length.
  double attention_backward_ratio = 2.5;
  double link_efficiency = 0;     // of a link, NCCL's bus bandwidth for large messages
  double hbm_efficiency = 0;      // of the memory bandwidth, the step's elementwise kernels
  double optimizer_efficiency = 0;  // of the memory bandwidth, the fused AdamW's streaming
  // One message's fixed cost: a ring collective over g ranks pays (g - 1) of them, a send one.
  double message_latency_s = 0;
  // The bandwidths above are an all-gather's bus bandwidth (NCCL's definition: (g - 1) / g of
  // the bytes over the time), which a point-to-point transfer and an all-to-all get too; the
  // reduce-scatter's and the all-reduce's (2 (g - 1) / g of the bytes) relative to it. 1 on GPUs
  // (NCCL's bus bandwidths are alike); device cpu measures Gloo's, whose reduce-scatter is an
  // all-reduce underneath.
  struct BusRatios {
    double reduce_scatter = 1.0;
    double all_reduce = 1.0;
    double of(Collective kind) const {
      return kind == Collective::kReduceScatter ? reduce_scatter : kind == Collective::kAllReduce ? all_reduce : 1.0;
    }
  };
  BusRatios bus_ratios;
  // The collectives' copies run on the cores that compute (device cpu: Gloo on the ranks' own
  // cores): no transfer hides behind compute (no FSDP prefetch overlap, no async TP).
  bool comm_shares_compute = false;
  // The host's cost of dispatching one operator, where the host waits for it (device cpu: the
  // op runs on the dispatching thread); 0 where launches run ahead of the device (GPUs).
  double op_dispatch_s = 0;
  // device cpu: a group of g ranks smaller than the world, measured while the other ranks
  // compute (what a TP, CP or FSDP group or a pipeline transfer meets in a larger world), and the
  // whole world: its fixed cost per message and bandwidths, by g. A group size not here uses the
  // figures above (for the world, the same as its entry's small messages).
  // Measured at two message sizes (the whole gathered or reduced tensor): kProbeMessageBytes,
  // which the caches hold, and kProbeLargeMessageBytes, which they do not (an FSDP group's
  // gradients, a 128k-vocabulary embedding): on this machine Gloo's all-gather of 64 MiB moves
  // half the bytes per second of 4 MiB's. A size between is interpolated on log(size).
  struct GroupLink {
    double message_latency_s = 0;
    double bytes_per_s = 0;  // the all-gather's bus bandwidth
    BusRatios ratios;
    double large_bytes_per_s = 0;  // the same for large messages; 0: not measured (the above for all)
    BusRatios large_ratios;
    // The bus bandwidth of one kind of collective (an all-to-all or a send: the all-gather's)
    // whose whole tensor is `message_bytes`.
    double bus_bytes_per_s(Collective kind, double message_bytes) const;
  };
  std::map<int64_t, GroupLink> group_links;
  // The cores all ranks share (device cpu); 0: a device per rank. Where ranks outnumber them, a
  // rank that waits lends its share to those that compute (the pipeline simulation counts it).
  double host_cores = 0;
};

struct Cluster {
  int64_t nodes = 1;
  int64_t gpus_per_node = 8;
  DeviceSpec device;
  int64_t world() const { return nodes * gpus_per_node; }
  std::vector<std::string> describe() const;  // one line each: the figures in use
};

// The GPU kinds the table holds (the plan.device key's choices but cpu).
const std::vector<std::string>& device_kinds();

// The cluster of [plan]: the table's figures for plan.device, each overridden by its key when
// non-zero. plan.device = cpu measures this machine instead: a GEMM probe in the config's compute
// dtype, a memory copy and a TCP loopback transfer (what Gloo's ranks on one host use), and
// shares them among plan.gpus_per_node processes. Throws ConfigError for a device without what a
// key asks (float8 on an A100).
Cluster cluster_from_config(const trainer::config::JobConfig& cfg);

}  // namespace titan::planner
