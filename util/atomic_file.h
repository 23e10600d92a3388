// util/atomic_file.h — the one way titan writes a whole file: nothing half-written ever appears
// under the final name, and a failed write leaves nothing behind.
//
//   write_file_atomic(path, bytes);                 // bytes already in memory
//   AtomicFile f(path); f.write(a); f.write(b); f.commit();   // streamed
//   write_file_atomic_via(path, [](const std::string& tmp) { library.save(tmp); });
//
// Protocol: create `<path>.tmp.<pid>.<n>` (O_EXCL, same directory, so the rename cannot cross a
// file system), write it completely (short writes and EINTR retried), fsync it, rename it onto
// `path`, fsync the directory (so the rename itself survives a power cut). On ANY failure (open,
// write, fsync, rename, an exception from the caller's writer, a destructor before commit) the
// temporary file is removed and a std::runtime_error names the FINAL path, the step and the
// errno text ("cannot write '/x/final.safetensors': No space left on device").
//
// Note [Temp files and signals]: a process killed by a signal runs no destructor. titan's stop
// handlers (trainer/signals.cpp) exit on a second SIGINT/SIGTERM, possibly in the middle of a
// long write (an 8B HF export). Blocking the signal for the whole write would make "press Ctrl-C
// twice to get out now" wait minutes, so instead every temporary file in flight is registered
// in a fixed table of plain char arrays, and `remove_temp_files_in_flight()`, which only reads
// that table and calls unlink(2) (async-signal-safe per POSIX), is called by the handler before
// _exit. A SIGKILL or power cut can still leave a `*.tmp.<pid>.<n>` file; its name says what it
// is and it never shadows the final file.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace titan::util {

inline std::string errno_text(int err) { return std::strerror(err); }

namespace detail {
// One registered temporary path. state: 0 free, 1 being filled, 2 registered.
struct TempFileSlot {
  std::atomic<int> state{0};
  char path[4096] = {};
};
inline constexpr int kTempFileSlots = 32;
inline TempFileSlot g_temp_file_slots[kTempFileSlots];
inline std::atomic<unsigned> g_temp_file_counter{0};

// Returns the slot index, or -1 when the table is full or the path too long (then only the
// destructor cleans up: correct, just not signal-proof).
inline int register_temp_file(const std::string& path) {
  if (path.size() >= sizeof(TempFileSlot::path)) return -1;
  for (int i = 0; i < kTempFileSlots; ++i) {
    int expected = 0;
    if (g_temp_file_slots[i].state.compare_exchange_strong(expected, 1)) {
      std::memcpy(g_temp_file_slots[i].path, path.c_str(), path.size() + 1);
      g_temp_file_slots[i].state.store(2);
      return i;
    }
  }
  return -1;
}
inline void unregister_temp_file(int slot) {
  if (slot >= 0) g_temp_file_slots[slot].state.store(0);
}
}  // namespace detail

// Removes every registered temporary file. Async-signal-safe: reads the fixed table, calls
// unlink(2) only. For signal handlers that are about to _exit (Note [Temp files and signals]).
inline void remove_temp_files_in_flight() noexcept {
  for (auto& slot : detail::g_temp_file_slots)
    if (slot.state.load() == 2) ::unlink(slot.path);
}

class AtomicFile {
 public:
  explicit AtomicFile(std::string path) : path_(std::move(path)) {
    const unsigned n = detail::g_temp_file_counter.fetch_add(1);
    temp_path_ = path_ + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(n);
    slot_ = detail::register_temp_file(temp_path_);
    fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      const int err = errno;
      detail::unregister_temp_file(slot_);
      throw std::runtime_error("cannot create '" + path_ + "' (temporary '" + temp_path_ +
                               "'): " + errno_text(err));
    }
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile() { abandon(); }

  const std::string& path() const { return path_; }
  // Where the bytes go until commit(); for writers that only take a path (see write_file_atomic_via).
  const std::string& temp_path() const { return temp_path_; }

