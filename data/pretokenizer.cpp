#include "data/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <memory>
#include <stdexcept>
#include <string>

namespace titan::data {

// Verbatim from Meta's tokenizer.py (alternatives split over lines only for width).
const char* const kLlama3SplitPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|)"
    R"( ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

namespace {

// PCRE2 code for `pattern`; MATCH_INVALID_UTF: invalid UTF-8 is skipped over instead of failing
// the whole match. JIT is ~10x faster; when the platform lacks it the interpreter gives the same
// matches. PCRE2 code is immutable after compile, so threads share it (each call gets its own
// match data).
pcre2_code* compile_pattern(const std::string& pattern) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()),
                                   PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error_code,
                                   &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    throw std::runtime_error("PCRE2 failed to compile the split pattern '" + pattern +
                             "' at offset " + std::to_string(error_offset) + ": " +
                             reinterpret_cast<const char*>(message));
  }
  (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return code;
}

struct MatchDataDeleter {
  void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};

std::vector<std::string_view> split_with(const pcre2_code* code, std::string_view text) {
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> match(
      pcre2_match_data_create_from_pattern(code, nullptr));
  if (!match) throw std::runtime_error("pre-tokenizer: out of memory for PCRE2 match data");

  std::vector<std::string_view> pieces;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos < text.size()) {
    int rc = pcre2_match(code, subject, text.size(), pos, 0, match.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) {
      pieces.push_back(text.substr(pos));  // only invalid UTF-8 (or unmatched text) is left
      break;
    }
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      throw std::runtime_error("pre-tokenizer: PCRE2 match failed at byte " +
                               std::to_string(pos) + ": " +
                               reinterpret_cast<const char*>(message));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.get());
    size_t begin = ovector[0];
    size_t end = ovector[1];
    if (begin > pos) pieces.push_back(text.substr(pos, begin - pos));  // skipped bytes
    if (end == begin) {
      // Llama 3's pattern matches no empty string; guard against looping on another pattern.
      end = begin + 1;
      pieces.push_back(text.substr(begin, 1));
    } else {
      pieces.push_back(text.substr(begin, end - begin));
    }
    pos = end;
  }
  return pieces;
}

}  // namespace

std::vector<std::string_view> pretokenize_llama3(std::string_view text) {
  static const SplitPattern llama3(kLlama3SplitPattern);
  return llama3.split(text);
}

SplitPattern::SplitPattern(std::string pattern)
    : pattern_(std::move(pattern)), code_(compile_pattern(pattern_)) {}

SplitPattern::~SplitPattern() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

std::vector<std::string_view> SplitPattern::split(std::string_view text) const {
  return split_with(static_cast<const pcre2_code*>(code_), text);
}

}  // namespace titan::data
