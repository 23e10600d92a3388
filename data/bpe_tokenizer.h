// data/bpe_tokenizer.h — Llama-3's byte-level BPE tokenizer over a tiktoken vocabulary.
//
// encode = pre-tokenize with the Llama-3 regex (pretokenizer.h), then merge the bytes of each
// piece by lowest rank exactly as tiktoken does. The 256 Llama-3 special tokens follow the base
// ranks: ids num_base_tokens + 0.. are <|begin_of_text|> (BOS), <|end_of_text|> (EOS),
// <|reserved_special_token_0|>, <|reserved_special_token_1|>, <|finetune_right_pad_id|>,
// <|step_id|>, <|start_header_id|>, <|end_header_id|>, <|eom_id|>, <|eot_id|>, <|python_tag|>,
// then <|reserved_special_token_2|> .. <|reserved_special_token_246|> (Meta's tokenizer.py).
//
// One deliberate difference from Meta's tokenizer.py: it cuts text into 400k-character chunks
// (and runs of > 25k (non-)whitespace characters) before the regex, only to bound tiktoken's
// quadratic merge. Merging here is O(n log n), so the text is not cut; results differ only for
// such giant inputs, at the cut points.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "data/pretokenizer.h"
#include "data/tokenizer.h"

namespace titan::data {

// A byte-level BPE vocabulary from any source: a tiktoken file or a Hugging Face tokenizer.json
// (hf_tokenizer.h).
struct BpeVocabulary {
  std::vector<std::string> tokens;    // id -> bytes of the mergeable tokens, ids 0..n-1
  std::vector<std::string> specials;  // spellings of ids n, n+1, ...
  // (left id << 32 | right id) -> priority, lower merging first (tokenizer.json's merges).
  // Empty: tiktoken's rule, a pair merges with the rank (= id) of its concatenation.
  std::unordered_map<uint64_t, int32_t> merges;
  bool whole_piece_first = true;  // a piece that is one token becomes it (tiktoken; HF's
                                  // ignore_merges)
  std::string split_pattern;      // "" = Llama 3's (kLlama3SplitPattern)
  std::string bos = "<|begin_of_text|>", eos = "<|end_of_text|>";  // among `specials`
};

class BpeTokenizer final : public Tokenizer {
 public:
  static constexpr int kNumSpecialTokens = 256;

  // `ranks[r]` = the bytes of the mergeable token of rank r. All 256 single bytes must be among
  // them (so any input encodes). `origin` names the source in messages and describe().
  BpeTokenizer(std::vector<std::string> ranks, std::string origin);
  BpeTokenizer(BpeVocabulary vocab, std::string origin);
  // Reads a tiktoken file (tiktoken_file.h); errors name the file and line.
  static std::unique_ptr<BpeTokenizer> load(const std::string& path);

  // encoder_ holds views into decoder_'s strings: neither copied nor moved.
  BpeTokenizer(const BpeTokenizer&) = delete;
  BpeTokenizer& operator=(const BpeTokenizer&) = delete;

  std::vector<int32_t> encode(std::string_view text, bool bos, bool eos) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(decoder_.size()); }
  int32_t bos_id() const override { return bos_id_; }
  int32_t eos_id() const override { return eos_id_; }
  std::string describe() const override;

  int64_t num_base_tokens() const { return num_base_tokens_; }
  // The id of a special token by spelling, e.g. "<|eot_id|>"; throws if it is not one.
  int32_t special_token_id(std::string_view name) const;
  // Appends the BPE ids of one pre-tokenized piece to `out` (lowest-rank-first merging).
  void encode_piece(std::string_view piece, std::vector<int32_t>* out) const;

 private:
  std::string origin_;
  std::vector<std::string> decoder_;  // id -> bytes: base ranks, then the specials' spellings
  std::unordered_map<std::string_view, int32_t> encoder_;  // base token bytes -> rank
  int64_t num_base_tokens_ = 0;
  std::unordered_map<uint64_t, int32_t> merges_;  // see BpeVocabulary::merges
  bool whole_piece_first_ = true;
  std::unique_ptr<SplitPattern> pattern_;  // null = Llama 3's
  int32_t bos_id_ = 0, eos_id_ = 0;
};

// The 256 Llama-3 special-token spellings in id order (offset from num_base_tokens).
std::vector<std::string> llama3_special_tokens();

}  // namespace titan::data
