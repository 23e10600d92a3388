#include "trainer/checkpoint/manager.h"

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "trainer/checkpoint/hf_weights.h"
#include "trainer/checkpoint/safetensors.h"
#include "util/atomic_file.h"
#include "util/logging.h"

namespace titan::trainer::checkpoint {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string rank_file(int rank) {
  char name[64];
  std::snprintf(name, sizeof(name), "rank%05d", rank);
  return name;
}

std::string hex32(uint32_t v) {
  char s[16];
  std::snprintf(s, sizeof(s), "%08x", v);
  return s;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  return os.str() + ']';
}

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("cannot open '" + path + "' to fsync it: " + std::strerror(errno));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw std::runtime_error("fsync of '" + path + "' failed: " + std::strerror(errno));
}

// "step-12" -> 12, "step-12.tmp" -> 12 with *tmp set; -1 for anything else.
int64_t parse_step_name(const std::string& name, bool* tmp) {
  if (name.rfind("step-", 0) != 0) return -1;
  std::string digits = name.substr(5);
  *tmp = digits.size() > 4 && digits.compare(digits.size() - 4, 4, ".tmp") == 0;
  if (*tmp) digits.resize(digits.size() - 4);
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(digits);
}

std::vector<std::string> incomplete_checkpoints(const std::string& folder) {
  std::vector<std::string> out;
  std::error_code ec;
  if (!fs::is_directory(folder, ec)) return out;
  for (const auto& e : fs::directory_iterator(folder)) {
    bool tmp = false;
    if (!e.is_directory() || parse_step_name(e.path().filename().string(), &tmp) < 0) continue;
    // A Hugging Face last save (checkpoint.last_save_in_hf) is complete without a manifest, and
    // is never resumed from (it holds only the model).
    if (!tmp && is_hf_checkpoint(e.path().string())) continue;
    if (tmp || !fs::exists(e.path() / "manifest.json")) out.push_back(e.path().string());
  }
  return out;
}

}  // namespace

