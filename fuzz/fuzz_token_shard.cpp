// libFuzzer target: a token shard (data/token_shard.h, "TITANTOK"). Every input must
// either open (then every id reads back below vocab_size, or the read throws naming the
// position) or throw std::runtime_error from the constructor.
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <vector>

#include "data/token_shard.h"
#include "fuzz/fuzz_input_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace titan::data;
  const std::string& path = titan::fuzz::write_input("token_shard", data, size);
  try {
    TokenShard shard(path);
    if (shard.size() < 0 || shard.size() > static_cast<int64_t>(size)) std::abort();
    std::vector<int64_t> ids(static_cast<size_t>(shard.size()));
    shard.read(0, shard.size(), ids.data());
    for (int64_t id : ids)
      if (id < 0 || id >= shard.vocab_size()) std::abort();
  } catch (const std::runtime_error&) {
  }
  return 0;
}
