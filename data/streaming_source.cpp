#include "data/streaming_source.h"

#include <algorithm>
#include <filesystem>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace titan::data {
namespace {

constexpr const char* kHintsFormat = "titan.streamed_corpus.v1";

}  // namespace

StreamingTokenSource::StreamingTokenSource(std::vector<std::string> files,
                                           const Tokenizer& tokenizer, std::string origin)
    : files_(std::move(files)), tokenizer_(&tokenizer), origin_(std::move(origin)) {
  if (files_.empty()) throw std::runtime_error(origin_ + ": no files to read");
  for (const std::string& file : files_) {
    std::error_code ec;
    const auto bytes = std::filesystem::file_size(file, ec);
    if (ec) throw std::runtime_error(origin_ + ": cannot read the size of " + file + ": " + ec.message());
    file_bytes_.push_back(static_cast<int64_t>(bytes));
  }
  pull_document();  // fails here, naming the corpus, when no file holds a document
}

void StreamingTokenSource::pull_document() const {
  std::string text;
  int64_t files_without_documents = 0;
  const auto num_files = static_cast<int64_t>(files_.size());
  for (;;) {
    if (!stream_) {
      if (files_without_documents == num_files) {
        throw std::runtime_error(origin_ + " holds no documents (" + std::to_string(num_files) +
                                 " file(s) read)");
      }
      const int64_t buffer_end = buffer_begin_ + static_cast<int64_t>(buffer_.size());
      file_start_.emplace(next_ordinal_, buffer_end);
      stream_ = open_document_stream(files_[static_cast<size_t>(next_ordinal_ % num_files)]);
      ++next_ordinal_;
      ++files_without_documents;
    }
    if (stream_->next(text)) break;
    stream_.reset();
  }
  const std::vector<int32_t> ids = tokenizer_->encode(text, /*bos=*/true, /*eos=*/true);
  buffer_.insert(buffer_.end(), ids.begin(), ids.end());
}

void StreamingTokenSource::seek_near(int64_t offset) const {
  // File starts grow with the ordinal; the latest one at or before `offset` (ordinal 0 starts
  // at 0, so there is one), searched from the newest: usually the first one is it.
  auto start = file_start_.rbegin();
  while (start->second > offset) ++start;
  const int64_t buffer_end = buffer_begin_ + static_cast<int64_t>(buffer_.size());
  if (offset >= buffer_begin_ && start->second <= buffer_end) return;  // reading on gets there
  next_ordinal_ = start->first;
  stream_.reset();
  buffer_.clear();
  buffer_begin_ = start->second;
}

void StreamingTokenSource::read(int64_t epoch, int64_t offset, int64_t count, int64_t* out) const {
  if (epoch != 0 || offset < 0 || count < 0 || offset > kEndlessTokens - count) {
    throw std::runtime_error(origin_ + ": read of " + std::to_string(count) + " tokens at epoch " +
                             std::to_string(epoch) + ", offset " + std::to_string(offset) +
                             " (a streamed corpus has one endless epoch)");
  }
  seek_near(offset);
  auto buffer_end = [&] { return buffer_begin_ + static_cast<int64_t>(buffer_.size()); };
  while (buffer_end() < offset + count) {
    if (buffer_end() <= offset) {  // everything held lies before the window: drop it
      buffer_begin_ = buffer_end();
      buffer_.clear();
    }
    pull_document();
  }
  const int32_t* src = buffer_.data() + (offset - buffer_begin_);
  for (int64_t i = 0; i < count; ++i) out[i] = src[i];
  // Readers move forward: tokens before `offset` are dropped once they are half the buffer
  // (amortized O(1) per token); going back later rewinds to a file start.
  const int64_t behind = offset - buffer_begin_;
  if (behind > 0 && behind * 2 >= static_cast<int64_t>(buffer_.size())) {
    buffer_.erase(buffer_.begin(), buffer_.begin() + behind);
    buffer_begin_ = offset;
  }
}

std::string StreamingTokenSource::describe() const {
  int64_t bytes = 0;
  for (int64_t b : file_bytes_) bytes += b;
  return origin_ + ": " + std::to_string(files_.size()) + " file(s), " + std::to_string(bytes) +
         " bytes, streamed in file order (no shuffle), passes repeat endlessly";
}

std::string StreamingTokenSource::resume_hints() const {
  nlohmann::json starts = nlohmann::json::array();
  for (const auto& [ordinal, offset] : file_start_) starts.push_back({ordinal, offset});
  nlohmann::json files = nlohmann::json::array();
  for (size_t i = 0; i < files_.size(); ++i) {
    files.push_back({std::filesystem::path(files_[i]).filename().string(), file_bytes_[i]});
  }
  return nlohmann::json{{"format", kHintsFormat},
                        {"tokenizer", tokenizer_->describe()},
                        {"files", files},
                        {"file_starts", starts}}
      .dump();
}

void StreamingTokenSource::load_resume_hints(const std::string& text) {
  nlohmann::json hints;
  try {
    hints = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw std::runtime_error(origin_ + ": the checkpoint's stream position is not valid JSON (" +
                             e.what() + ")");
  }
  if (!hints.is_object() || hints.value("format", "") != kHintsFormat) {
    throw std::runtime_error(origin_ + ": the checkpoint's stream position lacks \"format\": \"" +
                             kHintsFormat + "\"");
  }
  const nlohmann::json current = nlohmann::json::parse(resume_hints());
  // The same tokens at the same offsets need the same tokenizer and the same files.
  if (hints.value("tokenizer", "") != current["tokenizer"]) {
    throw std::runtime_error(origin_ + ": the checkpoint was taken with tokenizer " +
                             hints.value("tokenizer", "(none)") + ", this run uses " +
                             current["tokenizer"].get<std::string>() +
                             ": resuming would read different tokens");
  }
  const nlohmann::json& saved_files = hints["files"];
  const nlohmann::json& files = current["files"];
  if (saved_files != files) {
    std::string what = std::to_string(saved_files.size()) + " file(s) then, " +
                       std::to_string(files.size()) + " now";
    for (size_t i = 0; i < std::min(saved_files.size(), files.size()); ++i) {
      if (saved_files[i] != files[i]) {
        what = "file " + std::to_string(i) + " was " + saved_files[i].dump() + ", is " + files[i].dump();
        break;
      }
    }
    throw std::runtime_error(origin_ + ": the checkpoint was taken over a different corpus (" +
                             what + "): resuming would read different tokens");
  }
  for (const nlohmann::json& start : hints.at("file_starts")) {
    file_start_.emplace(start.at(0).get<int64_t>(), start.at(1).get<int64_t>());
  }
}

}  // namespace titan::data
