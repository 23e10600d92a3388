// trainer/checkpoint/safetensors_header.h — the validating parser of a safetensors header, without
// LibTorch (so that fuzz/ can drive it with libFuzzer): dtype names, shapes and data offsets are
// checked here, before any tensor is allocated. trainer/checkpoint/safetensors.h maps the result to ATen.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace titan::trainer::checkpoint {

// The JSON header may be at most this long: safetensors' own limit (100 MB). A larger length
// field is a corrupt or hostile file, and would otherwise make the reader allocate it.
constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// The dtypes titan loads weights and checkpoint state from (every floating type a Llama weight
// is exported in); anything else (U8, BOOL, integers, float8) is refused by name.
const std::vector<std::string>& loadable_safetensors_dtypes();
// Bytes per element of a loadable dtype name; 0 for any other name.
int64_t safetensors_itemsize(std::string_view dtype);

struct SafetensorsHeaderEntry {
  std::string dtype;  // one of loadable_safetensors_dtypes()
  std::vector<int64_t> shape;
  int64_t numel = 0;
  int64_t begin = 0, end = 0;  // [begin, end), absolute offsets in the file
};

// Parses and validates the JSON header `json` of a safetensors file of `file_size` bytes whose
// data starts at byte 8 + json.size(). Throws std::runtime_error naming `path` (and the tensor)
// for: JSON that is not an object, a duplicate name, "__metadata__" that is not an object of
// strings, an entry that is not {dtype, shape, data_offsets}, a dtype titan cannot load (the
// error lists the ones it can), a shape entry that is not a non-negative integer, a shape whose
// element count or byte size overflows int64, data_offsets that are not two non-negative
// integers with begin <= end, a byte size that is not numel x itemsize, a tensor that ends past
// the end of the file, or two tensors whose bytes overlap.
std::map<std::string, SafetensorsHeaderEntry> parse_safetensors_header(std::string_view json, int64_t file_size,
                                                                        const std::string& path);

// Checks the 8-byte length field of a file of `file_size` bytes; returns the header's length.
// Throws naming `path` when the file is shorter than 8 bytes or the length is past the file's end
// or over kMaxSafetensorsHeaderBytes.
uint64_t check_safetensors_header_length(uint64_t header_len, int64_t file_size, const std::string& path);

}  // namespace titan::trainer::checkpoint