  // Writes all n bytes (retrying short writes and EINTR); on failure removes the temporary file
  // and throws naming path() and the errno text.
  void write(const void* data, size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t written = ::write(fd_, p, n);
      if (written < 0 && errno == EINTR) continue;
      // 0 bytes for a nonzero request: no progress possible (treated as a full disk).
      if (written <= 0) fail("cannot write", written < 0 ? errno : ENOSPC);
      p += written;
      n -= static_cast<size_t>(written);
    }
  }
  void write(std::string_view bytes) { write(bytes.data(), bytes.size()); }

  // fsync, close, rename onto path(), fsync the directory. After it returns the file is whole
  // under path() and durable.
  void commit() {
    if (committed_) return;
    int sync_fd = fd_;
    if (written_by_path_) {
      // Another writer may have replaced the inode (write elsewhere + rename): sync the file now
      // under the temporary name.
      sync_fd = ::open(temp_path_.c_str(), O_RDONLY | O_CLOEXEC);
      if (sync_fd < 0) fail("cannot reopen the written file of", errno);
    }
    if (::fsync(sync_fd) != 0) {
      const int err = errno;
      if (sync_fd != fd_) ::close(sync_fd);
      fail("cannot fsync", err);
    }
    if (sync_fd != fd_) ::close(sync_fd);
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail("cannot close", errno);
    if (std::rename(temp_path_.c_str(), path_.c_str()) != 0) fail("cannot rename the temporary file onto", errno);
    committed_ = true;
    detail::unregister_temp_file(slot_);
    slot_ = -1;
    sync_directory();
  }

  // For write_file_atomic_via: the caller's writer opened temp_path() itself.
  void mark_written_by_path() { written_by_path_ = true; }

 private:
  [[noreturn]] void fail(const char* what, int err) {
    abandon();
    throw std::runtime_error(std::string(what) + " '" + path_ + "': " + errno_text(err));
  }
  void abandon() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    if (!committed_) ::unlink(temp_path_.c_str());
    detail::unregister_temp_file(slot_);
    slot_ = -1;
  }
  void sync_directory() {
    const size_t slash = path_.find_last_of('/');
    const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path_.substr(0, slash));
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) throw std::runtime_error("cannot open the folder of '" + path_ + "' to fsync it: " + errno_text(errno));
    const int rc = ::fsync(dfd);
    const int err = errno;
    ::close(dfd);
    if (rc != 0) throw std::runtime_error("cannot fsync the folder of '" + path_ + "': " + errno_text(err));
  }

  std::string path_;
  std::string temp_path_;
  int fd_ = -1;
  int slot_ = -1;
  bool committed_ = false;
  bool written_by_path_ = false;
};

// Writes `bytes` to `path` atomically (the protocol above).
inline void write_file_atomic(const std::string& path, std::string_view bytes) {
  AtomicFile file(path);
  file.write(bytes);
  file.commit();
}

// For a library that writes only to a path it is given: `write_to(temp_path)` writes the file,
// and throws if it knows it failed; `check(temp_path)` (optional) returns an empty string when
// the written file is whole, else what is wrong, for writers that swallow their errors. Then
// fsync + rename as above; any failure removes the temporary file and throws naming `path`.
inline void write_file_atomic_via(const std::string& path,
                                  const std::function<void(const std::string& temp_path)>& write_to,
                                  const std::function<std::string(const std::string& temp_path)>& check = {}) {
  AtomicFile file(path);
  file.mark_written_by_path();
  write_to(file.temp_path());  // an exception here: ~AtomicFile removes the temporary file
  struct stat st {};
  if (::stat(file.temp_path().c_str(), &st) != 0)
    throw std::runtime_error("cannot write '" + path + "': the writer left no file (" + errno_text(errno) + ")");
  if (check) {
    const std::string problem = check(file.temp_path());
    if (!problem.empty()) throw std::runtime_error("cannot write '" + path + "': " + problem);
  }
  file.commit();
}

// For files that grow record by record (metrics.jsonl, TensorBoard event files), where a whole-
// file rewrite per step is too much: appends `bytes` (one whole record) to `fd`, opened with
// O_APPEND by its single writer, so that the record is there whole or not at all. A short write
// (the disk filled mid-record) is retried for the rest; if that fails too, the file is truncated
// back to its size before the record and the error names `path` and the errno text. So a reader
// never sees a cut line, and the next record starts at a record boundary.
inline void append_whole_record(int fd, std::string_view bytes, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw std::runtime_error("cannot append to '" + path + "': " + errno_text(errno));
  const off_t size_before = st.st_size;
  const char* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    const ssize_t written = ::write(fd, p, left);
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) {
      const int err = written < 0 ? errno : ENOSPC;
      if (left != bytes.size() && ::ftruncate(fd, size_before) != 0)
        throw std::runtime_error("cannot append to '" + path + "': " + errno_text(err) +
                                 ", and cutting the partial record off failed: " + errno_text(errno));
      throw std::runtime_error("cannot append to '" + path + "': " + errno_text(err));
    }
    p += written;
    left -= static_cast<size_t>(written);
  }
}

}  // namespace titan::util
