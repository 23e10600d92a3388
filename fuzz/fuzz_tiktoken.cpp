// libFuzzer target: a tiktoken vocabulary file (data/tiktoken_file.h). Every input must
// either give ranks 0..n-1 of non-empty tokens that round-trip through base64, or throw
// std::runtime_error.
#include <cstdint>
#include <cstdlib>
#include <stdexcept>

#include "data/tiktoken_file.h"
#include "fuzz/fuzz_input_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace titan::data;
  const std::string& path = titan::fuzz::write_input("tiktoken", data, size);
  try {
    for (const std::string& token : read_tiktoken_file(path)) {
      std::string back;
      if (token.empty() || !base64_decode(base64_encode(token), &back) || back != token) std::abort();
    }
  } catch (const std::runtime_error&) {
  }
  return 0;
}
