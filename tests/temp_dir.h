// tests/temp_dir.h — per-process scratch folders for tests.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

namespace titan::testing {

// <tmp>/titan_<name>_<pid>, empty and created: one per test and process, so parallel ctest runs
// and reruns never see each other's files.
inline std::filesystem::path fresh_temp_dir(const std::string& name) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("titan_" + name + "_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// A fresh_temp_dir whose checkpoint shards (*.safetensors, the bulk) are deleted when it is
// destroyed (a function-local static: at process exit); logs, metrics and manifests stay for
// diagnosis.
struct ScratchWithShards {
  std::filesystem::path dir;
  explicit ScratchWithShards(const std::string& name) : dir(fresh_temp_dir(name)) {}
  ~ScratchWithShards() {
    namespace fs = std::filesystem;
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(dir, ec); it != fs::recursive_directory_iterator(); it.increment(ec))
      if (it->path().extension() == ".safetensors") fs::remove(it->path(), ec);
  }
};

}  // namespace titan::testing
