// trainer/checkpoint/safetensors.h — tensors in the safetensors format (Hugging Face, torchtitan's
// converters, titan's checkpoint shards): 8-byte little-endian header length, a JSON header
// {name: {dtype, shape, data_offsets}, "__metadata__": {...}}, then the raw little-endian,
// row-major tensor bytes (data_offsets are relative to the end of the header).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace titan::trainer::checkpoint {

// Writes `tensors` (in the given order) to `path` whole or not at all (util/atomic_file.h): a
// temporary file is written, fsync'd and renamed; a failure removes it and names `path`.
void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Reads every tensor of `path` to the CPU. Errors name the file and what is wrong with it.
std::map<std::string, at::Tensor> load_safetensors(const std::string& path);

// What one written file holds, for a checkpoint manifest: its size, the CRC-32 of the whole
// file and of each tensor's bytes (zlib's crc32, so `zlib.crc32(open(f,'rb').read())` agrees).
struct SafetensorsFileInfo {
  int64_t bytes = 0;
  uint32_t crc32 = 0;
  std::map<std::string, uint32_t> tensor_crc32;
};

// save_safetensors that also returns what the file holds (for a checkpoint manifest). Throws
// naming the file and the errno text on any write error (disk full); nothing is left behind.
SafetensorsFileInfo write_safetensors_file(const std::string& path,
                                           const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                           const std::map<std::string, std::string>& metadata = {});

// One tensor of a file's header: where its bytes are, as absolute file offsets.
struct SafetensorsEntry {
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
  int64_t begin = 0, end = 0;  // [begin, end) in the file
};
// Parses the header of `path` only (no tensor data is read); checks every entry lies inside the
// file and matches its shape and dtype. Errors name the file (and the tensor).
std::map<std::string, SafetensorsEntry> read_safetensors_header(const std::string& path);

// "F32", "BF16", ... <-> ATen dtypes (the safetensors spelling).
std::string safetensors_dtype_name(at::ScalarType dtype);
at::ScalarType safetensors_dtype(const std::string& name, const std::string& where);

// CRC-32 (IEEE, zlib's): crc32_update(0, data, n) of "123456789" is 0xCBF43926.
uint32_t crc32_update(uint32_t crc, const void* data, size_t n);
// The CRC-32 of A followed by B from crc(A), crc(B) and B's length (zlib's crc32_combine).
uint32_t crc32_combine(uint32_t crc_a, uint32_t crc_b, int64_t length_b);

}  // namespace titan::trainer::checkpoint
