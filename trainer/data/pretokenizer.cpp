#include "trainer/data/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <memory>
#include <stdexcept>
#include <string>

namespace titan::trainer {

// Verbatim from Meta's tokenizer.py (alternatives split over lines only for width).
const char* const kLlama3SplitPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|)"
    R"( ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

namespace {

// The compiled pattern, shared read-only by all threads (PCRE2 code is immutable after compile;
// each call gets its own match data).
class CompiledPattern {
 public:
  CompiledPattern() {
    int error_code = 0;
    PCRE2_SIZE error_offset = 0;
    // MATCH_INVALID_UTF: invalid UTF-8 is skipped over instead of failing the whole match.
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kLlama3SplitPattern), PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error_code,
                          &error_offset, nullptr);
    if (code_ == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error_code, message, sizeof(message));
      throw std::runtime_error("PCRE2 failed to compile the Llama-3 split pattern at offset " +
                               std::to_string(error_offset) + ": " +
                               reinterpret_cast<const char*>(message));
    }
    // JIT is ~10x faster; when the platform lacks it the interpreter gives the same matches.
    (void)pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);
  }
  ~CompiledPattern() { pcre2_code_free(code_); }
  CompiledPattern(const CompiledPattern&) = delete;
  CompiledPattern& operator=(const CompiledPattern&) = delete;

  const pcre2_code* code() const { return code_; }

 private:
  pcre2_code* code_ = nullptr;
};

const CompiledPattern& llama3_pattern() {
  static const CompiledPattern pattern;
  return pattern;
}

struct MatchDataDeleter {
  void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};

}  // namespace

std::vector<std::string_view> pretokenize_llama3(std::string_view text) {
  const CompiledPattern& pattern = llama3_pattern();
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> match(
      pcre2_match_data_create_from_pattern(pattern.code(), nullptr));
  if (!match) throw std::runtime_error("pretokenize_llama3: out of memory for PCRE2 match data");

  std::vector<std::string_view> pieces;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos < text.size()) {
    int rc = pcre2_match(pattern.code(), subject, text.size(), pos, 0, match.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) {
      pieces.push_back(text.substr(pos));  // only invalid UTF-8 is left
      break;
    }
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      throw std::runtime_error("pretokenize_llama3: PCRE2 match failed at byte " +
                               std::to_string(pos) + ": " +
                               reinterpret_cast<const char*>(message));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.get());
    size_t begin = ovector[0];
    size_t end = ovector[1];
    if (begin > pos) pieces.push_back(text.substr(pos, begin - pos));  // skipped invalid bytes
    if (end == begin) {
      // No alternative of the pattern matches the empty string; guard against looping anyway.
      end = begin + 1;
      pieces.push_back(text.substr(begin, 1));
    } else {
      pieces.push_back(text.substr(begin, end - begin));
    }
    pos = end;
  }
  return pieces;
}

}  // namespace titan::trainer
