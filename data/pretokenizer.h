// data/pretokenizer.h — Llama-3's pre-tokenization: the regex that cuts text into
// pieces before byte-pair merging (BPE never merges across a piece boundary).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace titan::data {

// The pattern of Meta's llama3 tokenizer.py, matched with PCRE2 in UTF-8 + Unicode-property mode.
extern const char* const kLlama3SplitPattern;

// Splits `text` into consecutive pieces whose concatenation is `text` again. Bytes that are not
// valid UTF-8 match no alternative of the pattern; each such run becomes a piece of its own, so
// arbitrary bytes still encode (tiktoken only ever sees valid UTF-8 and has no such case).
// The views point into `text`. Thread-safe.
std::vector<std::string_view> pretokenize_llama3(std::string_view text);

// Any split pattern (a tokenizer.json pre-tokenizer's regex), compiled once with the same
// PCRE2 options; split() behaves as pretokenize_llama3 with this pattern. Thread-safe.
class SplitPattern {
 public:
  explicit SplitPattern(std::string pattern);
  ~SplitPattern();
  SplitPattern(const SplitPattern&) = delete;
  SplitPattern& operator=(const SplitPattern&) = delete;

  std::vector<std::string_view> split(std::string_view text) const;
  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8 (kept out of this header)
};

}  // namespace titan::data
