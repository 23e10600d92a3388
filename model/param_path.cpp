// model/param_path.cpp — see param_path.h.
#include "model/param_path.h"

namespace titan::model {
namespace {
constexpr std::string_view kLayers = "layers.";
constexpr size_t kMaxIndexDigits = 9;
}  // namespace

std::string layer_path(int64_t layer, std::string_view rest, std::string_view prefix) {
  std::string path(prefix);
  path += std::to_string(layer);
  if (!rest.empty()) (path += '.') += rest;
  return path;
}

std::optional<LayerPath> parse_layer_path(std::string_view path, std::string_view prefix) {
  if (path.substr(0, prefix.size()) != prefix) return std::nullopt;
  const std::string_view tail = path.substr(prefix.size());
  size_t digits = 0;
  while (digits < tail.size() && tail[digits] >= '0' && tail[digits] <= '9') ++digits;
  if (digits == 0 || digits > kMaxIndexDigits) return std::nullopt;
  LayerPath parsed;
  for (size_t i = 0; i < digits; ++i) parsed.layer = parsed.layer * 10 + (tail[i] - '0');
  if (digits == tail.size()) return parsed;
  if (tail[digits] != '.' || digits + 1 == tail.size()) return std::nullopt;
  parsed.rest = std::string(tail.substr(digits + 1));
  return parsed;
}

std::string layer_pattern(std::string_view path, std::string_view index_mark) {
  const std::string_view prefix = parse_layer_path(path, kMtpLayersPrefix) ? kMtpLayersPrefix : kLayers;
  const std::optional<LayerPath> parsed = parse_layer_path(path, prefix);
  if (!parsed) return std::string(path);
  std::string pattern(prefix);
  pattern += index_mark;
  if (!parsed->rest.empty()) (pattern += '.') += parsed->rest;
  return pattern;
}

std::string top_module(std::string_view path) {
  if (const std::optional<LayerPath> parsed = parse_layer_path(path)) return layer_path(parsed->layer);
  if (const std::optional<LayerPath> parsed = parse_layer_path(path, kMtpLayersPrefix))
    return layer_path(parsed->layer, {}, kMtpLayersPrefix);
  return std::string(path.substr(0, path.find('.')));
}

}  // namespace titan::model
