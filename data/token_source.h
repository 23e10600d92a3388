// data/token_source.h — a corpus as one token stream per epoch, with random access.
//
// Note [Token stream]: every dataset becomes a stream of ids in which each document is framed
// as [BOS] ids [EOS], documents back to back. The loader cuts each epoch's stream into windows;
// random access (epoch, offset) is what makes the reader position a pair of integers that a
// checkpoint can store and any data-parallel layout can resume from.
//   - text datasets (fortunes, text, jsonl) are tokenized at load, in memory. Epoch e
//     concatenates the documents in the order of a shuffle seeded with seed + e, so topics mix
//     (fortunes files are one topic each) and every epoch sees a different order.
//   - tokens (mmap'ed TITANTOK shards) are read in shard order, the same every epoch: their
//     order was fixed when titan-tokenize wrote them (it shuffles like epoch 0 by default).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/token_shard.h"
#include "data/tokenizer.h"

namespace titan::data {

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  // Tokens in one epoch's stream (the same for every epoch).
  virtual int64_t size() const = 0;
  // Copies tokens [offset, offset + count) of epoch `epoch`'s stream to `out`.
  virtual void read(int64_t epoch, int64_t offset, int64_t count, int64_t* out) const = 0;
  virtual std::string describe() const = 0;
  // An endless source (a streamed corpus, Note [Streamed corpus]) has one epoch that never
  // ends: size() is kEndlessTokens.
  virtual bool endless() const { return false; }
  // JSON text a checkpoint keeps for the source ("" = nothing), and its restore: lets a
  // resumed run reach its position cheaply and refuse a different corpus.
  virtual std::string resume_hints() const { return ""; }
  virtual void load_resume_hints(const std::string& /*hints*/) {}
};

// size() of an endless source: far beyond any run, and small enough that offsets plus a batch
// never overflow int64.
constexpr int64_t kEndlessTokens = int64_t{1} << 60;

// Documents tokenized once at construction. Not thread-safe: read() caches the current epoch's
// document order (one loader per rank, one thread per loader).
class DocumentTokenSource final : public TokenSource {
 public:
  // `shuffle` false keeps the given document order in every epoch.
  DocumentTokenSource(const std::vector<std::string>& documents, const Tokenizer& tokenizer,
                      int64_t seed, bool shuffle, std::string origin);

  int64_t size() const override { return static_cast<int64_t>(tokens_.size()); }
  void read(int64_t epoch, int64_t offset, int64_t count, int64_t* out) const override;
  std::string describe() const override;
  int64_t num_documents() const { return static_cast<int64_t>(doc_begin_.size()) - 1; }

 private:
  void select_epoch(int64_t epoch) const;

  std::string origin_;
  std::vector<int32_t> tokens_;     // [total] all framed documents, in input order
  std::vector<int64_t> doc_begin_;  // [docs + 1] offset of document d in tokens_
  int64_t seed_;
  bool shuffle_;
  mutable int64_t epoch_ = -1;               // epoch that order_/stream_begin_ describe
  mutable std::vector<int64_t> order_;       // [docs] document at stream position k
  mutable std::vector<int64_t> stream_begin_;  // [docs + 1] stream offset of position k
};

// TITANTOK shards (token_shard.h) in sorted order; their vocab_size must equal the tokenizer's.
class ShardTokenSource final : public TokenSource {
 public:
  // `path`: one shard file, or a folder whose *.bin files are the shards.
  ShardTokenSource(const std::string& path, const Tokenizer& tokenizer);

  int64_t size() const override { return shard_begin_.back(); }
  void read(int64_t epoch, int64_t offset, int64_t count, int64_t* out) const override;
  std::string describe() const override;

 private:
  std::string path_;
  std::vector<TokenShard> shards_;
  std::vector<int64_t> shard_begin_;  // [shards + 1] stream offset of each shard's first token
};

// Fisher-Yates over 0..n-1 driven by std::mt19937_64(seed) (the engine is fully specified by the
// standard, unlike std::shuffle, so the order is the same with every standard library).
std::vector<int64_t> shuffled_order(int64_t n, int64_t seed);

// dataset: "fortunes" | "text" | "jsonl" | "tokens" (in memory, shuffled per epoch) or "c4" |
// "c4_test" (streamed, StreamingTokenSource); path "" = the dataset's default.
std::unique_ptr<TokenSource> make_token_source(const std::string& dataset,
                                               const std::string& path,
                                               const Tokenizer& tokenizer, int64_t seed);

}  // namespace titan::data
