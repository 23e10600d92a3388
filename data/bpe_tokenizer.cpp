#include "data/bpe_tokenizer.h"

#include <cstdint>
#include <limits>
#include <queue>
#include <stdexcept>
#include <tuple>

#include "data/pretokenizer.h"
#include "data/tiktoken_file.h"

namespace titan::data {

std::vector<std::string> llama3_special_tokens() {
  std::vector<std::string> specials = {
      "<|begin_of_text|>", "<|end_of_text|>",     "<|reserved_special_token_0|>",
      "<|reserved_special_token_1|>",             "<|finetune_right_pad_id|>",
      "<|step_id|>",       "<|start_header_id|>", "<|end_header_id|>",
      "<|eom_id|>",        "<|eot_id|>",          "<|python_tag|>",
  };
  const size_t named = specials.size();
  for (size_t i = 0; i < BpeTokenizer::kNumSpecialTokens - named; ++i) {
    specials.push_back("<|reserved_special_token_" + std::to_string(2 + i) + "|>");
  }
  return specials;
}

BpeTokenizer::BpeTokenizer(std::vector<std::string> ranks, std::string origin)
    : BpeTokenizer(
          [&] {
            BpeVocabulary v;  // tiktoken's rules: no explicit merges, Llama 3's split pattern
            v.tokens = std::move(ranks);
            v.specials = llama3_special_tokens();
            return v;
          }(),
          std::move(origin)) {}

BpeTokenizer::BpeTokenizer(BpeVocabulary vocab, std::string origin)
    : origin_(std::move(origin)),
      num_base_tokens_(static_cast<int64_t>(vocab.tokens.size())),
      merges_(std::move(vocab.merges)),
      whole_piece_first_(vocab.whole_piece_first) {
  if (num_base_tokens_ + static_cast<int64_t>(vocab.specials.size()) >
      std::numeric_limits<int32_t>::max()) {
    throw std::runtime_error("BPE vocabulary " + origin_ + " has " +
                             std::to_string(num_base_tokens_) + " tokens; ids must fit int32");
  }
  if (!vocab.split_pattern.empty() && vocab.split_pattern != kLlama3SplitPattern) {
    pattern_ = std::make_unique<SplitPattern>(vocab.split_pattern);
  }
  decoder_ = std::move(vocab.tokens);
  // Reserve first: encoder_'s keys view these strings, so the vector must never reallocate.
  decoder_.reserve(decoder_.size() + vocab.specials.size());
  for (std::string& special : vocab.specials) decoder_.push_back(std::move(special));
  auto special_id = [&](const std::string& name, const char* role) {
    for (size_t i = num_base_tokens_; i < decoder_.size(); ++i) {
      if (decoder_[i] == name) return static_cast<int32_t>(i);
    }
    throw std::runtime_error("BPE vocabulary " + origin_ + ": its " + role + " token '" + name +
                             "' is not among its special tokens");
  };
  bos_id_ = special_id(vocab.bos, "BOS");
  eos_id_ = special_id(vocab.eos, "EOS");

  encoder_.reserve(static_cast<size_t>(num_base_tokens_));
  for (int64_t rank = 0; rank < num_base_tokens_; ++rank) {
    const std::string& bytes = decoder_[rank];
    if (bytes.empty()) {
      throw std::runtime_error("BPE vocabulary " + origin_ + ": rank " + std::to_string(rank) +
                               " is an empty token");
    }
    auto [it, inserted] = encoder_.emplace(std::string_view(bytes), static_cast<int32_t>(rank));
    if (!inserted) {
      throw std::runtime_error("BPE vocabulary " + origin_ + ": ranks " +
                               std::to_string(it->second) + " and " + std::to_string(rank) +
                               " hold the same bytes");
    }
  }
  // Byte-level BPE starts from single bytes; a missing one would make some input unencodable.
  for (int b = 0; b < 256; ++b) {
    const char c = static_cast<char>(b);
    if (encoder_.find(std::string_view(&c, 1)) == encoder_.end()) {
      throw std::runtime_error("BPE vocabulary " + origin_ + " lacks the single-byte token 0x" +
                               "0123456789abcdef"[b >> 4] + "0123456789abcdef"[b & 15] +
                               "; a byte-level BPE vocabulary must hold all 256 bytes");
    }
  }
}

std::unique_ptr<BpeTokenizer> BpeTokenizer::load(const std::string& path) {
  return std::make_unique<BpeTokenizer>(read_tiktoken_file(path), path);
}

void BpeTokenizer::encode_piece(std::string_view piece, std::vector<int32_t>* out) const {
  if (piece.empty()) return;
  if (auto whole = encoder_.find(piece); whole_piece_first_ && whole != encoder_.end()) {
    out->push_back(whole->second);
    return;
  }
  // tiktoken's byte_pair_merge: repeatedly merge the adjacent pair whose concatenation has the
  // lowest rank, the leftmost on ties, until no adjacent pair is a token. Parts are kept as a
  // linked list keyed by their start byte (next_[s] = start of the following part), and the
  // candidate pairs in a min-heap of (rank, left start, pair end). A heap entry is stale once
  // either part has changed, which shows as a different current pair end.
  constexpr int32_t kNone = std::numeric_limits<int32_t>::max();
  const size_t n = piece.size();
  std::vector<size_t> next(n), prev(n);
  for (size_t i = 0; i < n; ++i) {
    next[i] = i + 1;
    prev[i] = i == 0 ? n : i - 1;  // n = no previous part
  }
  // The priority of merging the part at `start` with the next one (which ends at `end`).
  auto pair_rank = [&](size_t start, size_t end) -> int32_t {
    if (merges_.empty()) {  // tiktoken: the rank of the concatenation
      auto it = encoder_.find(piece.substr(start, end - start));
      return it == encoder_.end() ? kNone : it->second;
    }
    const size_t mid = next[start];
    auto left = encoder_.find(piece.substr(start, mid - start));
    auto right = encoder_.find(piece.substr(mid, end - mid));
    if (left == encoder_.end() || right == encoder_.end()) return kNone;
    auto it = merges_.find(static_cast<uint64_t>(left->second) << 32 |
                           static_cast<uint32_t>(right->second));
    return it == merges_.end() ? kNone : it->second;
  };
  using Candidate = std::tuple<int32_t, size_t, size_t>;  // rank, left start, pair end
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  for (size_t i = 0; i + 1 < n; ++i) {
    int32_t rank = pair_rank(i, i + 2);
    if (rank != kNone) heap.emplace(rank, i, i + 2);
  }
  std::vector<bool> alive(n, true);
  while (!heap.empty()) {
    auto [rank, left, end] = heap.top();
    heap.pop();
    const size_t right = next[left];
    if (!alive[left] || right >= n || next[right] != end) continue;  // stale
    // Merge right into left.
    alive[right] = false;
    next[left] = end;
    if (end < n) prev[end] = left;
    if (end < n) {
      int32_t r = pair_rank(left, next[end]);
      if (r != kNone) heap.emplace(r, left, next[end]);
    }
    if (prev[left] < n) {
      int32_t r = pair_rank(prev[left], end);
      if (r != kNone) heap.emplace(r, prev[left], end);
    }
  }
  for (size_t start = 0; start < n; start = next[start]) {
    // Every part is a single byte or a merged token, so the lookup cannot fail.
    out->push_back(encoder_.at(piece.substr(start, next[start] - start)));
  }
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text, bool bos, bool eos) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 2);
  if (bos) ids.push_back(bos_id());
  for (std::string_view piece : pattern_ ? pattern_->split(text) : pretokenize_llama3(text)) {
    encode_piece(piece, &ids);
  }
  if (eos) ids.push_back(eos_id());
  return ids;
}

