// util/file_kind.h — what a path is, in words, for errors about inputs that must be regular
// files ("a FIFO", "a character device").
//
// Header-only and free of LibTorch: the config reader (trainer/config/toml_file.cpp) and the dataset
// readers (data/) refuse a FIFO (a read would block forever), a device such as
// /dev/zero (endless) or a directory by naming what the path is instead of "does not exist".
#pragma once

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace titan::util {

// "a regular file", "a directory", "a FIFO", "a character device", "a block device",
// "a socket", or "missing (<strerror>)"; symbolic links are followed.
inline std::string file_kind(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::string("missing (") + std::strerror(errno) + ")";
  if (S_ISREG(st.st_mode)) return "a regular file";
  if (S_ISDIR(st.st_mode)) return "a directory";
  if (S_ISFIFO(st.st_mode)) return "a FIFO";
  if (S_ISCHR(st.st_mode)) return "a character device";
  if (S_ISBLK(st.st_mode)) return "a block device";
  if (S_ISSOCK(st.st_mode)) return "a socket";
  return "not a regular file";
}

// True when `path` exists but is neither a regular file nor a directory (a FIFO, a device, a
// socket): inputs that look like files to a reader but never end or block it.
inline bool is_special_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode);
}

}  // namespace titan::util
