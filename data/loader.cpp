#include "data/loader.h"

#include <ATen/ops/empty.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

namespace titan::data {
namespace {

constexpr const char* kStateFormat = "titan.data_loader.v1";

void check_config(const DataConfig& c) {
  auto fail = [](const std::string& message) { throw std::runtime_error(message); };
  if (c.seq_len < 1) fail("training.seq_len must be >= 1, got " + std::to_string(c.seq_len));
  if (c.global_batch_size < 1) {
    fail("training.global_batch_size must be >= 1 for the data loader, got " +
         std::to_string(c.global_batch_size));
  }
  if (c.dp_degree < 1 || c.dp_rank < 0 || c.dp_rank >= c.dp_degree) {
    fail("data loader: dp_rank " + std::to_string(c.dp_rank) + " is not in [0, dp_degree " +
         std::to_string(c.dp_degree) + ")");
  }
  if (c.global_batch_size % c.dp_degree != 0) {
    fail("training.global_batch_size (" + std::to_string(c.global_batch_size) +
         ") is not divisible by the data-parallel degree (" + std::to_string(c.dp_degree) +
         "): every rank must get the same number of rows; use a multiple of " +
         std::to_string(c.dp_degree));
  }
}

std::string dataset_label(const DataConfig& c) {
  return "dataset '" + c.dataset + "'" + (c.dataset_path.empty() ? "" : " at " + c.dataset_path);
}

}  // namespace

DataLoader::DataLoader(const DataConfig& config, const Tokenizer& tokenizer) : config_(config) {
  check_config(config_);
  source_ = make_token_source(config_.dataset, config_.dataset_path, tokenizer, config_.seed);
  const int64_t window = config_.seq_len + 1;
  windows_per_epoch_ = source_->size() / window;
  if (windows_per_epoch_ == 0) {
    throw std::runtime_error(dataset_label(config_) + " has " + std::to_string(source_->size()) +
                             " tokens, fewer than one window of training.seq_len + 1 = " +
                             std::to_string(window) +
                             " tokens: use more data or a smaller training.seq_len");
  }
}

Batch DataLoader::next_batch() {
  // See Note [Global batch order] in loader.h.
  const int64_t seq_len = config_.seq_len;
  const int64_t window = seq_len + 1;
  const int64_t rows = config_.global_batch_size / config_.dp_degree;
  const int64_t first = batches_consumed_ * config_.global_batch_size + config_.dp_rank * rows;

  at::Tensor windows = at::empty({rows, window}, at::kLong);  // [rows, seq_len + 1] int64
  int64_t* data = windows.data_ptr<int64_t>();
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t index = first + i;  // window index over the whole run
    const int64_t epoch = index / windows_per_epoch_;
    const int64_t offset = (index % windows_per_epoch_) * window;
    source_->read(epoch, offset, window, data + i * window);
  }
  ++batches_consumed_;
  Batch batch;
  batch.inputs = windows.narrow(1, 0, seq_len).contiguous();  // [rows, seq_len] int64
  batch.labels = windows.narrow(1, 1, seq_len).contiguous();  // [rows, seq_len] int64
  return batch;
}

std::string DataLoader::state_dict() const {
  nlohmann::json state = {
      {"format", kStateFormat},
      {"dataset", config_.dataset},
      {"dataset_path", config_.dataset_path},
      {"seq_len", config_.seq_len},
      {"global_batch_size", config_.global_batch_size},
      {"seed", config_.seed},
      {"tokens_in_stream", source_->size()},
      {"batches_consumed", batches_consumed_},
      // Informational only; derived from batches_consumed.
      {"epoch", batches_consumed_ * config_.global_batch_size / windows_per_epoch_},
  };
  const std::string hints = source_->resume_hints();
  if (!hints.empty()) state["source"] = nlohmann::json::parse(hints);
  return state.dump();
}

void DataLoader::load_state_dict(const std::string& text) {
  nlohmann::json state;
  try {
    state = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw std::runtime_error(std::string("data loader state is not valid JSON: ") + e.what());
  }
  if (!state.is_object() || state.value("format", "") != kStateFormat) {
    throw std::runtime_error(std::string("data loader state lacks \"format\": \"") + kStateFormat +
                             "\" (not saved by this data loader?)");
  }
  // Everything that decides which tokens a position means must match; dataset_path may differ
  // (data moved), since tokens_in_stream still catches a different corpus.
  auto expect = [&](const char* key, const nlohmann::json& current) {
    auto it = state.find(key);
    if (it == state.end() || *it != current) {
      throw std::runtime_error(
          std::string("data loader state was saved with ") + key + " = " +
          (it == state.end() ? std::string("(missing)") : it->dump()) + ", but this run has " +
          current.dump() + ": resuming would read different tokens; use the original value");
    }
  };
  expect("dataset", config_.dataset);
  expect("seq_len", config_.seq_len);
  expect("global_batch_size", config_.global_batch_size);
  expect("seed", config_.seed);
  expect("tokens_in_stream", source_->size());
  auto consumed = state.find("batches_consumed");
  if (consumed == state.end() || !consumed->is_number_integer() || consumed->get<int64_t>() < 0) {
    throw std::runtime_error(
        "data loader state has no valid \"batches_consumed\" (an integer >= 0)");
  }
  batches_consumed_ = consumed->get<int64_t>();
  if (auto hints = state.find("source"); hints != state.end()) source_->load_resume_hints(hints->dump());
}

std::string DataLoader::describe() const {
  const int64_t window = config_.seq_len + 1;
  const int64_t rows = config_.global_batch_size / config_.dp_degree;
  std::ostringstream out;
  if (source_->endless()) {
    out << source_->describe() << "; windows of seq_len + 1 = " << window
        << " tokens; global batch " << config_.global_batch_size << " rows = "
        << config_.dp_degree << " DP rank(s) x " << rows << "; position: batch "
        << batches_consumed_;
    return out.str();
  }
  out << source_->describe() << "; " << windows_per_epoch_ << " windows of seq_len + 1 = "
      << window << " tokens per epoch (" << source_->size() - windows_per_epoch_ * window
      << " tail tokens unused); global batch " << config_.global_batch_size << " rows = "
      << config_.dp_degree << " DP rank(s) x " << rows << "; "
      << static_cast<double>(windows_per_epoch_) / static_cast<double>(config_.global_batch_size)
      << " steps per epoch; position: batch " << batches_consumed_;
  return out.str();
}

}  // namespace titan::data
