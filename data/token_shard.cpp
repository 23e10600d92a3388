#include "data/token_shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "util/atomic_file.h"

namespace titan::data {

// The header and ids are stored in host order; the format says little-endian.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "token shards assume a little-endian host");

namespace {

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t bytes_per_token;
  uint64_t count;
  uint64_t vocab_size;
};
static_assert(sizeof(Header) == kTokenShardHeaderBytes, "TITANTOK header is 32 bytes");

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error("token shard " + path + ": " + what);
}

}  // namespace

void write_token_shard(const std::string& path, const std::vector<int32_t>& tokens,
                       int64_t vocab_size, int bytes_per_token) {
  if (bytes_per_token == 0) bytes_per_token = vocab_size <= 65536 ? 2 : 4;
  if (bytes_per_token != 2 && bytes_per_token != 4) {
    fail(path, "bytes per token must be 2 or 4, got " + std::to_string(bytes_per_token));
  }
  if (vocab_size <= 0 || (bytes_per_token == 2 && vocab_size > 65536)) {
    fail(path, "vocab_size " + std::to_string(vocab_size) + " does not fit " +
                   std::to_string(bytes_per_token) + "-byte ids");
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab_size) {
      fail(path, "token " + std::to_string(i) + " has id " + std::to_string(tokens[i]) +
                     ", outside [0, " + std::to_string(vocab_size) + ")");
    }
  }
  Header header{};
  std::memcpy(header.magic, kTokenShardMagic, sizeof(header.magic));
  header.version = kTokenShardVersion;
  header.bytes_per_token = static_cast<uint32_t>(bytes_per_token);
  header.count = tokens.size();
  header.vocab_size = static_cast<uint64_t>(vocab_size);

  // Whole or not at all (util/atomic_file.h): a full disk leaves neither a partial shard nor a
  // temporary file, and the error names the shard and the errno text.
  try {
    util::AtomicFile out(path);
    out.write(&header, sizeof(header));
    if (bytes_per_token == 4) {
      out.write(tokens.data(), tokens.size() * sizeof(int32_t));
    } else {
      std::vector<uint16_t> narrow(tokens.begin(), tokens.end());
      out.write(narrow.data(), narrow.size() * sizeof(uint16_t));
    }
    out.commit();
  } catch (const std::runtime_error& e) {
    fail(path, e.what());
  }
}

TokenShard::TokenShard(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    fail(path, std::string("cannot stat: ") + std::strerror(err));
  }
  const auto file_bytes = static_cast<uint64_t>(st.st_size);
  if (file_bytes < sizeof(Header)) {
    ::close(fd);
    fail(path, "file has " + std::to_string(file_bytes) +
                   " bytes, shorter than the 32-byte TITANTOK header (not a token shard?)");
  }
  void* map = ::mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  int err = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (map == MAP_FAILED) fail(path, std::string("mmap failed: ") + std::strerror(err));
  map_ = static_cast<const unsigned char*>(map);
  map_bytes_ = file_bytes;

  // From here on a failed check must unmap before it throws.
  try {
    Header header;
    std::memcpy(&header, map_, sizeof(header));
    if (std::memcmp(header.magic, kTokenShardMagic, sizeof(header.magic)) != 0) {
      fail(path, "bad magic (expected \"TITANTOK\"; write shards with titan-tokenize)");
    }
    if (header.version != kTokenShardVersion) {
      fail(path, "format version " + std::to_string(header.version) + ", this build reads " +
                     std::to_string(kTokenShardVersion));
    }
    if (header.bytes_per_token != 2 && header.bytes_per_token != 4) {
      fail(path, "bytes per token is " + std::to_string(header.bytes_per_token) +
                     ", expected 2 (uint16) or 4 (uint32)");
    }
    const uint64_t expected = sizeof(Header) + header.count * header.bytes_per_token;
    if (header.count > (uint64_t(1) << 60) || expected != file_bytes) {
      fail(path, "header says " + std::to_string(header.count) + " tokens x " +
                     std::to_string(header.bytes_per_token) + " bytes + 32 = " +
                     std::to_string(expected) + " bytes, but the file has " +
                     std::to_string(file_bytes) + " (truncated or corrupt)");
    }
    if (header.vocab_size == 0 || header.vocab_size > (uint64_t(1) << 32)) {
      fail(path, "vocab_size " + std::to_string(header.vocab_size) + " is not in 1..2^32");
    }
    count_ = static_cast<int64_t>(header.count);
    vocab_size_ = static_cast<int64_t>(header.vocab_size);
    bytes_per_token_ = static_cast<int>(header.bytes_per_token);
  } catch (...) {
    ::munmap(const_cast<unsigned char*>(map_), map_bytes_);
    throw;
  }
}

TokenShard::TokenShard(TokenShard&& other) noexcept
    : path_(std::move(other.path_)),
      map_(other.map_),
      map_bytes_(other.map_bytes_),
      count_(other.count_),
      vocab_size_(other.vocab_size_),
      bytes_per_token_(other.bytes_per_token_) {
  other.map_ = nullptr;
  other.map_bytes_ = 0;
}

TokenShard::~TokenShard() {
  if (map_ != nullptr) ::munmap(const_cast<unsigned char*>(map_), map_bytes_);
}

void TokenShard::read(int64_t offset, int64_t count, int64_t* out) const {
  if (offset < 0 || count < 0 || offset + count > count_) {
    fail(path_, "read of [" + std::to_string(offset) + ", " + std::to_string(offset + count) +
                    ") past its " + std::to_string(count_) + " tokens");
  }
  const unsigned char* base = map_ + kTokenShardHeaderBytes;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t index = offset + i;
    int64_t id;
    if (bytes_per_token_ == 2) {
      uint16_t v;
      std::memcpy(&v, base + index * 2, 2);  // memcpy: the ids need not be aligned
      id = v;
    } else {
      uint32_t v;
      std::memcpy(&v, base + index * 4, 4);
      id = v;
    }
    if (id >= vocab_size_) {
      fail(path_, "token " + std::to_string(index) + " has id " + std::to_string(id) +
                      " >= the shard's vocab_size " + std::to_string(vocab_size_) + " (corrupt)");
    }
    out[i] = id;
  }
}

}  // namespace titan::data
