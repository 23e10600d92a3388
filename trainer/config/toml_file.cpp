// trainer/config/toml_file.cpp — reading a config file within the limits of Note [Config file
// limits] (trainer/config/toml_file.h).
#include "trainer/config/toml_file.h"

#include <algorithm>
#include <filesystem>
#include <vector>

#include "trainer/config/job_config.h"
#include "util/file_kind.h"
#include "util/read_file.h"

namespace titan::trainer::config {

namespace {

std::string quoted(const std::string& path) { return "config file '" + path + "'"; }

}  // namespace

std::string read_config_file_text(const std::string& path) {
  using Problem = util::ReadFileError::Problem;
  try {
    return util::read_regular_file(path, kMaxConfigFileBytes);
  } catch (const util::ReadFileError& e) {
    switch (e.problem) {
      case Problem::kMissing: {
        std::string msg = quoted(path) + " (from --job.config_file) does not exist";
        std::error_code ec;
        if (std::filesystem::path(path).is_relative())
          msg += "; relative paths start at the current directory " + std::filesystem::current_path(ec).string();
        throw ConfigError(msg);
      }
      case Problem::kDirectory: throw ConfigError(quoted(path) + " is a directory; give a .toml file");
      case Problem::kNotRegular:
        throw ConfigError(quoted(path) + " is " + util::file_kind(path) + ", not a regular file; give a .toml file");
      case Problem::kTooLarge:
        throw ConfigError(quoted(path) + " is larger than " + std::to_string(kMaxConfigFileBytes >> 20) +
                          " MiB, the limit for a config file (real configs are a few KiB)");
      case Problem::kIo: break;
    }
    throw ConfigError("cannot read " + quoted(path) + ": " + e.reason);
  }
}

// A small TOML lexer that follows only what nests: table headers, keys (bare, quoted, dotted),
// '=' and inline arrays/tables; strings and comments are skipped so that their dots and brackets
// do not count. A header is as deep as its components; a key as its table plus its components;
// an inline table or array as the key it is the value of, or one deeper than its array.
size_t toml_nesting_depth(const std::string& text) {
  size_t max_depth = 0, header_depth = 0, key_dots = 0, value_base = 0;
  struct Level {
    char kind;  // '{' or '['
    size_t depth;
  };
  std::vector<Level> open;
  bool key_pos = true, in_header = false;
  auto note = [&](size_t d) { max_depth = std::max(max_depth, d); };
  auto base = [&] { return open.empty() ? header_depth : open.back().depth; };
  const size_t n = text.size();
  for (size_t i = 0; i < n; ++i) {
    const char c = text[i];
    if (c == '#') {  // a comment runs to the end of the line
      while (i < n && text[i] != '\n') ++i;
      if (i == n) break;
    }
    if (c == '"' || c == '\'') {
      const bool triple = i + 2 < n && text[i + 1] == c && text[i + 2] == c;
      const std::string close(triple ? 3 : 1, c);
      size_t j = i + (triple ? 3 : 1);
      while (j < n) {
        if (c == '"' && text[j] == '\\') {
          j += 2;
          continue;
        }
        if (!triple && text[j] == '\n') break;  // unterminated: toml++ reports it
        if (text.compare(j, close.size(), close) == 0) break;
        ++j;
      }
      i = std::min(n, j + close.size()) - 1;
      continue;
    }
    switch (text[i]) {
      case '\n':
        if (open.empty()) key_pos = true, key_dots = 0, in_header = false;
        break;
      case '.':
        if (in_header) note(++key_dots + 1);
        else if (key_pos) note(base() + ++key_dots + 1);
        break;
      case '=':
        if (key_pos) {
          value_base = base() + key_dots + 1;
          note(value_base);
          key_pos = false, key_dots = 0;
        }
        break;
      case '[':
        if (key_pos && open.empty()) {  // a [table] or [[array of tables]] header
          in_header = true, key_pos = false, key_dots = 0;
          if (i + 1 < n && text[i + 1] == '[') ++i;
          break;
        }
        [[fallthrough]];
      case '{': {
        // A key's value is as deep as the key; an array's element one deeper than the array.
        const size_t d = open.empty() || open.back().kind == '{' ? value_base : open.back().depth + 1;
        open.push_back({text[i], d});
        note(d);
        if (text[i] == '{') key_pos = true, key_dots = 0;
        break;
      }
      case ']':
        if (in_header) {
          header_depth = key_dots + 1;
          note(header_depth);
          in_header = false, key_dots = 0;
          if (i + 1 < n && text[i + 1] == ']') ++i;
          break;
        }
        [[fallthrough]];
      case '}':
        if (!open.empty()) open.pop_back();
        key_pos = false;
        break;
      case ',':
        if (!open.empty() && open.back().kind == '{') key_pos = true, key_dots = 0;
        break;
      default:
        break;
    }
  }
  return max_depth;
}

}  // namespace titan::trainer::config
