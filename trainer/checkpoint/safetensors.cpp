#include "trainer/checkpoint/safetensors.h"

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "trainer/checkpoint/safetensors_header.h"
#include "util/atomic_file.h"

namespace titan::trainer::checkpoint {
namespace {

const std::vector<std::pair<at::ScalarType, std::string>>& dtype_names() {
  static const std::vector<std::pair<at::ScalarType, std::string>> names = {
      {at::kFloat, "F32"},         {at::kBFloat16, "BF16"}, {at::kHalf, "F16"},
      {at::kDouble, "F64"},        {at::kLong, "I64"},      {at::kInt, "I32"},
      {at::kShort, "I16"},         {at::kChar, "I8"},       {at::kByte, "U8"},
      {at::kBool, "BOOL"},         {at::kFloat8_e4m3fn, "F8_E4M3"},
      {at::kFloat8_e5m2, "F8_E5M2"}};
  return names;
}

// Slice-by-8 tables of the reflected IEEE polynomial 0xEDB88320 (zlib's crc32).
const std::array<std::array<uint32_t, 256>, 8>& crc_tables() {
  static const auto tables = [] {
    std::array<std::array<uint32_t, 256>, 8> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i)
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
    return t;
  }();
  return tables;
}

struct Header {
  std::string json;  // padded to a multiple of 8 bytes
  std::vector<at::Tensor> data;
};

Header make_header(const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                   const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  Header h;
  int64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    at::Tensor t = tensor.detach().to(at::kCPU).contiguous();
    const int64_t bytes = static_cast<int64_t>(t.nbytes());
    header[name] = {{"dtype", safetensors_dtype_name(t.scalar_type())},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    h.data.push_back(std::move(t));
  }
  h.json = header.dump();
  h.json.append((8 - h.json.size() % 8) % 8, ' ');  // keep the data 8-byte aligned
  return h;
}

}  // namespace

std::string safetensors_dtype_name(at::ScalarType t) {
  for (const auto& [type, name] : dtype_names())
    if (type == t) return name;
  throw std::invalid_argument(std::string("safetensors: unsupported dtype ") + c10::toString(t));
}

at::ScalarType safetensors_dtype(const std::string& n, const std::string& where) {
  for (const auto& [type, name] : dtype_names())
    if (name == n) return type;
  throw std::runtime_error(where + ": unsupported dtype '" + n + "'");
}

uint32_t crc32_update(uint32_t crc, const void* data, size_t n) {
  const auto& t = crc_tables();
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  while (n >= 8) {  // little-endian hosts (x86-64, AArch64)
    uint32_t lo, hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= crc;
    crc = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^ t[4][lo >> 24] ^
          t[3][hi & 0xFF] ^ t[2][(hi >> 8) & 0xFF] ^ t[1][(hi >> 16) & 0xFF] ^ t[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n--) crc = t[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

namespace {
uint32_t gf2_times(const uint32_t* mat, uint32_t vec) {
  uint32_t sum = 0;
  for (; vec; vec >>= 1, ++mat)
    if (vec & 1) sum ^= *mat;
  return sum;
}
void gf2_square(uint32_t* square, const uint32_t* mat) {
  for (int n = 0; n < 32; ++n) square[n] = gf2_times(mat, mat[n]);
}
}  // namespace

// zlib's crc32_combine: appends len2 zero bytes to crc1 by squaring the CRC's shift operator
// (a 32x32 matrix over GF(2)), then xors crc2.
uint32_t crc32_combine(uint32_t crc1, uint32_t crc2, int64_t len2) {
  if (len2 <= 0) return crc1;
  uint32_t even[32], odd[32];
  odd[0] = 0xEDB88320u;
  for (int n = 1; n < 32; ++n) odd[n] = 1u << (n - 1);
  gf2_square(even, odd);  // 2 zero bits
  gf2_square(odd, even);  // 4 zero bits
  while (true) {
    gf2_square(even, odd);
    if (len2 & 1) crc1 = gf2_times(even, crc1);
    if ((len2 >>= 1) == 0) break;
    gf2_square(odd, even);
    if (len2 & 1) crc1 = gf2_times(odd, crc1);
    if ((len2 >>= 1) == 0) break;
  }
  return crc1 ^ crc2;
}

SafetensorsFileInfo write_safetensors_file(const std::string& path,
                                           const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                           const std::map<std::string, std::string>& metadata) {
  const Header h = make_header(tensors, metadata);
  const uint64_t header_len = h.json.size();
  // Whole or not at all, also inside a checkpoint's temporary folder: a shard that failed on a
  // full disk is removed, not left truncated (util/atomic_file.h).
  util::AtomicFile out(path);
  SafetensorsFileInfo info;
  out.write(&header_len, 8);  // x86/ARM hosts are little-endian
  out.write(h.json.data(), h.json.size());
  uint32_t crc = crc32_update(0, &header_len, 8);
  crc = crc32_update(crc, h.json.data(), h.json.size());
  for (size_t i = 0; i < h.data.size(); ++i) {
    const at::Tensor& t = h.data[i];
    out.write(t.data_ptr(), t.nbytes());
    // One pass over the data: the tensor's CRC, folded into the file's.
    const uint32_t tensor_crc = crc32_update(0, t.data_ptr(), t.nbytes());
    info.tensor_crc32[tensors[i].first] = tensor_crc;
    crc = crc32_combine(crc, tensor_crc, static_cast<int64_t>(t.nbytes()));
    info.bytes += static_cast<int64_t>(t.nbytes());
  }
  out.commit();
  info.crc32 = crc;
  info.bytes += 8 + static_cast<int64_t>(header_len);
  return info;
}

void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  write_safetensors_file(path, tensors, metadata);
}

std::map<std::string, SafetensorsEntry> read_safetensors_header(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open safetensors file '" + path + "'");
  in.seekg(0, std::ios::end);
  const int64_t file_size = in.tellg();
  in.seekg(0);
  uint64_t header_len = 0;  // little-endian on x86/ARM hosts
  if (file_size >= 8) in.read(reinterpret_cast<char*>(&header_len), 8);
  check_safetensors_header_length(header_len, file_size, path);
  std::string json(header_len, '\0');
  if (!in.read(json.data(), static_cast<std::streamsize>(header_len)))
    throw std::runtime_error("'" + path + "': reading the safetensors header failed");
  std::map<std::string, SafetensorsEntry> entries;
  for (auto& [name, h] : parse_safetensors_header(json, file_size, path))
    entries.emplace(name, SafetensorsEntry{safetensors_dtype(h.dtype, "'" + path + "'"), std::move(h.shape), h.begin, h.end});
  return entries;
}

std::map<std::string, at::Tensor> load_safetensors(const std::string& path) {
  const auto entries = read_safetensors_header(path);
  std::ifstream in(path, std::ios::binary);
  std::map<std::string, at::Tensor> tensors;
  for (const auto& [name, e] : entries) {
    at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(e.dtype));
    in.seekg(e.begin);
    in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
    if (!in) throw std::runtime_error("'" + path + "': tensor '" + name + "': file is truncated");
    tensors.emplace(name, std::move(t));
  }
  return tensors;
}

}  // namespace titan::trainer::checkpoint
