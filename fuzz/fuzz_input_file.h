// fuzz/fuzz_input_file.h — the readers under fuzz take a path: each input is written to one
// per-process file (on /dev/shm when it exists, so an iteration costs no disk I/O) and read back.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace titan::fuzz {

inline const std::string& input_path(const char* target) {
  static const std::string path = [target] {
    const char* dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : (std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp");
    return std::string(dir) + "/titan_fuzz_" + target + "_" + std::to_string(getpid());
  }();
  return path;
}

// Writes `data` to input_path(target) and returns the path; aborts when it cannot (not a finding
// of the reader, so it must not look like one).
inline const std::string& write_input(const char* target, const uint8_t* data, size_t size) {
  const std::string& path = input_path(target);
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || (size > 0 && std::fwrite(data, 1, size, f) != size) || std::fclose(f) != 0) {
    std::perror(path.c_str());
    std::abort();
  }
  return path;
}

}  // namespace titan::fuzz
