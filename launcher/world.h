// launcher/world.h — who am I in the job: rank, world size and rendezvous address, read from the
// environment that titan-run / torchrun set (Slurm's srun as a fallback).
//
// Plain C++17 (no LibTorch): it is part of the titan_launcher target, which titan-run links.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace titan::launcher {

struct WorldInfo {
  int rank = 0;              // global rank, 0 .. world_size-1
  int local_rank = 0;        // rank on this node, 0 .. local_world_size-1
  int world_size = 1;
  int local_world_size = 1;  // ranks on this node
  int group_rank = 0;        // node index (torchrun's GROUP_RANK)
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  bool from_env = false;     // false: nothing was set, single-process defaults
};

// Looks up one environment variable; std::nullopt when unset. Tests pass a map-backed one.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

// Reads, in this order of precedence:
//  1. torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
//     MASTER_ADDR, MASTER_PORT), used when RANK or WORLD_SIZE is set;
//  2. Slurm's (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE or
//     SLURM_TASKS_PER_NODE, SLURM_NODEID, first host of SLURM_JOB_NODELIST/SLURM_NODELIST),
//     used when SLURM_PROCID is set; MASTER_ADDR / MASTER_PORT still override;
//  3. single-process defaults (rank 0 of 1).
// MASTER_PORT defaults to 29500 (torchrun's default). Throws std::runtime_error naming the
// variable and its value when a value is not a number or the values contradict each other.
WorldInfo world_from_env();
WorldInfo world_from_env(const EnvLookup& lookup);

// Expands a Slurm hostlist: "node[01-04,07],gpu5" -> node01 node02 node03 node04 node07 gpu5.
// Several bracket groups in one name multiply ("r[1-2]n[1-2]" -> r1n1 r1n2 r2n1 r2n2).
// Zero padding follows the range's lower bound, as in Slurm. Throws on malformed lists.
// Refuses (std::runtime_error) a nodelist that expands to more than 131,072 hosts.
std::vector<std::string> expand_slurm_nodelist(const std::string& nodelist);

// Task count of node `node_index` from SLURM_TASKS_PER_NODE syntax: "2(x3),1" -> 2,2,2,1.
int slurm_tasks_on_node(const std::string& tasks_per_node, int node_index);

// One line for logs: "rank 3/8 (local 1/2, node 1) master 10.0.0.1:29500 [torchrun env]".
std::string describe(const WorldInfo& world);

}  // namespace titan::launcher
