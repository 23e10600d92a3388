// trainer/observe/tensorboard.h — TensorBoard event files (metrics.enable_tensorboard), written directly:
// no C++ TensorBoard writer is packaged in Debian or PyPI, and the format is small.
//
// An event file is a sequence of records, each
//   uint64 length (little-endian) | uint32 masked_crc32c(length bytes) | data | uint32 masked_crc32c(data)
// where data is a protobuf-encoded tensorflow.Event and masked_crc32c(x) = rotr15(crc32c(x)) +
// 0xa282ead8. The first event carries file_version "brain.Event:2"; each scalar is an Event with
// wall_time (field 1, double), step (2, int64) and summary (5) = Summary{value (1) =
// Value{tag (1, string), simple_value (2, float)}}. The file is named
// events.out.tfevents.<seconds>.<host>.<pid>, which TensorBoard's loader looks for.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace titan::trainer::observe {

// CRC-32C (Castagnoli), the checksum of TFRecord framing.
uint32_t crc32c(std::string_view bytes);

class TensorBoardWriter {
 public:
  // Creates `dir` (and parents) and a new event file in it. Throws std::runtime_error naming
  // the path if it cannot.
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  void add_scalar(const std::string& tag, double value, int64_t step);
  // fsyncs the records written so far (each is already whole in the file); throws naming the file.
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& data);

  std::string path_;
  int fd_ = -1;  // O_APPEND: records go in whole (util::append_whole_record)
};

}  // namespace titan::trainer::observe
