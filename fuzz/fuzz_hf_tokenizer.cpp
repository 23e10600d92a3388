// libFuzzer target: a Hugging Face tokenizer.json (data/hf_tokenizer.h). Every input
// must either load a tokenizer that encodes and decodes a fixed text, or throw
// std::runtime_error / std::invalid_argument.
#include <cstdint>
#include <stdexcept>

#include "data/hf_tokenizer.h"
#include "fuzz/fuzz_input_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace titan::data;
  const std::string& path = titan::fuzz::write_input("hf_tokenizer", data, size);
  try {
    auto tokenizer = load_hf_tokenizer(path);
    const auto ids = tokenizer->encode("Hello, world! 123 ünï", false, false);
    tokenizer->decode(ids);
  } catch (const std::runtime_error&) {
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
