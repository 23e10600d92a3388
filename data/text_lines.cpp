#include "data/text_lines.h"

#include <fstream>
#include <sstream>
#include <stdexcept>

namespace titan::data {

std::string read_whole_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

}  // namespace titan::data
