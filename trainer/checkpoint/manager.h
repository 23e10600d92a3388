// trainer/checkpoint/manager.h — sharded, atomic, optionally asynchronous checkpoints that load into
// any parallel layout (docs/checkpoint.md has the format and the guarantees).
//
// A checkpoint is one folder per step, <folder>/step-N/:
//   rank00000.safetensors ...   each rank's owned shards (only real elements, no padding), as
//                               safetensors tensors named "<holder>.<name>"
//   manifest.json               every tensor's global shape and dtype and, per shard, its file,
//                               offsets and lengths in the global tensor and CRC-32; every file's
//                               size and CRC-32; the holders' JSON extras; the step, the layout
//                               that wrote it, the model shape, the config, the titan version
// Save: every rank writes its file into step-N.tmp/ (fsync'd) and then a small
// rank<R>.part.json (what its file holds); rank 0 waits for all parts, writes the manifest,
// fsyncs the folder and renames it to step-N, then deletes old checkpoints beyond keep_latest_k.
// A folder without a manifest (killed mid-save) is never loaded; start-up reports and deletes
// it. No collective is issued by a save (so an async save can run beside training); the
// checkpoint folder must be visible to every rank (a shared file system across nodes).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "trainer/checkpoint/state.h"
#include "trainer/config/job_config.h"

namespace titan::trainer::checkpoint {

inline constexpr const char* kTitanVersion = "0.1.0";
inline constexpr const char* kCheckpointFormat = "titan.checkpoint.v1";

// Named holders, saved and loaded in this order ("model", "optimizer", "dataloader", "float8").
using Holders = std::vector<std::pair<std::string, Stateful*>>;

// A checkpoint folder opened for reading: the manifest, checked; shard files opened on demand.
// Every error names the folder, the file and the tensor.
class CheckpointReader {
 public:
  explicit CheckpointReader(std::string step_dir);
  ~CheckpointReader();
  const nlohmann::json& manifest() const { return manifest_; }
  const std::string& dir() const { return dir_; }
  int64_t step() const { return manifest_.at("step").get<int64_t>(); }
  bool has_holder(const std::string& holder) const;
  // The StateSource of one holder (tensor names relative to it).
  std::unique_ptr<StateSource> source(const std::string& holder);

  // Reads the region [offsets, offsets + dest.sizes()) of global tensor `name` into `dest`,
  // touching only the byte ranges of the shard files that overlap it. Each shard read whole is
  // checked against its CRC-32; every file's size against the manifest.
  void read(const std::string& name, const std::vector<int64_t>& global_shape,
            const std::vector<int64_t>& offsets, const at::Tensor& dest);
  int64_t bytes_read() const { return bytes_read_; }

 private:
  struct OpenFile;
  OpenFile& open(const std::string& file, const std::string& tensor);
  std::string dir_;
  nlohmann::json manifest_;
  std::map<std::string, std::unique_ptr<OpenFile>> files_;
  int64_t bytes_read_ = 0;
};

struct SaveStats {
  int64_t step = 0;
  int64_t bytes = 0;         // this rank's file
  double stage_seconds = 0;  // blocking part: copies to host (async) or everything (sync)
  double write_seconds = 0;  // write + fsync (+ commit on rank 0)
};

class CheckpointManager {
 public:
  // `rank`, `world_size`: global; `layout`: what the manifest records about the mesh.
  CheckpointManager(const config::JobConfig& cfg, int rank, int world_size, nlohmann::json layout,
                    nlohmann::json model_shape, c10::Device device);
  ~CheckpointManager();  // waits for a pending save (errors are logged, not thrown)

  bool enabled() const { return cfg_.enable_checkpoint; }
  const std::string& folder() const { return folder_; }
  // Whether step `step` of `last_step` is saved: every interval, always the last, step 1 with
  // enable_first_step_checkpoint; never with load_only or with checkpointing off.
  bool should_save(int64_t step, int64_t last_step) const;

  // The folder to resume from: step-<load_step>, else the latest complete step-N (checkpointing
  // on); else initial_load_path when initial_load_model_only is false (a full titan checkpoint,
  // checked for its manifest); nullopt when there is none. Reports incomplete folders
  // (step-N.tmp, or a step-N without a manifest). Throws when load_step names a step that is not
  // there.
  std::optional<std::string> find_resume() const;
  // Rank 0 deletes incomplete folders left by a killed save (not under load_only); call on every
  // rank before the first save (the caller follows it with a barrier).
  void remove_incomplete() const;

  // Saves `holders` as step-N. Waits for the previous save first. async_mode disabled: returns
  // when step-N is complete (rank 0) / this rank's part is written (others); else returns after
  // the shards are copied to host memory and writes in a background thread.
  SaveStats save(int64_t step, const Holders& holders, bool model_only);
  // Waits for the pending save; rethrows its error.
  void wait();
  const std::vector<SaveStats>& history() const { return history_; }

  // Loads `holders` (except the excluded names) from `reader`; checks the manifest against this
  // run's model shape first. Holders absent from a checkpoint (weights-only) are reported.
  static void load(CheckpointReader& reader, const Holders& holders, const nlohmann::json& model_shape,
                   const std::vector<std::string>& exclude);

 private:
  struct Staged;
  void write(const std::shared_ptr<Staged>& staged);
  void commit(const Staged& staged);  // rank 0

  config::CheckpointSection cfg_;
  std::string config_toml_;
  nlohmann::json training_;
  int rank_, world_size_;
  nlohmann::json layout_, model_shape_;
  c10::Device device_;
  std::string folder_;
  std::map<std::string, at::Tensor> staging_;  // async: host copies, reused save after save
  std::thread pending_;
  std::exception_ptr pending_error_;
  std::vector<SaveStats> history_;
};

// The complete step-N folders under `folder`, ascending by N.
std::vector<std::pair<int64_t, std::string>> complete_checkpoints(const std::string& folder);

}  // namespace titan::trainer::checkpoint
