// util/read_file.h — reading an input file whole, safely: the one reader for the files a user
// names (the config file, a pipeline schedule CSV).
//
// Only a regular file is read (a FIFO would block forever, /dev/zero never ends, a directory is a
// mistake); it is opened with O_NONBLOCK and checked again with fstat, so a path that turns into a
// FIFO between the checks cannot block; st_size is not trusted (files under /proc report 0): the
// file is read to its end, stopping one byte past `max_bytes`. Header-only, LibTorch-free.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

#include "util/file_kind.h"

namespace titan::util {

// Why a read failed; what() says it for `path` in general words, callers may word it their way
// (`reason`: the system's words for kIo, e.g. "Input/output error").
class ReadFileError : public std::runtime_error {
 public:
  enum class Problem { kMissing, kDirectory, kNotRegular, kTooLarge, kIo };
  ReadFileError(Problem problem, const std::string& message, std::string reason = "")
      : std::runtime_error(message), problem(problem), reason(std::move(reason)) {}
  Problem problem;
  std::string reason;
};

inline std::string read_regular_file(const std::string& path, size_t max_bytes) {
  using Problem = ReadFileError::Problem;
  const std::string name = "'" + path + "'";
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) throw ReadFileError(Problem::kMissing, name + " does not exist");
    const std::string reason = std::strerror(errno);
    throw ReadFileError(Problem::kIo, name + " cannot be read: " + reason, reason);
  }
  if (S_ISDIR(st.st_mode)) throw ReadFileError(Problem::kDirectory, name + " is a directory");
  if (!S_ISREG(st.st_mode))
    throw ReadFileError(Problem::kNotRegular, name + " is " + file_kind(path) + ", not a regular file");
  struct Fd {
    int fd;
    ~Fd() {
      if (fd >= 0) ::close(fd);
    }
  } file{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)};
  if (file.fd < 0) {
    const std::string reason = std::strerror(errno);
    throw ReadFileError(Problem::kIo, "cannot open " + name + ": " + reason, reason);
  }
  if (::fstat(file.fd, &st) != 0 || !S_ISREG(st.st_mode))
    throw ReadFileError(Problem::kNotRegular, name + " is not a regular file");
  std::string text;
  char buffer[1 << 16];
  while (true) {
    const ssize_t n = ::read(file.fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const std::string reason = std::strerror(errno);
      throw ReadFileError(Problem::kIo, "cannot read " + name + ": " + reason, reason);
    }
    if (n == 0) break;
    text.append(buffer, static_cast<size_t>(n));
    if (text.size() > max_bytes)
      throw ReadFileError(Problem::kTooLarge, name + " is larger than " + std::to_string(max_bytes) + " bytes");
  }
  return text;
}

}  // namespace titan::util