std::vector<std::pair<int64_t, std::string>> complete_checkpoints(const std::string& folder) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  if (!fs::is_directory(folder, ec)) return out;
  for (const auto& e : fs::directory_iterator(folder)) {
    bool tmp = false;
    const int64_t step = parse_step_name(e.path().filename().string(), &tmp);
    if (step >= 0 && !tmp && e.is_directory() && fs::exists(e.path() / "manifest.json"))
      out.emplace_back(step, e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// ---------------------------------------------------------------- reading

struct CheckpointReader::OpenFile {
  std::string path;
  int fd = -1;
  std::map<std::string, SafetensorsEntry> entries;
  ~OpenFile() {
    if (fd >= 0) ::close(fd);
  }
};

CheckpointReader::CheckpointReader(std::string step_dir) : dir_(std::move(step_dir)) {
  const std::string path = (fs::path(dir_) / "manifest.json").string();
  std::ifstream in(path);
  if (!in) throw std::runtime_error("checkpoint '" + dir_ + "' has no manifest.json (an interrupted save, or not a titan checkpoint)");
  try {
    manifest_ = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw std::runtime_error("checkpoint manifest '" + path + "' is not valid JSON: " + e.what());
  }
  if (!manifest_.is_object() || manifest_.value("format", "") != kCheckpointFormat)
    throw std::runtime_error("checkpoint manifest '" + path + "' is not a " + kCheckpointFormat + " manifest");
  for (const char* key : {"step", "tensors", "files", "holders", "extras"})
    if (!manifest_.contains(key))
      throw std::runtime_error("checkpoint manifest '" + path + "' lacks \"" + key + "\"");
}

CheckpointReader::~CheckpointReader() = default;

bool CheckpointReader::has_holder(const std::string& holder) const {
  const auto& h = manifest_.at("holders");
  return std::find(h.begin(), h.end(), holder) != h.end();
}

CheckpointReader::OpenFile& CheckpointReader::open(const std::string& file, const std::string& tensor) {
  auto it = files_.find(file);
  if (it != files_.end()) return *it->second;
  auto f = std::make_unique<OpenFile>();
  f->path = (fs::path(dir_) / file).string();
  const auto info = manifest_.at("files").find(file);
  if (info == manifest_.at("files").end())
    throw std::runtime_error("checkpoint '" + dir_ + "': tensor '" + tensor + "' names file '" + file +
                             "', which the manifest does not list");
  struct stat st {};
  if (::stat(f->path.c_str(), &st) != 0)
    throw std::runtime_error("checkpoint file '" + f->path + "' (holding tensor '" + tensor + "') is missing");
  const int64_t expected = info->at("bytes").get<int64_t>();
  if (st.st_size != expected)
    throw std::runtime_error("checkpoint file '" + f->path + "' (holding tensor '" + tensor + "') is " +
                             std::to_string(st.st_size) + " bytes, the manifest says " + std::to_string(expected) +
                             (st.st_size < expected ? " (truncated)" : ""));
  f->entries = read_safetensors_header(f->path);
  f->fd = ::open(f->path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f->fd < 0) throw std::runtime_error("cannot open checkpoint file '" + f->path + "': " + std::strerror(errno));
  return *files_.emplace(file, std::move(f)).first->second;
}

void CheckpointReader::read(const std::string& name, const std::vector<int64_t>& global_shape,
                            const std::vector<int64_t>& offsets, const at::Tensor& dest) {
  const auto& tensors = manifest_.at("tensors");
  const auto it = tensors.find(name);
  if (it == tensors.end()) throw std::runtime_error("checkpoint '" + dir_ + "' has no tensor '" + name + "'");
  const auto saved_shape = it->at("shape").get<std::vector<int64_t>>();
  if (saved_shape != global_shape)
    throw std::runtime_error("checkpoint '" + dir_ + "': tensor '" + name + "' has shape " + shape_text(saved_shape) +
                             " but this run's is " + shape_text(global_shape) + " (a checkpoint of another model?)");
  const at::ScalarType dtype = safetensors_dtype(it->at("dtype").get<std::string>(), "checkpoint '" + dir_ + "'");
  const size_t nd = global_shape.size();
  TORCH_CHECK(nd >= 1 && offsets.size() == nd && static_cast<size_t>(dest.dim()) == nd, "checkpoint read of ", name,
              ": region rank mismatch");
  const std::vector<int64_t> want = dest.sizes().vec();
  int64_t covered = 0, wanted = 1;
  for (int64_t w : want) wanted *= w;
  const int64_t elem = static_cast<int64_t>(c10::elementSize(dtype));
  for (const auto& shard : it->at("shards")) {
    const auto so = shard.at("offsets").get<std::vector<int64_t>>();
    const auto sl = shard.at("lengths").get<std::vector<int64_t>>();
    std::vector<int64_t> a(nd), l(nd);  // the overlap: start in the shard, extent
    int64_t volume = 1;
    for (size_t d = 0; d < nd; ++d) {
      const int64_t lo = std::max(so[d], offsets[d]), hi = std::min(so[d] + sl[d], offsets[d] + want[d]);
      l[d] = std::max<int64_t>(0, hi - lo);
      a[d] = lo - so[d];
      volume *= l[d];
    }
    if (volume == 0) continue;
    const std::string file = shard.at("file").get<std::string>();
    OpenFile& f = open(file, name);
    const auto entry = f.entries.find(name);
    if (entry == f.entries.end())
      throw std::runtime_error("checkpoint file '" + f.path + "' lacks tensor '" + name + "' (the manifest says it is there)");
    if (entry->second.dtype != dtype || entry->second.shape != sl)
      throw std::runtime_error("checkpoint file '" + f.path + "': tensor '" + name + "' is " +
                               safetensors_dtype_name(entry->second.dtype) + " " + shape_text(entry->second.shape) +
                               ", the manifest says " + safetensors_dtype_name(dtype) + " " + shape_text(sl));
    // Row-major: dims after k are whole, so each run of l[k] * inner elements is contiguous.
    std::vector<int64_t> stride(nd, 1);
    for (size_t d = nd - 1; d > 0; --d) stride[d - 1] = stride[d] * sl[d];
    size_t k = nd - 1;
    while (k > 0 && a[k] == 0 && l[k] == sl[k]) --k;
    const int64_t run = l[k] * stride[k];
    at::Tensor part = at::empty(l, at::TensorOptions().dtype(dtype));
    char* out = static_cast<char*>(part.data_ptr());
    std::vector<int64_t> index(k, 0);  // over dims < k
    for (int64_t n = 0; n < volume / run; ++n) {
      int64_t element = a[k] * stride[k];
      for (size_t d = 0; d < k; ++d) element += (a[d] + index[d]) * stride[d];
      const int64_t bytes = run * elem, at_byte = entry->second.begin + element * elem;
      int64_t done = 0;
      while (done < bytes) {
        const ssize_t r = ::pread(f.fd, out + n * bytes + done, static_cast<size_t>(bytes - done), at_byte + done);
        if (r <= 0) throw std::runtime_error("reading tensor '" + name + "' from checkpoint file '" + f.path + "' failed");
        done += r;
      }
      for (size_t d = k; d-- > 0;) {  // next index, last dim fastest
        if (++index[d] < l[d]) break;
        index[d] = 0;
      }
    }
    bytes_read_ += volume * elem;
    if (volume * elem == entry->second.end - entry->second.begin && shard.contains("crc32")) {
      const std::string crc = hex32(crc32_update(0, part.data_ptr(), static_cast<size_t>(volume * elem)));
      if (crc != shard.at("crc32").get<std::string>())
        throw std::runtime_error("checkpoint file '" + f.path + "': tensor '" + name + "' fails its CRC-32 check (" +
                                 crc + ", the manifest says " + shard.at("crc32").get<std::string>() +
                                 "): the file is corrupted");
    }
    at::Tensor target = dest;
    for (size_t d = 0; d < nd; ++d) target = target.narrow(static_cast<int64_t>(d), so[d] + a[d] - offsets[d], l[d]);
    target.copy_(part);
    covered += volume;
  }
  if (covered != wanted)
    throw std::runtime_error("checkpoint '" + dir_ + "': the shards of tensor '" + name + "' cover " +
                             std::to_string(covered) + " of the " + std::to_string(wanted) +
                             " elements this rank needs (a shard is missing from the manifest)");
}

namespace {
class HolderSource final : public StateSource {
 public:
  HolderSource(CheckpointReader& reader, std::string holder)
      : reader_(reader), prefix_(holder + "."), extras_(reader.manifest().at("extras").value(holder, nlohmann::json::object())) {}
  const nlohmann::json& extras() const override { return extras_; }
  bool has(const std::string& name) const override { return reader_.manifest().at("tensors").contains(prefix_ + name); }
  std::vector<std::string> names() const override {
    std::vector<std::string> out;
    for (const auto& [name, entry] : reader_.manifest().at("tensors").items())
      if (name.compare(0, prefix_.size(), prefix_) == 0) out.push_back(name.substr(prefix_.size()));
    return out;
  }
  void read(const std::string& name, const std::vector<int64_t>& global_shape, const std::vector<int64_t>& offsets,
            const at::Tensor& dest) override {
    reader_.read(prefix_ + name, global_shape, offsets, dest);
  }

 private:
  CheckpointReader& reader_;
  std::string prefix_;
  nlohmann::json extras_;
};
}  // namespace

std::unique_ptr<StateSource> CheckpointReader::source(const std::string& holder) {
  return std::make_unique<HolderSource>(*this, holder);
}

void CheckpointManager::load(CheckpointReader& reader, const Holders& holders, const nlohmann::json& model_shape,
                             const std::vector<std::string>& exclude) {
  const nlohmann::json& saved = reader.manifest().value("model", nlohmann::json::object());
  if (saved != model_shape)
    throw std::runtime_error("checkpoint '" + reader.dir() + "' was written for the model " + saved.dump() +
                             ", but this run builds " + model_shape.dump() +
                             ": use the model.flavor and tokenizer it was trained with");
  for (const auto& [name, holder] : holders) {
    if (std::find(exclude.begin(), exclude.end(), name) != exclude.end()) {
      util::log_info("checkpoint: not loading '" + name + "' (checkpoint.exclude_from_loading)");
      continue;
    }
    if (!reader.has_holder(name)) {
      util::log_warn("checkpoint '" + reader.dir() + "' holds no '" + name + "' state (a weights-only checkpoint?): it starts fresh");
      continue;
    }
    try {
      auto source = reader.source(name);
      holder->load_state_dict(*source);
    } catch (const std::exception& e) {
      throw std::runtime_error("resuming from '" + reader.dir() + "' (" + name + "): " + e.what());
    }
  }
}

// ---------------------------------------------------------------- saving

struct CheckpointManager::Staged {
  int64_t step = 0;
  bool model_only = false;
  std::string tmp_dir, final_dir;
  std::vector<std::pair<std::string, at::Tensor>> tensors;  // "<holder>.<name>" -> host data
  nlohmann::json shards = nlohmann::json::array();          // per tensor: dtype, shape, offsets, lengths
  std::vector<std::string> holders;
  nlohmann::json extras = nlohmann::json::object();
  SaveStats stats;
};

CheckpointManager::CheckpointManager(const config::JobConfig& cfg, int rank, int world_size, nlohmann::json layout,
                                     nlohmann::json model_shape, c10::Device device)
    : cfg_(cfg.checkpoint),
      config_toml_(config::config_to_toml(cfg)),
      training_({{"global_batch_size", cfg.training.global_batch_size},
                 {"local_batch_size", cfg.training.local_batch_size},
                 {"seq_len", cfg.training.seq_len},
                 {"steps", cfg.training.steps},
                 {"seed", cfg.training.seed},
                 {"dataset", cfg.training.dataset}}),
      rank_(rank),
      world_size_(world_size),
      layout_(std::move(layout)),
      model_shape_(std::move(model_shape)),
      device_(device),
      folder_((fs::path(cfg.job.dump_folder) / cfg.checkpoint.folder).string()) {}

CheckpointManager::~CheckpointManager() {
  try {
    wait();
  } catch (const std::exception& e) {
    util::log_error(std::string("checkpoint: the last save failed: ") + e.what());
  }
}

// torchtitan's _should_save: nothing under load_only; step 1 with enable_first_step_checkpoint;
// every interval; the last step.
bool CheckpointManager::should_save(int64_t step, int64_t last_step) const {
  if (!cfg_.enable_checkpoint || cfg_.load_only) return false;
  return (step == 1 && cfg_.enable_first_step_checkpoint) || step % cfg_.interval == 0 || step == last_step;
}

std::optional<std::string> CheckpointManager::find_resume() const {
  if (cfg_.enable_checkpoint) {
    for (const std::string& dir : incomplete_checkpoints(folder_))
      util::log_warn("checkpoint: ignoring incomplete '" + dir + "' (a save that did not finish)");
    const auto complete = complete_checkpoints(folder_);
    if (cfg_.load_step >= 0) {
      for (const auto& [step, dir] : complete)
        if (step == cfg_.load_step) return dir;
      std::string have;
      for (const auto& c : complete) have += (have.empty() ? "" : ", ") + std::to_string(c.first);
      throw std::runtime_error("checkpoint.load_step " + std::to_string(cfg_.load_step) + ": '" + folder_ +
                               "/step-" + std::to_string(cfg_.load_step) +
                               "' is not a complete checkpoint (complete steps: " + (have.empty() ? "none" : have) +
                               ")");
    }
    if (!complete.empty()) return complete.back().second;
  }
  // torchtitan's initial_load_model_only = false: with nothing of its own to resume, the run
  // resumes from initial_load_path as from a full checkpoint (model, optimizer, data position,
  // step), whether or not it saves checkpoints itself.
  if (!cfg_.initial_load_model_only && !cfg_.initial_load_path.empty()) {
    if (!fs::exists(fs::path(cfg_.initial_load_path) / "manifest.json"))
      throw std::runtime_error("checkpoint.initial_load_model_only = false resumes from checkpoint.initial_load_path "
                               "as a full titan checkpoint, but '" + cfg_.initial_load_path +
                               "' is not one (a step-N folder with manifest.json); to load only its weights, "
                               "leave checkpoint.initial_load_model_only true");
    return cfg_.initial_load_path;
  }
  return std::nullopt;
}

void CheckpointManager::remove_incomplete() const {
  // load_only leaves the checkpoint folder as it is (find_resume reported what it ignores).
  if (rank_ != 0 || !cfg_.enable_checkpoint || cfg_.load_only) return;
  for (const std::string& dir : incomplete_checkpoints(folder_)) {
    if (dir.size() < 4 || dir.compare(dir.size() - 4, 4, ".tmp") != 0) continue;  // only our own temp folders
    std::error_code ec;
    fs::remove_all(dir, ec);
    util::log_info("checkpoint: removed incomplete '" + dir + "'");
  }
}

SaveStats CheckpointManager::save(int64_t step, const Holders& holders, bool model_only) {
  wait();
  const auto start = Clock::now();
  auto staged = std::make_shared<Staged>();
  staged->step = step;
  staged->model_only = model_only;
  staged->final_dir = (fs::path(folder_) / ("step-" + std::to_string(step))).string();
  staged->tmp_dir = staged->final_dir + ".tmp";
  const bool async = cfg_.async_mode != "disabled";
  const bool pinned = cfg_.async_mode == "async_with_pinned_mem" && device_.is_cuda();
  for (const auto& [holder, stateful] : holders) {
    StateDict sd = stateful->state_dict();
    staged->holders.push_back(holder);
    staged->extras[holder] = std::move(sd.extras);
    for (StateTensor& t : sd.tensors) {
      if (!t.owner) continue;
      at::Tensor host = t.local;
      // Async: a private host copy, since training goes on changing the originals. Sync on the
      // CPU: the tensors themselves (the writer makes them contiguous).
      // The host buffers are kept for the next save (allocating and faulting in a checkpoint's
      // worth of fresh pages each time costs more than the copy); save() waited for the last
      // write, so none is in use.
      if (async || !host.device().is_cpu()) {
        at::Tensor& buffer = staging_[holder + "." + t.name];
        if (!buffer.defined() || buffer.sizes() != t.local.sizes() || buffer.scalar_type() != t.local.scalar_type())
          buffer = at::empty(t.local.sizes(), t.local.options().device(c10::kCPU).pinned_memory(pinned));
        buffer.copy_(t.local);
        host = buffer;
      }
      staged->shards.push_back({{"name", holder + "." + t.name},
                                {"dtype", safetensors_dtype_name(t.local.scalar_type())},
                                {"shape", t.global_shape},
                                {"offsets", t.offsets},
                                {"lengths", t.local.sizes().vec()}});
      staged->tensors.emplace_back(holder + "." + t.name, std::move(host));
    }
  }
  fs::create_directories(staged->tmp_dir);
  staged->stats.step = step;
  if (!async) {
    write(staged);
    staged->stats.stage_seconds = seconds_since(start);
    history_.push_back(staged->stats);
    return staged->stats;
  }
  staged->stats.stage_seconds = seconds_since(start);
  pending_ = std::thread([this, staged] {
    try {
      write(staged);
      history_.push_back(staged->stats);
    } catch (...) {
      pending_error_ = std::current_exception();
    }
  });
  return staged->stats;
}

void CheckpointManager::wait() {
  if (pending_.joinable()) pending_.join();
  if (pending_error_) {
    std::exception_ptr e = pending_error_;
    pending_error_ = nullptr;
    std::rethrow_exception(e);
  }
}

void CheckpointManager::write(const std::shared_ptr<Staged>& staged) {
  const auto start = Clock::now();
  nlohmann::json part = {{"rank", rank_}, {"tensors", staged->shards}};
  if (!staged->tensors.empty()) {
    const std::string file = rank_file(rank_) + ".safetensors";
    const SafetensorsFileInfo info = write_safetensors_file(
        (fs::path(staged->tmp_dir) / file).string(), staged->tensors,
        {{"format", kCheckpointFormat}, {"step", std::to_string(staged->step)}, {"rank", std::to_string(rank_)}});
    part["file"] = {{"name", file}, {"bytes", info.bytes}, {"crc32", hex32(info.crc32)}};
    for (auto& t : part["tensors"]) {
      t["file"] = file;
      t["crc32"] = hex32(info.tensor_crc32.at(t["name"].get<std::string>()));
    }
    staged->stats.bytes = info.bytes;
  }
  util::write_file_atomic((fs::path(staged->tmp_dir) / (rank_file(rank_) + ".part.json")).string(), part.dump());
  if (rank_ == 0) commit(*staged);
  staged->stats.write_seconds = seconds_since(start);
  if (rank_ == 0)
    util::log_info("checkpoint: step " + std::to_string(staged->step) + " written and committed in " +
                   std::to_string(staged->stats.write_seconds).substr(0, 6) + " s" +
                   (cfg_.async_mode == "disabled" ? "" : " (in the background)"));
}

void CheckpointManager::commit(const Staged& staged) {
  const auto start = Clock::now();
  std::vector<nlohmann::json> parts(static_cast<size_t>(world_size_));
  for (int r = 0; r < world_size_; ++r) {
    const fs::path path = fs::path(staged.tmp_dir) / (rank_file(r) + ".part.json");
    while (!fs::exists(path)) {
      if (seconds_since(start) > static_cast<double>(cfg_.commit_timeout_seconds))
        throw std::runtime_error("checkpoint step-" + std::to_string(staged.step) + ": rank " + std::to_string(r) +
                                 " did not write its shards within checkpoint.commit_timeout_seconds (" +
                                 std::to_string(cfg_.commit_timeout_seconds) + " s); '" + staged.tmp_dir +
                                 "' stays incomplete and is ignored on resume");
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::ifstream in(path);
    parts[static_cast<size_t>(r)] = nlohmann::json::parse(in);
  }
  nlohmann::json files = nlohmann::json::object(), tensors = nlohmann::json::object();
  int64_t total_bytes = 0;
  for (const auto& part : parts) {
    if (part.contains("file")) {
      files[part["file"]["name"].get<std::string>()] = {{"bytes", part["file"]["bytes"]}, {"crc32", part["file"]["crc32"]}};
      total_bytes += part["file"]["bytes"].get<int64_t>();
    }
    for (const auto& t : part["tensors"]) {
      const std::string name = t["name"].get<std::string>();
      auto& entry = tensors[name];
      if (entry.is_null()) entry = {{"dtype", t["dtype"]}, {"shape", t["shape"]}, {"shards", nlohmann::json::array()}};
      if (entry["dtype"] != t["dtype"] || entry["shape"] != t["shape"])
        throw std::runtime_error("checkpoint step-" + std::to_string(staged.step) + ": ranks disagree on tensor '" +
                                 name + "' (" + entry.dump() + " vs " + t.dump() + ")");
      entry["shards"].push_back({{"file", t["file"]}, {"offsets", t["offsets"]}, {"lengths", t["lengths"]}, {"crc32", t["crc32"]}});
    }
  }
  nlohmann::json manifest = {{"format", kCheckpointFormat},
                             {"titan_version", kTitanVersion},
                             {"step", staged.step},
                             {"model_weights_only", staged.model_only},
                             {"holders", staged.holders},
                             {"layout", layout_},
                             {"model", model_shape_},
                             {"training", training_},
                             {"files", files},
                             {"tensors", tensors},
                             {"extras", staged.extras},
                             {"config_toml", config_toml_}};
  util::write_file_atomic((fs::path(staged.tmp_dir) / "manifest.json").string(), manifest.dump(1));
  for (int r = 0; r < world_size_; ++r) fs::remove(fs::path(staged.tmp_dir) / (rank_file(r) + ".part.json"));
  fsync_path(staged.tmp_dir, true);
  std::error_code ec;
  fs::remove_all(staged.final_dir, ec);  // a step saved again (resumed from an earlier one)
  fs::rename(staged.tmp_dir, staged.final_dir);
  fsync_path(folder_, true);
  util::log_info("checkpoint: saved " + staged.final_dir + " (" + std::to_string(total_bytes) + " bytes in " +
                 std::to_string(files.size()) + " file(s))");
  if (cfg_.keep_latest_k > 0) {  // only now that the new one is complete
    auto complete = complete_checkpoints(folder_);
    for (size_t i = 0; i + static_cast<size_t>(cfg_.keep_latest_k) < complete.size(); ++i) {
      fs::remove_all(complete[i].second, ec);
      util::log_info("checkpoint: removed " + complete[i].second + " (keep_latest_k " + std::to_string(cfg_.keep_latest_k) + ")");
    }
  }
}

}  // namespace titan::trainer::checkpoint
