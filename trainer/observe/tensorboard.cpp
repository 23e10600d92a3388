#include "trainer/observe/tensorboard.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "util/atomic_file.h"

namespace titan::trainer::observe {
namespace {

// ---- protobuf wire format, the few field kinds an Event needs ----
void put_varint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}
void put_tag(int field, int wire_type, std::string* out) { put_varint(field << 3 | wire_type, out); }
template <class T>
void put_fixed(T v, std::string* out) {  // little-endian, as x86 and protobuf
  char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));
  out->append(bytes, sizeof(T));
}
void put_bytes(int field, std::string_view bytes, std::string* out) {
  put_tag(field, 2, out);
  put_varint(bytes.size(), out);
  out->append(bytes);
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Event{wall_time = 1, step = 2, file_version = 3 | summary = 5}.
std::string event(double wall_time, int64_t step) {
  std::string e;
  put_tag(1, 1, &e);
  put_fixed(wall_time, &e);
  if (step != 0) {
    put_tag(2, 0, &e);
    put_varint(static_cast<uint64_t>(step), &e);
  }
  return e;
}

uint32_t masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

}  // namespace

uint32_t crc32c(std::string_view bytes) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char b : bytes) crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  path_ = (std::filesystem::path(dir) /
           ("events.out.tfevents." + std::to_string(static_cast<int64_t>(now_seconds())) + "." +
            host + "." + std::to_string(getpid())))
              .string();
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    throw std::runtime_error("cannot create TensorBoard event file " + path_ + ": " +
                             std::strerror(errno) + " (metrics.save_tb_folder)");
  }
  std::string first = event(now_seconds(), 0);
  put_bytes(3, "brain.Event:2", &first);
  write_record(first);
  flush();
}

TensorBoardWriter::~TensorBoardWriter() {
  if (fd_ < 0) return;
  ::fsync(fd_);  // best effort: a destructor cannot report, and every record is already whole
  ::close(fd_);
}

void TensorBoardWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  std::string value_msg;
  put_bytes(1, tag, &value_msg);
  put_tag(2, 5, &value_msg);
  put_fixed(static_cast<float>(value), &value_msg);
  std::string summary;
  put_bytes(1, value_msg, &summary);
  std::string e = event(now_seconds(), step);
  put_bytes(5, summary, &e);
  write_record(e);
}

void TensorBoardWriter::write_record(const std::string& data) {
  std::string header;
  put_fixed(static_cast<uint64_t>(data.size()), &header);
  const uint32_t header_crc = masked(crc32c(header));
  put_fixed(header_crc, &header);
  std::string footer;
  put_fixed(masked(crc32c(data)), &footer);
  // The record whole or not at all: a cut record would make TensorBoard's reader stop there and
  // misread every record after it.
  util::append_whole_record(fd_, header + data + footer, path_);
}

void TensorBoardWriter::flush() {
  if (::fsync(fd_) != 0)
    throw std::runtime_error("cannot fsync TensorBoard event file '" + path_ + "': " + std::strerror(errno));
}

}  // namespace titan::trainer::observe
