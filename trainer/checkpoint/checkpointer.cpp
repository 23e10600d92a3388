// trainer/checkpoint/checkpointer.cpp — see checkpointer.h.
#include "trainer/checkpoint/checkpointer.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>

#include <ATen/core/grad_mode.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <utility>

#include "parallel/comm/process_group.h"
#include "trainer/checkpoint/hf_weights.h"
#include "trainer/checkpoint/safetensors.h"
#include "trainer/checkpoint/weights_check.h"
#include "trainer/config/parallel_options.h"
#include "util/logging.h"

namespace titan::trainer::checkpoint {

Checkpointer::Checkpointer(const config::JobConfig& cfg, model::Transformer& model, parallel::ParallelModel& parallel,
                           optim::AdamW& optimizer, data::DataLoader& loader, parallel::comm::DeviceMesh& mesh,
                           int rank, int world_size, c10::Device device)
    : cfg_(cfg),
      model_(model),
      parallel_(parallel),
      optimizer_(optimizer),
      loader_(loader),
      mesh_(mesh),
      rank_(rank),
      device_(device) {
  const parallel::comm::ParallelDims& dims = mesh_.dims();
  nlohmann::json layout = {{"world_size", world_size}, {"dp_replicate", dims.dp_replicate},
                           {"dp_shard", dims.dp_shard}, {"tp", dims.tp}};
  manager_ = std::make_unique<CheckpointManager>(cfg_, rank, world_size, layout, model_shape(), device_);
  // A Hugging Face load or save of a model that has no Hugging Face format (hf_format's refusal,
  // naming why) ends the job now, not after its last training step.
  const auto& c = cfg_.checkpoint;
  if (c.initial_load_in_hf || (c.enable_checkpoint && c.last_save_in_hf) ||
      (!c.export_path.empty() && c.export_format == "hf")) {
    try {
      hf_architecture(model_.args());
    } catch (const std::invalid_argument& e) {
      throw config::ConfigError(std::string(e.what()) + " (asked by checkpoint." +
                                (c.initial_load_in_hf ? "initial_load_in_hf" :
                                 c.last_save_in_hf   ? "last_save_in_hf" : "export_format = hf") + ")");
    }
  }
}

Checkpointer::~Checkpointer() = default;

bool Checkpointer::should_save(int64_t step) const { return manager_->should_save(step, cfg_.training.steps); }

void Checkpointer::wait() { manager_->wait(); }

void Checkpointer::load_initial_weights(const std::string& path) {
  namespace fs = std::filesystem;
  if (!fs::exists(path)) throw std::runtime_error("checkpoint.initial_load_path '" + path + "' does not exist");
  if (fs::is_directory(path) && fs::exists(fs::path(path) / "manifest.json")) {  // a titan step-N folder
    CheckpointReader reader(path);
    ModelState weights(parallel_);
    CheckpointManager::load(reader, {{"model", &weights}}, model_shape(), {});
    util::log_info("loaded initial weights from titan checkpoint " + path + " (" + std::to_string(reader.bytes_read()) +
                   " bytes read by this rank)");
    return;
  }
  const bool hf = is_hf_checkpoint(path);
  // The persistent buffers (MoE layers' expert_bias): every rank holds every layer's.
  std::map<std::string, at::Tensor*> buffers;
  std::vector<std::string> buffer_names;
  model_.visit_buffers([&](const std::string& fqn, at::Tensor& buffer) {
    buffers[fqn] = &buffer;
    buffer_names.push_back(fqn);
  });
  auto load = [&](const std::string& name, const at::Tensor& full) {
    if (const auto it = buffers.find(name); it != buffers.end()) {
      if (full.sizes() != it->second->sizes())
        throw std::runtime_error("tensor '" + name + "' has shape " + c10::str(full.sizes()) + ", the model's " +
                                 c10::str(it->second->sizes()));
      at::NoGradGuard no_grad;
      it->second->copy_(full);
      return;
    }
    if (parallel_.holds_param(name)) parallel_.load_full(name, full);  // under pp: this rank's stages
  };
  const std::vector<std::string> absent =
      load_weights_file(path, model_.args(), parallel_.all_param_names(), load, buffer_names);
  util::log_info(std::string("loaded initial weights from ") + (hf ? "Hugging Face checkpoint " : "") + path +
                 (buffer_names.size() > absent.size()
                      ? " with " + std::to_string(buffer_names.size() - absent.size()) + " MoE layers' expert_bias"
                      : ""));
  if (!absent.empty())
    util::log_warn(
        "checkpoint.initial_load_path '" + path + "' holds no load-balancing bias for " +
        std::to_string(absent.size()) + " MoE layer(s) ('" + absent.front() + "'" +
        (absent.size() > 1 ? ", ..." : "") + "): their expert_bias starts at zero, and load balancing from there" +
        (hf && !hf_buffer_name(absent.front(), model_.args()) ? " (this family's Hugging Face format has no tensor for it)"
                                                              : ""));
}

int64_t Checkpointer::write_hf_weights(const std::string& dir) {
  const at::ScalarType dtype = config::dtype_from_name(cfg_.checkpoint.export_dtype, "checkpoint.export_dtype");
  std::vector<std::string> names = parallel_.all_param_names();
  std::vector<std::vector<int64_t>> shapes;
  for (const auto& name : names) shapes.push_back(parallel_.full_shape(name));
  // Buffers (expert_bias) go where the family's Hub format has a tensor for them.
  std::map<std::string, at::Tensor> buffers;
  std::vector<std::string> left_out;
  model_.visit_buffers([&](const std::string& fqn, at::Tensor& buffer) {
    if (!hf_buffer_name(fqn, model_.args())) {
      left_out.push_back(fqn);
      return;
    }
    names.push_back(fqn);
    shapes.push_back(buffer.sizes().vec());
    buffers[fqn] = buffer.detach();
  });
  if (!left_out.empty() && rank_ == 0)
    util::log_info("checkpoint: " + hf_architecture(model_.args()).first + "'s format has no tensor for the " +
                   std::to_string(left_out.size()) + " MoE layers' load-balancing expert_bias ('" + left_out.front() +
                   "', ...): the Hugging Face weights leave it out (a run started from them balances from zero)");
  return write_hf_folder(dir, names, shapes, model_.args(), dtype,
                         [&](const std::string& fqn) {
                           const auto it = buffers.find(fqn);
                           return it != buffers.end() ? it->second : parallel_.full_param(fqn);
                         },
                         rank_ == 0);
}

void Checkpointer::export_weights(const std::string& path) {
  const at::ScalarType dtype = config::dtype_from_name(cfg_.checkpoint.export_dtype, "checkpoint.export_dtype");
  if (cfg_.checkpoint.export_format == "hf") {
    const int64_t bytes = write_hf_weights(path);
    if (rank_ == 0)
      util::log_info("exported weights in Hugging Face's layout to " + path + " (" + std::to_string(bytes) + " bytes)");
    return;
  }
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const std::string& name : parallel_.all_param_names()) {
    // Every rank joins the gathers of each full parameter; rank 0 writes the file.
    at::Tensor full = parallel_.full_param(name);
    if (rank_ == 0) tensors.emplace_back(name, full.to(at::kCPU).to(dtype));
  }
  if (rank_ != 0) return;
  // The model's persistent buffers as the step-N checkpoints hold them (identical on every rank,
  // float32 whatever export_dtype: the load balancing an initial load continues from).
  model_.visit_buffers([&](const std::string& fqn, at::Tensor& buffer) {
    tensors.emplace_back(fqn, buffer.detach().to(at::kCPU).to(at::kFloat).clone());
  });
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  save_safetensors(path, tensors, {{"format", "pt"}, {"flavor", cfg_.model.flavor}});
  util::log_info("exported weights to " + path);
}

