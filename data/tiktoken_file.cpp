#include "data/tiktoken_file.h"
#include "data/text_lines.h"

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

#include "util/atomic_file.h"

namespace titan::data {
namespace {

constexpr char kBase64Alphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int base64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

[[noreturn]] void fail_line(const std::string& path, size_t line, const std::string& what) {
  throw std::runtime_error("tiktoken file " + path + ", line " + std::to_string(line) + ": " +
                           what + " (each line must be '<base64 token bytes> <rank>')");
}

// Strict decimal parse of a rank; false on anything else (sign, spaces, overflow).
bool parse_rank(std::string_view text, int64_t* rank) {
  if (text.empty() || text.size() > 10) return false;
  int64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    value = value * 10 + (c - '0');
  }
  if (value > INT32_MAX) return false;
  *rank = value;
  return true;
}

}  // namespace

std::string base64_encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    uint32_t v = (uint32_t(uint8_t(bytes[i])) << 16) | (uint32_t(uint8_t(bytes[i + 1])) << 8) |
                 uint32_t(uint8_t(bytes[i + 2]));
    out += kBase64Alphabet[(v >> 18) & 63];
    out += kBase64Alphabet[(v >> 12) & 63];
    out += kBase64Alphabet[(v >> 6) & 63];
    out += kBase64Alphabet[v & 63];
  }
  size_t rest = bytes.size() - i;
  if (rest > 0) {
    uint32_t v = uint32_t(uint8_t(bytes[i])) << 16;
    if (rest == 2) v |= uint32_t(uint8_t(bytes[i + 1])) << 8;
    out += kBase64Alphabet[(v >> 18) & 63];
    out += kBase64Alphabet[(v >> 12) & 63];
    out += rest == 2 ? kBase64Alphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

bool base64_decode(std::string_view text, std::string* bytes) {
  bytes->clear();
  if (text.size() % 4 != 0) return false;
  for (size_t i = 0; i < text.size(); i += 4) {
    bool last = i + 4 == text.size();
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      char c = text[i + k];
      if (c == '=' && last && k >= 2) {
        v[k] = 0;
        ++pad;
        continue;
      }
      if (pad > 0) return false;  // data after padding
      v[k] = base64_value(c);
      if (v[k] < 0) return false;
    }
    uint32_t word = (uint32_t(v[0]) << 18) | (uint32_t(v[1]) << 12) | (uint32_t(v[2]) << 6) |
                    uint32_t(v[3]);
    bytes->push_back(static_cast<char>((word >> 16) & 0xFF));
    if (pad < 2) bytes->push_back(static_cast<char>((word >> 8) & 0xFF));
    if (pad < 1) bytes->push_back(static_cast<char>(word & 0xFF));
  }
  return true;
}

std::vector<std::string> read_tiktoken_file(const std::string& path) {
  std::string content;
  try {
    content = read_whole_file(path);
  } catch (const std::runtime_error&) {
    throw std::runtime_error("cannot open tiktoken file " + path +
                             " (model.tokenizer_path; use \"\" for the byte-level tokenizer)");
  }

  std::vector<std::string> tokens;
  std::vector<int64_t> ranks;      // rank of tokens[i] as written in the file
  std::vector<size_t> line_of;     // 1-based line of tokens[i]
  std::unordered_map<std::string, size_t> seen_token;  // bytes -> line
  std::unordered_map<int64_t, size_t> seen_rank;       // rank -> line
  for_each_line(content, [&](std::string_view line, size_t line_number) {
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) return;

    size_t space = line.find(' ');
    if (space == std::string_view::npos || line.find(' ', space + 1) != std::string_view::npos) {
      fail_line(path, line_number, "expected exactly one space");
    }
    std::string bytes;
    if (!base64_decode(line.substr(0, space), &bytes)) {
      fail_line(path, line_number, "invalid base64 '" + std::string(line.substr(0, space)) + "'");
    }
    if (bytes.empty()) fail_line(path, line_number, "empty token");
    int64_t rank = 0;
    if (!parse_rank(line.substr(space + 1), &rank)) {
      fail_line(path, line_number,
                "rank '" + std::string(line.substr(space + 1)) + "' is not an integer 0..2^31-1");
    }
    if (auto it = seen_token.find(bytes); it != seen_token.end()) {
      fail_line(path, line_number, "token repeats the one on line " + std::to_string(it->second));
    }
    if (auto it = seen_rank.find(rank); it != seen_rank.end()) {
      fail_line(path, line_number,
                "rank " + std::to_string(rank) + " repeats line " + std::to_string(it->second));
    }
    seen_token.emplace(bytes, line_number);
    seen_rank.emplace(rank, line_number);
    tokens.push_back(std::move(bytes));
    ranks.push_back(rank);
    line_of.push_back(line_number);
  });
  if (tokens.empty()) throw std::runtime_error("tiktoken file " + path + " holds no tokens");

  // Ranks are unique; they cover 0..n-1 exactly when none is >= n.
  const int64_t n = static_cast<int64_t>(tokens.size());
  std::vector<std::string> by_rank(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (ranks[i] >= n) {
      fail_line(path, line_of[i],
                "rank " + std::to_string(ranks[i]) + " leaves a gap: " + std::to_string(n) +
                    " tokens need ranks 0.." + std::to_string(n - 1));
    }
    by_rank[ranks[i]] = std::move(tokens[i]);
  }
  return by_rank;
}

void write_tiktoken_file(const std::string& path, const std::vector<std::string>& tokens) {
  std::string text;
  for (size_t rank = 0; rank < tokens.size(); ++rank) text += base64_encode(tokens[rank]) + ' ' + std::to_string(rank) + '\n';
  util::write_file_atomic(path, text);  // whole or not at all, the error names `path`
}

}  // namespace titan::data
