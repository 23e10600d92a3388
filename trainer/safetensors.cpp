#include "trainer/safetensors.h"

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace titan::trainer {
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

std::string dtype_to_name(at::ScalarType t) {
  for (const auto& [type, name] : dtype_names())
    if (type == t) return name;
  throw std::invalid_argument(std::string("safetensors: unsupported dtype ") + c10::toString(t));
}

at::ScalarType name_to_dtype(const std::string& n, const std::string& path) {
  for (const auto& [type, name] : dtype_names())
    if (name == n) return type;
  throw std::runtime_error("safetensors file " + path + ": unsupported dtype '" + n + "'");
}

}  // namespace

void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<at::Tensor> contiguous;
  int64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    at::Tensor t = tensor.detach().to(at::kCPU).contiguous();
    const int64_t bytes = static_cast<int64_t>(t.nbytes());
    header[name] = {{"dtype", dtype_to_name(t.scalar_type())},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    contiguous.push_back(std::move(t));
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');  // keep the data 8-byte aligned
  const uint64_t header_len = json.size();

  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw std::runtime_error("cannot write safetensors file " + tmp);
    out.write(reinterpret_cast<const char*>(&header_len), 8);  // x86/ARM hosts are little-endian
    out.write(json.data(), static_cast<std::streamsize>(json.size()));
    for (const auto& t : contiguous)
      out.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      throw std::runtime_error("writing safetensors file " + tmp + " failed (disk full?)");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw std::runtime_error("cannot rename " + tmp + " to " + path + ": " + std::strerror(errno));
  }
}

std::map<std::string, at::Tensor> load_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open safetensors file '" + path + "'");
  in.seekg(0, std::ios::end);
  const int64_t file_size = in.tellg();
  in.seekg(0);
  uint64_t header_len = 0;
  if (file_size < 8 || !in.read(reinterpret_cast<char*>(&header_len), 8) ||
      static_cast<int64_t>(header_len) > file_size - 8)
    throw std::runtime_error("'" + path + "' is not a safetensors file (bad header length)");
  std::string json(header_len, '\0');
  in.read(json.data(), static_cast<std::streamsize>(header_len));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(json);
  } catch (const std::exception& e) {
    throw std::runtime_error("'" + path + "': safetensors header is not valid JSON: " + e.what());
  }
  const int64_t data_start = 8 + static_cast<int64_t>(header_len);
  std::map<std::string, at::Tensor> tensors;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    try {
      const at::ScalarType dtype = name_to_dtype(entry.at("dtype").get<std::string>(), path);
      const auto shape = entry.at("shape").get<std::vector<int64_t>>();
      const auto offsets = entry.at("data_offsets").get<std::vector<int64_t>>();
      at::Tensor t = at::empty(shape, at::TensorOptions().dtype(dtype));
      if (offsets.size() != 2 || offsets[1] - offsets[0] != static_cast<int64_t>(t.nbytes()) ||
          data_start + offsets[1] > file_size)
        throw std::runtime_error("data_offsets do not match its shape/dtype or the file size");
      in.seekg(data_start + offsets[0]);
      in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
      if (!in) throw std::runtime_error("file is truncated");
      tensors.emplace(name, std::move(t));
    } catch (const nlohmann::json::exception& e) {
      throw std::runtime_error("'" + path + "': tensor '" + name + "' has a malformed entry: " + e.what());
    } catch (const std::runtime_error& e) {
      throw std::runtime_error("'" + path + "': tensor '" + name + "': " + e.what());
    }
  }
  return tensors;
}

}  // namespace titan::trainer
