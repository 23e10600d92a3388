// trainer/safetensors.h — model weights in the safetensors format (Hugging Face, torchtitan's
// converters): 8-byte little-endian header length, a JSON header {name: {dtype, shape,
// data_offsets}, "__metadata__": {...}}, then the raw little-endian tensor bytes.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace titan::trainer {

// Writes `tensors` (in the given order) to `path` atomically: a temporary file is written,
// flushed and renamed, so a crash never leaves a half-written checkpoint under `path`.
void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Reads every tensor of `path` to the CPU. Errors name the file and what is wrong with it.
std::map<std::string, at::Tensor> load_safetensors(const std::string& path);

}  // namespace titan::trainer
