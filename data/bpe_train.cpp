#include "data/bpe_train.h"

#include <stdexcept>
#include <unordered_map>

#include "data/pretokenizer.h"

namespace titan::data {
namespace {

struct Word {
  std::vector<int32_t> ids;  // current token ids of one distinct piece
  int64_t count = 0;         // how often the piece occurs in the text
};

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
         static_cast<uint32_t>(right);
}

void add_pairs(const Word& word, int64_t sign, std::unordered_map<uint64_t, int64_t>* counts) {
  for (size_t i = 0; i + 1 < word.ids.size(); ++i) {
    auto key = pair_key(word.ids[i], word.ids[i + 1]);
    int64_t& count = (*counts)[key];
    count += sign * word.count;
    if (count == 0) counts->erase(key);
  }
}

bool has_pair(const Word& word, int32_t left, int32_t right) {
  for (size_t i = 0; i + 1 < word.ids.size(); ++i) {
    if (word.ids[i] == left && word.ids[i + 1] == right) return true;
  }
  return false;
}

// Replaces each non-overlapping (left, right), scanning left to right, by `merged`.
void merge_pair(Word* word, int32_t left, int32_t right, int32_t merged) {
  std::vector<int32_t> out;
  out.reserve(word->ids.size());
  for (size_t i = 0; i < word->ids.size(); ++i) {
    if (i + 1 < word->ids.size() && word->ids[i] == left && word->ids[i + 1] == right) {
      out.push_back(merged);
      ++i;
    } else {
      out.push_back(word->ids[i]);
    }
  }
  word->ids = std::move(out);
}

}  // namespace

std::vector<std::string> train_bpe(std::string_view text, int64_t n_merges) {
  if (n_merges < 0) {
    throw std::runtime_error("train_bpe: n_merges must be >= 0, got " + std::to_string(n_merges));
  }
  std::vector<std::string> vocab;
  std::unordered_map<std::string, int32_t> index;  // token bytes -> id
  for (int b = 0; b < 256; ++b) {
    vocab.emplace_back(1, static_cast<char>(b));
    index.emplace(vocab.back(), b);
  }

  std::unordered_map<std::string_view, int64_t> piece_counts;
  for (std::string_view piece : pretokenize_llama3(text)) ++piece_counts[piece];
  std::vector<Word> words;
  words.reserve(piece_counts.size());
  for (const auto& [piece, count] : piece_counts) {
    if (piece.size() < 2) continue;  // nothing to merge inside a single byte
    Word word;
    word.count = count;
    for (char c : piece) word.ids.push_back(static_cast<unsigned char>(c));
    words.push_back(std::move(word));
  }

  std::unordered_map<uint64_t, int64_t> pair_counts;
  for (const Word& word : words) add_pairs(word, +1, &pair_counts);

  const size_t target = 256 + static_cast<size_t>(n_merges);
  while (vocab.size() < target && !pair_counts.empty()) {
    uint64_t best_key = 0;
    int64_t best_count = 0;
    for (const auto& [key, count] : pair_counts) {
      if (count > best_count || (count == best_count && key < best_key)) {
        best_key = key;
        best_count = count;
      }
    }
    const auto left = static_cast<int32_t>(best_key >> 32);
    const auto right = static_cast<int32_t>(best_key & 0xFFFFFFFFu);
    std::string bytes = vocab[left] + vocab[right];
    // Two different pairs can spell the same bytes ("a"+"ab" vs "aa"+"b"); a tiktoken file holds
    // each spelling once, so such a merge reuses the existing id.
    int32_t merged;
    if (auto it = index.find(bytes); it != index.end()) {
      merged = it->second;
    } else {
      merged = static_cast<int32_t>(vocab.size());
      index.emplace(bytes, merged);
      vocab.push_back(std::move(bytes));
    }
    for (Word& word : words) {
      if (!has_pair(word, left, right)) continue;
      add_pairs(word, -1, &pair_counts);
      merge_pair(&word, left, right, merged);
      add_pairs(word, +1, &pair_counts);
    }
  }
  return vocab;
}

}  // namespace titan::data
