// data/token_shard.h — pre-tokenized binary shards ("TITANTOK"), read by mmap so a
// corpus larger than RAM costs only the pages a batch touches.
//
// File layout (little-endian), written by write_token_shard / `titan-tokenize`:
//   offset  0  char[8]  magic "TITANTOK"
//           8  uint32   format version (1)
//          12  uint32   bytes per token: 2 (uint16 ids) or 4 (uint32 ids)
//          16  uint64   token count
//          24  uint64   vocab_size of the tokenizer that wrote it (every id is < vocab_size)
//          32  ids      token count x bytes per token
// Documents inside are already framed as [BOS] doc [EOS] and concatenated in their final order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace titan::data {

constexpr char kTokenShardMagic[8] = {'T', 'I', 'T', 'A', 'N', 'T', 'O', 'K'};
constexpr uint32_t kTokenShardVersion = 1;
constexpr int64_t kTokenShardHeaderBytes = 32;

// Writes `tokens` whole or not at all (util/atomic_file.h). `bytes_per_token` 0 picks 2 when vocab_size fits
// uint16, else 4. Throws if an id is outside [0, vocab_size) or does not fit the width.
void write_token_shard(const std::string& path, const std::vector<int32_t>& tokens,
                       int64_t vocab_size, int bytes_per_token = 0);

// One shard, memory-mapped read-only. The constructor validates the header and the file size
// against the count; errors name the file.
class TokenShard {
 public:
  explicit TokenShard(const std::string& path);
  ~TokenShard();
  TokenShard(TokenShard&& other) noexcept;
  TokenShard& operator=(TokenShard&&) = delete;
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;

  const std::string& path() const { return path_; }
  int64_t size() const { return count_; }
  int64_t vocab_size() const { return vocab_size_; }
  int bytes_per_token() const { return bytes_per_token_; }

  // Copies ids [offset, offset + count) to `out`. Throws (naming the file and position) for an
  // id >= vocab_size: a corrupt shard must not index past the embedding.
  void read(int64_t offset, int64_t count, int64_t* out) const;

 private:
  std::string path_;
  const unsigned char* map_ = nullptr;  // the whole file, PROT_READ
  size_t map_bytes_ = 0;
  int64_t count_ = 0;
  int64_t vocab_size_ = 0;
  int bytes_per_token_ = 0;
};

}  // namespace titan::data
