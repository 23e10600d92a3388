#include "data/token_source.h"

#include <algorithm>
#include <filesystem>
#include <numeric>
#include <random>
#include <stdexcept>

#include "data/documents.h"
#include "data/streaming_source.h"
#include "util/file_kind.h"

namespace titan::data {

std::vector<int64_t> shuffled_order(int64_t n, int64_t seed) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::mt19937_64 rng(static_cast<uint64_t>(seed));
  for (int64_t i = n - 1; i > 0; --i) {
    // Modulo bias is ~i / 2^64: irrelevant here, and it keeps the draw library-independent.
    auto j = static_cast<int64_t>(rng() % static_cast<uint64_t>(i + 1));
    std::swap(order[i], order[j]);
  }
  return order;
}

DocumentTokenSource::DocumentTokenSource(const std::vector<std::string>& documents,
                                         const Tokenizer& tokenizer, int64_t seed, bool shuffle,
                                         std::string origin)
    : origin_(std::move(origin)), seed_(seed), shuffle_(shuffle) {
  doc_begin_.reserve(documents.size() + 1);
  doc_begin_.push_back(0);
  for (const std::string& document : documents) {
    std::vector<int32_t> ids = tokenizer.encode(document, /*bos=*/true, /*eos=*/true);
    tokens_.insert(tokens_.end(), ids.begin(), ids.end());
    doc_begin_.push_back(static_cast<int64_t>(tokens_.size()));
  }
  tokens_.shrink_to_fit();
}

void DocumentTokenSource::select_epoch(int64_t epoch) const {
  if (epoch == epoch_) return;
  const int64_t n = num_documents();
  if (shuffle_) {
    order_ = shuffled_order(n, seed_ + epoch);
  } else {
    order_.resize(static_cast<size_t>(n));
    std::iota(order_.begin(), order_.end(), int64_t{0});
  }
  stream_begin_.assign(1, 0);
  for (int64_t doc : order_) {
    stream_begin_.push_back(stream_begin_.back() + doc_begin_[doc + 1] - doc_begin_[doc]);
  }
  epoch_ = epoch;
}

void DocumentTokenSource::read(int64_t epoch, int64_t offset, int64_t count, int64_t* out) const {
  if (epoch < 0 || offset < 0 || count < 0 || offset + count > size()) {
    throw std::runtime_error(origin_ + ": read of [" + std::to_string(offset) + ", " +
                             std::to_string(offset + count) + ") outside its " +
                             std::to_string(size()) + " tokens");
  }
  select_epoch(epoch);
  // Position k of the stream holds document order_[k] at [stream_begin_[k], stream_begin_[k+1]).
  auto k = static_cast<size_t>(
      std::upper_bound(stream_begin_.begin(), stream_begin_.end(), offset) -
      stream_begin_.begin() - 1);
  while (count > 0) {
    const int64_t doc = order_[k];
    const int64_t within = offset - stream_begin_[k];
    const int64_t take = std::min(count, stream_begin_[k + 1] - offset);
    const int32_t* src = tokens_.data() + doc_begin_[doc] + within;
    for (int64_t i = 0; i < take; ++i) out[i] = src[i];
    out += take;
    offset += take;
    count -= take;
    ++k;
  }
}

std::string DocumentTokenSource::describe() const {
  return origin_ + ": " + std::to_string(num_documents()) + " documents, " +
         std::to_string(size()) + " tokens" +
         (shuffle_ ? ", document order shuffled per epoch (seed + epoch)" : "");
}

ShardTokenSource::ShardTokenSource(const std::string& path, const Tokenizer& tokenizer)
    : path_(path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<std::string> files;
  if (path.empty()) {
    throw std::runtime_error("the tokens dataset needs training.dataset_path (a .bin shard or a "
                             "folder of *.bin shards)");
  } else if (fs::is_regular_file(path, ec)) {
    files.push_back(path);
  } else if (util::is_special_file(path)) {  // a FIFO would block the read, /dev/zero never ends
    throw std::runtime_error("tokens dataset path " + path + " is " + util::file_kind(path) +
                             ", not a .bin shard or a folder of them");
  } else if (fs::is_directory(path, ec)) {
    for (const fs::directory_entry& entry : fs::directory_iterator(path)) {
      if (entry.is_regular_file() && entry.path().extension() == ".bin") {
        files.push_back(entry.path().string());
      }
    }
    std::sort(files.begin(), files.end());
    if (files.empty()) throw std::runtime_error("tokens dataset folder " + path + " has no *.bin");
  } else {
    throw std::runtime_error("tokens dataset path " + path +
                             " does not exist (expected a .bin shard or a folder of them)");
  }
  shard_begin_.push_back(0);
  for (const std::string& file : files) {
    TokenShard shard(file);
    if (shard.vocab_size() != tokenizer.vocab_size()) {
      throw std::runtime_error("token shard " + file + " was written for vocab_size " +
                               std::to_string(shard.vocab_size()) + ", but the tokenizer (" +
                               tokenizer.describe() + ") has " +
                               std::to_string(tokenizer.vocab_size()) +
                               ": re-run titan-tokenize with this tokenizer");
    }
    shard_begin_.push_back(shard_begin_.back() + shard.size());
    shards_.push_back(std::move(shard));
  }
}

void ShardTokenSource::read(int64_t epoch, int64_t offset, int64_t count, int64_t* out) const {
  if (offset < 0 || count < 0 || offset + count > size()) {
    throw std::runtime_error("tokens dataset " + path_ + ": read of [" + std::to_string(offset) +
                             ", " + std::to_string(offset + count) + ") outside its " +
                             std::to_string(size()) + " tokens");
  }
  // The last shard whose first token is <= offset (skipping empty shards is automatic).
  auto s = static_cast<size_t>(std::upper_bound(shard_begin_.begin(), shard_begin_.end(), offset) -
                               shard_begin_.begin() - 1);
  while (count > 0) {
    const int64_t within = offset - shard_begin_[s];
    const int64_t take = std::min(count, shard_begin_[s + 1] - offset);
    if (take > 0) shards_[s].read(within, take, out);
    out += take;
    offset += take;
    count -= take;
    ++s;
  }
}

std::string ShardTokenSource::describe() const {
  return "tokens " + path_ + ": " + std::to_string(shards_.size()) + " shard(s), " +
         std::to_string(size()) + " tokens, same order every epoch";
}

std::unique_ptr<TokenSource> make_token_source(const std::string& dataset,
                                               const std::string& path,
                                               const Tokenizer& tokenizer, int64_t seed) {
  if (dataset == "tokens") return std::make_unique<ShardTokenSource>(path, tokenizer);
  if (dataset == "c4" || dataset == "c4_test") {
    return std::make_unique<StreamingTokenSource>(c4_files(path), tokenizer, dataset + " " + path);
  }
  if (dataset == "fortunes" || dataset == "text" || dataset == "jsonl") {
    const std::string where = path.empty() && dataset == "fortunes" ? kFortunesDir : path;
    return std::make_unique<DocumentTokenSource>(read_documents(dataset, path), tokenizer, seed,
                                                 /*shuffle=*/true, dataset + " " + where);
  }
  throw std::runtime_error("unknown dataset '" + dataset +
                           "' (allowed: fortunes, text, jsonl, c4, c4_test, tokens)");
}

}  // namespace titan::data
