// trainer/checkpoint/checkpointer.h — the trainer's checkpoints, end to end: what the training
// state is (the holders: model, optimizer, dataloader, float8), how a run starts (resume from
// the newest complete step-N, else the initial weights, else the random init; the seed
// checkpoint), what a save writes (a full checkpoint, the model only, or the last step as a
// Hugging Face folder) and the export of the final weights. The CheckpointManager (manager.h)
// does the files; this decides what goes into them and when, so that the Trainer's loop only
// asks "save now?" and "save".
#pragma once

#include <c10/core/Device.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/loader.h"
#include "model/transformer.h"
#include "parallel/comm/mesh.h"
#include "parallel/parallel_model.h"
#include "trainer/checkpoint/manager.h"
#include "trainer/checkpoint/state.h"
#include "trainer/config/job_config.h"
#include "trainer/optim/optimizer.h"

namespace titan::trainer::checkpoint {

class Checkpointer {
 public:
  // The training state of this rank: `rank` of `world_size`, on `device`.
  Checkpointer(const config::JobConfig& cfg, model::Transformer& model, parallel::ParallelModel& parallel,
               optim::AdamW& optimizer, data::DataLoader& loader, parallel::comm::DeviceMesh& mesh, int rank,
               int world_size, c10::Device device);
  ~Checkpointer();

  // At start-up: resume (checkpoint.enable_checkpoint and a complete step-N exists, or
  // initial_load_path with initial_load_model_only = false: CheckpointManager::find_resume), else
  // the initial weights (checkpoint.initial_load_path / initial_load_in_hf), else nothing (the
  // random init stays); then, when asked, the seed checkpoint. Every rank loads, then all agree (one
  // all-reduce) so that no rank trains on while another failed. Returns the step resumed from
  // (0: a fresh start).
  int64_t start();
  // Whether step `step` is saved (checkpoint.interval, and always the last).
  bool should_save(int64_t step) const;
  // Saves step `step`: the whole training state; the model only at step 0 (the seed) or at the
  // last step with checkpoint.last_save_model_only; the last step as a Hugging Face folder with
  // checkpoint.last_save_in_hf.
  void save(int64_t step);
  // Waits until an asynchronous save is complete (before the run ends).
  void wait();
  // Writes the full float32 master weights (in checkpoint.export_dtype) as one safetensors file
  // (export_format torchtitan) or a Hugging Face folder (hf); every rank joins the gathers (one
  // parameter at a time), rank 0 writes.
  void export_weights(const std::string& path);
  const CheckpointManager& manager() const { return *manager_; }

 private:
  void load_initial_weights(const std::string& path);
  // The training state's holders, in save/load order (See state.h).
  Holders state_holders();
  nlohmann::json model_shape() const;  // what a checkpoint's model must match
  // The full weights as a Hugging Face folder in checkpoint.export_dtype: every rank joins the
  // gathers, rank 0 writes; returns the bytes written (export_weights, last_save_in_hf).
  int64_t write_hf_weights(const std::string& dir);

  const config::JobConfig& cfg_;
  model::Transformer& model_;
  parallel::ParallelModel& parallel_;
  optim::AdamW& optimizer_;
  data::DataLoader& loader_;
  parallel::comm::DeviceMesh& mesh_;
  int rank_;
  c10::Device device_;
  std::unique_ptr<CheckpointManager> manager_;
  std::vector<std::unique_ptr<Stateful>> holders_;  // the Stateful adapters state_holders() names
};

}  // namespace titan::trainer::checkpoint