nlohmann::json Checkpointer::model_shape() const {
  const model::ModelArgs& a = model_.args();
  return {{"dim", a.dim},         {"n_layers", a.n_layers},     {"n_heads", a.n_heads},
          {"n_kv_heads", a.kv_heads()}, {"vocab_size", a.vocab_size}, {"ffn_hidden_dim", a.ffn_hidden_dim()}};
}

Holders Checkpointer::state_holders() {
  holders_.clear();
  holders_.push_back(std::make_unique<ModelState>(parallel_, at::kFloat, rank_ == 0));
  holders_.push_back(std::make_unique<OptimizerState>(optimizer_, parallel_));
  holders_.push_back(std::make_unique<DataLoaderState>(loader_));
  holders_.push_back(std::make_unique<Float8State>(model_, device_, rank_ == 0));
  return {{"model", holders_[0].get()},
          {"optimizer", holders_[1].get()},
          {"dataloader", holders_[2].get()},
          {"float8", holders_[3].get()}};
}

void Checkpointer::save(int64_t step) {
  const int64_t last = cfg_.training.steps;
  const bool model_only = (step == last && cfg_.checkpoint.model_weights_only) || step == 0;
  if (step == last && cfg_.checkpoint.last_save_in_hf) {
    // torchtitan's last_save_in_hf: the last checkpoint is the model as a Hugging Face folder,
    // step-N under the checkpoint folder, written (files fsync'd, then renamed) by rank 0 while
    // every rank joins the gathers.
    manager_->wait();  // an async save of an earlier step finishes first
    const std::string dir = (std::filesystem::path(manager_->folder()) / ("step-" + std::to_string(step))).string();
    // Written as step-N.tmp and renamed: a save killed midway leaves only a temporary folder,
    // which the next start-up removes.
    const int64_t bytes = write_hf_weights(dir + ".tmp");
    if (rank_ == 0) {
      std::filesystem::remove_all(dir);
      std::filesystem::rename(dir + ".tmp", dir);
    }
    if (rank_ == 0)
      util::log_info("checkpoint: step " + std::to_string(step) + " saved as a Hugging Face folder " + dir + " (" +
                     std::to_string(bytes) + " bytes, " + cfg_.checkpoint.export_dtype + ")");
    return;
  }
  Holders holders;
  std::unique_ptr<Stateful> weights;
  if (model_only) {
    const at::ScalarType dtype =
        step > 0 ? config::dtype_from_name(cfg_.checkpoint.export_dtype, "checkpoint.export_dtype") : at::kFloat;
    weights = std::make_unique<ModelState>(parallel_, dtype, rank_ == 0);
    holders = {{"model", weights.get()}};
  } else {
    holders = state_holders();
  }
  const SaveStats stats = manager_->save(step, holders, model_only);
  util::log_info("checkpoint: step " + std::to_string(step) +
                 (cfg_.checkpoint.async_mode == "disabled" ? " saved" : " staged") + " in " +
                 std::to_string(stats.stage_seconds).substr(0, 6) + " s of training time (" +
                 cfg_.checkpoint.async_mode + ")");
}