std::string BpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= decoder_.size()) {
      throw std::runtime_error("BPE tokenizer " + origin_ + ": cannot decode id " +
                               std::to_string(id) + " (vocab_size " +
                               std::to_string(decoder_.size()) + ")");
    }
    out += decoder_[id];
  }
  return out;
}

std::string BpeTokenizer::describe() const {
  return std::string(merges_.empty() ? "Llama-3 BPE tokenizer " : "byte-level BPE tokenizer ") +
         origin_ + " (" + std::to_string(num_base_tokens_) + " base tokens + " +
         std::to_string(vocab_size() - num_base_tokens_) + " specials = vocab " +
         std::to_string(vocab_size()) + "; BOS " + std::to_string(bos_id_) + " " +
         decoder_[bos_id_] + ", EOS " + std::to_string(eos_id_) + " " + decoder_[eos_id_] + ")";
}

int32_t BpeTokenizer::special_token_id(std::string_view name) const {
  for (int64_t i = num_base_tokens_; i < vocab_size(); ++i) {
    if (decoder_[i] == name) return static_cast<int32_t>(i);
  }
  throw std::runtime_error("'" + std::string(name) +
                           "' is not a Llama-3 special token (e.g. <|begin_of_text|>, <|eot_id|>)");
}

}  // namespace titan::data
