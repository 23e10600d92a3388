// tests/temp_dir.h — per-process scratch folders for tests.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

namespace titan::testing {

// <tmp>/titan_<name>_<pid>, empty and created: one per test and process, so parallel ctest runs
// and reruns never see each other's files. <tmp> is the process's own scratch root, removed when
// its cases pass (tests/catch_main.cpp, Note [One scratch folder per test process]).
inline std::filesystem::path fresh_temp_dir(const std::string& name) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("titan_" + name + "_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace titan::testing
