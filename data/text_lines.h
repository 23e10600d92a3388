// data/text_lines.h — reading a text file whole and walking its lines, shared by the
// dataset readers and the tiktoken file reader.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace titan::data {

// The bytes of `path`; throws std::runtime_error "cannot open <path>" if it cannot be read.
std::string read_whole_file(const std::string& path);

// Calls fn(line, line_number) for every '\n'-separated line of `content` (1-based numbers, the
// '\n' removed; a last line without '\n' counts too).
template <typename Fn>
void for_each_line(std::string_view content, Fn&& fn) {
  size_t pos = 0;
  size_t line_number = 0;
  while (pos < content.size()) {
    size_t end = content.find('\n', pos);
    if (end == std::string_view::npos) end = content.size();
    fn(content.substr(pos, end - pos), ++line_number);
    pos = end + 1;
  }
}

}  // namespace titan::data