namespace {

// The load errors of the ranks that failed, gathered to every rank (each sends its own, up to
// kBytes; "" when it did not fail): "rank 1 failed to load the checkpoint: <its message>; ...".
std::string errors_of_other_ranks(parallel::comm::Comm& world, const std::string& mine, c10::Device device) {
  constexpr int64_t kBytes = 2048;
  at::Tensor sent = at::zeros({kBytes}, at::kByte);
  std::memcpy(sent.data_ptr<uint8_t>(), mine.data(), std::min<size_t>(mine.size(), kBytes - 1));
  at::Tensor gathered = at::empty({world.size() * kBytes}, sent.options().device(device));
  world.all_gather_into_tensor(gathered, sent.to(device));
  const at::Tensor all = gathered.to(at::kCPU);
  std::string text;
  for (int r = 0; r < world.size(); ++r) {
    const char* message = reinterpret_cast<const char*>(all.data_ptr<uint8_t>() + r * kBytes);
    if (*message == '\0') continue;
    text += (text.empty() ? "" : "; ") + std::string("rank ") + std::to_string(world.global_ranks()[static_cast<size_t>(r)]) +
            " failed to load the checkpoint: " + std::string(message, strnlen(message, kBytes));
  }
  return text;
}

}  // namespace

int64_t Checkpointer::start() {
  const auto& c = cfg_.checkpoint;
  if (!c.initial_load_path.empty() && !std::filesystem::exists(c.initial_load_path))
    throw config::ConfigError("checkpoint.initial_load_path '" + c.initial_load_path + "' does not exist");
  if (c.create_seed_checkpoint && !c.enable_checkpoint)
    throw config::ConfigError("checkpoint.create_seed_checkpoint needs checkpoint.enable_checkpoint");

  // Every rank loads; then all agree (one all-reduce) so that no rank trains on while another
  // failed: each reports its own error, the others say that a peer failed.
  std::string error;
  std::optional<std::string> resume;
  int64_t start_step = 0;
  const auto started = std::chrono::steady_clock::now();
  int64_t bytes_read = 0;
  try {
    resume = c.create_seed_checkpoint ? std::nullopt : manager_->find_resume();
    if (resume) {
      CheckpointReader reader(*resume);
      CheckpointManager::load(reader, state_holders(), model_shape(), c.exclude_from_loading);
      start_step = reader.step();
      bytes_read = reader.bytes_read();
      const auto& ex = c.exclude_from_loading;
      if (std::find(ex.begin(), ex.end(), "dataloader") != ex.end() || !reader.has_holder("dataloader")) {
        auto state = nlohmann::json::parse(loader_.state_dict());  // continue at batch `step`
        state["batches_consumed"] = start_step;
        loader_.load_state_dict(state.dump());
      }
    } else if (c.initial_load_in_hf) {
      // torchtitan's initial_load_in_hf: initial_load_path, else model.hf_assets_path, which must
      // be a Hugging Face checkpoint (titan would read its other formats; torchtitan would not).
      const std::string path = c.initial_load_path.empty() ? cfg_.model.hf_assets_path : c.initial_load_path;
      const char* key = c.initial_load_path.empty() ? "model.hf_assets_path" : "checkpoint.initial_load_path";
      if (!std::filesystem::exists(path) || !is_hf_checkpoint(path))
        throw std::runtime_error(std::string("checkpoint.initial_load_in_hf = true, but ") + key + " '" + path +
                                 "' is not a Hugging Face checkpoint (a folder with model.safetensors or "
                                 "model.safetensors.index.json)");
      load_initial_weights(path);
    } else if (!c.initial_load_path.empty()) {
      load_initial_weights(c.initial_load_path);
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  int any_failed = error.empty() ? 0 : 1;
  if (parallel::comm::Comm* world = mesh_.world()) {
    at::Tensor flag = at::tensor({static_cast<float>(any_failed)}, at::TensorOptions().dtype(at::kFloat)).to(device_);
    world->all_reduce(flag, parallel::comm::ReduceOp::kMax);
    any_failed = flag.item<float>() > 0 ? 1 : 0;
    // Every rank says what failed where, whatever LOG_RANK shows: the failing ranks' messages
    // (the one naming the file) gathered to all (one more collective, on the failure path only);
    // a failing rank keeps its own.
    if (any_failed) {
      const std::string failures = errors_of_other_ranks(*world, error, device_);
      if (error.empty()) error = failures;
    }
  }
  if (any_failed) throw std::runtime_error(error);
  // After a resume: FSDP's precomputed float8 scales as the saved step's optimizer step left
  // them (a fresh run's first step measures its scales, as the uninterrupted run did).
  if (resume) parallel_.after_load();
  if (resume)
    util::log_info("checkpoint: resumed from " + *resume + " at step " + std::to_string(start_step) + " (" +
                   std::to_string(bytes_read) + " bytes read by this rank in " +
                   std::to_string(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count())
                       .substr(0, 6) +
                   " s)");
  // Restarted by titan-run --max-restarts (Note [In-job restarts] in launcher/launcher.cpp): say
  // where this attempt starts.
  if (const char* count = std::getenv("TORCHELASTIC_RESTART_COUNT"); count && std::atoi(count) > 0)
    util::log_info(std::string("restart ") + count + " of the job: " +
                   (resume ? "continuing from the checkpoint of step " + std::to_string(start_step)
                    : c.enable_checkpoint ? std::string("no complete checkpoint yet, training starts again from step 1")
                               : std::string("checkpoint.enable_checkpoint is false, training starts again from step 1")));
  manager_->remove_incomplete();
  if (parallel::comm::Comm* world = mesh_.world()) world->barrier();
  if (c.create_seed_checkpoint) {
    save(0);
    manager_->wait();
    util::log_info("checkpoint: wrote the seed checkpoint (step-0); exiting");
  }
  return start_step;
}

}  // namespace titan::trainer::checkpoint
