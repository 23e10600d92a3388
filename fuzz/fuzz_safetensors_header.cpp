// libFuzzer target: a whole safetensors file's bytes -> the header length check and the
// validating header parser (trainer/checkpoint/safetensors_header.h). Every input must either parse into
// entries that lie inside the file, in order and without overlap, or throw std::runtime_error.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string_view>

#include "trainer/checkpoint/safetensors_header.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace titan::trainer::checkpoint;
  const int64_t file_size = static_cast<int64_t>(size);
  uint64_t header_len = 0;
  if (size >= 8) std::memcpy(&header_len, data, 8);
  try {
    check_safetensors_header_length(header_len, file_size, "input");
    const std::string_view json(reinterpret_cast<const char*>(data) + 8, header_len);
    for (const auto& [name, e] : parse_safetensors_header(json, file_size, "input")) {
      // What the loader relies on: the bytes are inside the data section and match the shape.
      const int64_t data_start = 8 + static_cast<int64_t>(header_len);
      if (e.begin < data_start || e.begin > e.end || e.end > file_size ||
          e.end - e.begin != e.numel * safetensors_itemsize(e.dtype))
        std::abort();
    }
  } catch (const std::runtime_error&) {
  }
  return 0;
}
