#include "trainer/checkpoint/safetensors_header.h"

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>

namespace titan::trainer::checkpoint {
namespace {

constexpr std::pair<const char*, int64_t> kLoadable[] = {{"F32", 4}, {"BF16", 2}, {"F16", 2}, {"F64", 8}};

std::string loadable_list() {
  std::string s;
  for (const auto& name : loadable_safetensors_dtypes()) s += (s.empty() ? "" : ", ") + name;
  return s;
}

// A non-negative integer that fits int64 (nlohmann keeps those as unsigned; a negative number
// is signed, a fraction or an integer past uint64 is a float).
bool as_index(const nlohmann::json& v, int64_t* out) {
  if (!v.is_number_unsigned()) return false;
  const uint64_t u = v.get<uint64_t>();
  if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
  *out = static_cast<int64_t>(u);
  return true;
}

SafetensorsHeaderEntry parse_entry(const nlohmann::json& entry, int64_t data_bytes) {
  if (!entry.is_object()) throw std::runtime_error("entry is " + std::string(entry.type_name()) + ", not an object");
  for (const auto& [key, value] : entry.items())
    if (key != "dtype" && key != "shape" && key != "data_offsets")
      throw std::runtime_error("unknown field '" + key + "' (an entry holds dtype, shape, data_offsets)");
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!entry.contains(key)) throw std::runtime_error(std::string("no '") + key + "' field");
  SafetensorsHeaderEntry e;
  const auto& dtype = entry["dtype"];
  if (!dtype.is_string()) throw std::runtime_error("dtype is not a string");
  e.dtype = dtype.get<std::string>();
  const int64_t itemsize = safetensors_itemsize(e.dtype);
  if (itemsize == 0)
    throw std::runtime_error("dtype '" + e.dtype + "' cannot be loaded (titan loads " + loadable_list() + ")");
  const auto& shape = entry["shape"];
  if (!shape.is_array()) throw std::runtime_error("shape is not an array");
  e.numel = 1;
  for (const auto& d : shape) {
    int64_t n = 0;
    if (!as_index(d, &n)) throw std::runtime_error("shape " + shape.dump() + " has " + d.dump() + ", not a non-negative integer");
    if (__builtin_mul_overflow(e.numel, n, &e.numel))
      throw std::runtime_error("shape " + shape.dump() + " has more elements than fit in 64 bits");
    e.shape.push_back(n);
  }
  int64_t bytes = 0;
  if (__builtin_mul_overflow(e.numel, itemsize, &bytes))
    throw std::runtime_error("shape " + shape.dump() + " of " + e.dtype + " is more bytes than fit in 64 bits");
  const auto& offsets = entry["data_offsets"];
  int64_t begin = 0, end = 0;
  if (!offsets.is_array() || offsets.size() != 2 || !as_index(offsets[0], &begin) || !as_index(offsets[1], &end))
    throw std::runtime_error("data_offsets " + offsets.dump() + " are not two non-negative integers [begin, end]");
  if (begin > end) throw std::runtime_error("data_offsets " + offsets.dump() + " begin after they end");
  if (end - begin != bytes)
    throw std::runtime_error("data_offsets " + offsets.dump() + " hold " + std::to_string(end - begin) +
                             " bytes, but shape " + shape.dump() + " of " + e.dtype + " is " + std::to_string(bytes));
  if (end > data_bytes)
    throw std::runtime_error("data_offsets " + offsets.dump() + " end past the file's " + std::to_string(data_bytes) +
                             " data bytes (truncated?)");
  e.begin = begin;  // relative for now; made absolute by the caller
  e.end = end;
  return e;
}

}  // namespace

const std::vector<std::string>& loadable_safetensors_dtypes() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& [name, size] : kLoadable) v.emplace_back(name);
    return v;
  }();
  return names;
}

int64_t safetensors_itemsize(std::string_view dtype) {
  for (const auto& [name, size] : kLoadable)
    if (dtype == name) return size;
  return 0;
}

uint64_t check_safetensors_header_length(uint64_t header_len, int64_t file_size, const std::string& path) {
  if (file_size < 8) throw std::runtime_error("'" + path + "' is not a safetensors file (shorter than 8 bytes)");
  if (header_len > kMaxSafetensorsHeaderBytes)
    throw std::runtime_error("'" + path + "' is not a safetensors file: its header length " + std::to_string(header_len) +
                             " is over the format's limit of " + std::to_string(kMaxSafetensorsHeaderBytes) + " bytes");
  if (header_len > static_cast<uint64_t>(file_size - 8))
    throw std::runtime_error("'" + path + "' is not a safetensors file: its header length " + std::to_string(header_len) +
                             " is past the end of the file (" + std::to_string(file_size) + " bytes; truncated?)");
  return header_len;
}

std::map<std::string, SafetensorsHeaderEntry> parse_safetensors_header(std::string_view json, int64_t file_size,
                                                                        const std::string& path) {
  const std::string where = "'" + path + "': ";
  // nlohmann keeps the last of two equal names silently; a safetensors file with one name twice
  // is corrupt, so the names are collected as the parser meets them.
  std::set<std::string> seen;
  std::string duplicate;
  auto callback = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    if (depth == 1 && event == nlohmann::json::parse_event_t::key && duplicate.empty() &&
        !seen.insert(parsed.get<std::string>()).second)
      duplicate = parsed.get<std::string>();
    return true;
  };
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(json.begin(), json.end(), callback);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(where + "safetensors header is not valid JSON: " + e.what());
  }
  if (!header.is_object())
    throw std::runtime_error(where + "safetensors header is " + std::string(header.type_name()) + ", not a JSON object");
  if (!duplicate.empty()) throw std::runtime_error(where + "safetensors header names '" + duplicate + "' twice");
  const int64_t data_start = 8 + static_cast<int64_t>(json.size());
  const int64_t data_bytes = file_size - data_start;
  std::map<std::string, SafetensorsHeaderEntry> entries;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) throw std::runtime_error(where + "__metadata__ is not an object");
      for (const auto& [key, value] : entry.items())
        if (!value.is_string()) throw std::runtime_error(where + "__metadata__ '" + key + "' is not a string");
      continue;
    }
    try {
      SafetensorsHeaderEntry e = parse_entry(entry, data_bytes);
      e.begin += data_start;
      e.end += data_start;
      entries.emplace(name, std::move(e));
    } catch (const std::runtime_error& e) {
      throw std::runtime_error(where + "tensor '" + name + "': " + e.what());
    }
  }
  // Overlapping bytes would make two tensors alias one another's data: sorted by begin, each
  // must start at or after the previous one's end (empty tensors overlap nothing).
  std::vector<std::pair<int64_t, const std::string*>> order;
  for (const auto& [name, e] : entries)
    if (e.end > e.begin) order.emplace_back(e.begin, &name);
  std::sort(order.begin(), order.end());
  for (size_t i = 1; i < order.size(); ++i) {
    const auto& prev = entries.at(*order[i - 1].second);
    if (order[i].first < prev.end)
      throw std::runtime_error(where + "tensors '" + *order[i - 1].second + "' and '" + *order[i].second +
                               "' overlap (bytes " + std::to_string(order[i].first - data_start) + " to " +
                               std::to_string(prev.end - data_start) + " of the data)");
  }
  return entries;
}

}  // namespace titan::trainer::checkpoint
